# SPDX-License-Identifier: Apache-2.0
"""Fuzz the subject parsers and builders: any text in, only a WireError subclass (or nothing) out."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.errors import WireError

pytestmark = pytest.mark.fuzz

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

# Any code point, lone surrogates included, plus strings built from the characters the parsers care about.
any_text = st.text(st.characters(exclude_categories=()), max_size=64)
subject_like = st.lists(
    st.sampled_from(["sie", "work", "work_cancel", "cancel", "batch_cancel", "_INBOX", ".", "*", ">", "", " ", "__"]),
    max_size=16,
).map("".join)
texts = st.one_of(any_text, subject_like)


def _call(func: Callable[..., Any], *args: str) -> Any:
    try:
        return func(*args)
    except WireError:
        return None


@fixture_ok
@given(args=st.tuples(texts, texts, texts, texts, texts))
def test_fuzz_every_subject_function(impl: ModuleType, args: tuple[str, str, str, str, str]) -> None:
    a, b, c, d, e = args
    assert isinstance(_call(impl.normalize_token, a), str)
    assert isinstance(_call(impl.denormalize_token, a), str)
    lane = _call(impl.validate_lane_token, a)
    assert lane is None or (isinstance(lane, str) and lane and lane == lane.strip())
    model = _call(impl.model_from_subject, a)
    assert model is None or isinstance(model, str)
    assert isinstance(_call(impl.is_worker_direct_subject, a), bool)
    parsed = _call(impl.parse_work_subject, a)
    assert parsed is None or parsed.model == model
    assert isinstance(_call(impl.is_safe_reply_subject, a), bool)
    for parser in (impl.parse_work_cancel, impl.parse_generate_cancel):
        result = _call(parser, a)
        assert result is None or (isinstance(result, tuple) and all(result))
    request_id = _call(impl.parse_batch_cancel, a, b)
    assert request_id is None or (isinstance(request_id, str) and request_id)
    assert isinstance(_call(impl.filters_overlap, a, b), bool)
    _call(impl.pool_work_subject, a, b, c, d)
    _call(impl.worker_direct_subject, a, b, c, d, e)
    _call(impl.pool_stream_name, a)
    _call(impl.pool_stream_subjects, a)
    _call(impl.pool_durable_name, a, b, c)
    _call(impl.pool_durable_filter, a, b, c)
    _call(impl.worker_stream_name, a)
    _call(impl.worker_consumer_name, a)
    _call(impl.worker_direct_filter, a, b, c, d)
    _call(impl.health_subject, a)


@fixture_ok
@given(ops=st.lists(st.tuples(st.booleans(), any_text, any_text), max_size=50))
def test_fuzz_tombstones_accept_any_ids(impl: ModuleType, ops: list[tuple[bool, str, str]]) -> None:
    tombs = impl.TombstoneSet(capacity=8)
    batch = impl.BatchTombstones()
    for record, router_id, request_id in ops:
        if record:
            tombs.record(router_id, request_id)
            batch.record(request_id)
            assert tombs.is_cancelled(router_id, request_id)
            assert batch.is_cancelled(request_id)
        else:
            tombs.is_cancelled(router_id, request_id)
            batch.is_cancelled(request_id)
        assert len(tombs) <= 8
