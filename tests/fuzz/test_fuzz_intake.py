# SPDX-License-Identifier: Apache-2.0
"""Fuzz the native intake of a pulled batch (`intake_batch`): WorkItem payloads mutated anywhere,
arbitrary bytes and arbitrary subjects in; never a crash, every message in exactly one of the
groups, the NAKs or the drops, and every verdict the per-message twin's."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar._twins.intake import intake_batch as intake_batch_py
from sie_sidecar.pipeline.intake import Intake

from ..unit.test_intake import Msg
from .strategies import mutated

pytestmark = [pytest.mark.fuzz, pytest.mark.skipif(not wire.USING_NATIVE, reason="the native intake")]

GOOD = msgpack.packb(
    {
        "work_item_id": "r.0",
        "request_id": "r",
        "item_index": 0,
        "total_items": 1,
        "operation": "encode",
        "model_id": "org/m",
        "pool_name": "default",
        "machine_profile": "cpu",
        "reply_subject": "_INBOX.gw.r",
        "item": {"text": "hi"},
        "output_types": ["dense"],
    }
)
SUBJECTS = st.one_of(
    st.just(wire.pool_work_subject("default", "cpu", "b", "org/m")),
    st.just(wire.worker_direct_subject("default", "cpu", "b", "org/m", "w")),
    st.text(max_size=40),
)


@given(batch=st.lists(st.tuples(SUBJECTS, st.one_of(mutated(GOOD), st.binary(max_size=64))), max_size=12))
def test_intake_batch_never_crashes_and_loses_nothing(batch: list[tuple[str, bytes]]) -> None:
    msgs = [Msg(s, d) for s, d in batch]
    groups, naks, drops = Intake().verdicts(msgs, None)
    twin = Intake()
    twin_groups, twin_naks, twin_drops = intake_batch_py(msgs, twin._subject_info, twin._decide, None, False)
    seen: list[Any] = [d.msg for ds in groups.values() for d in ds] + [d.msg for d in naks + drops]
    assert sorted(map(id, seen)) == sorted(map(id, msgs))
    assert {m: [d.msg for d in ds] for m, ds in groups.items()} == {
        m: [d.msg for d in ds] for m, ds in twin_groups.items()
    }
    assert [d.msg for d in naks] == [d.msg for d in twin_naks]
    assert [d.msg for d in drops] == [d.msg for d in twin_drops]
