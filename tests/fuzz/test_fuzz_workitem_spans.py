# SPDX-License-Identifier: Apache-2.0
"""Fuzz the native WorkItem decoder's span recording: any bytes, and valid WorkItems mutated
anywhere, in; never a crash, every span inside the payload, each span holding exactly the value
decoded into its field, and the same table as the twin (`work_item_spans_py`)."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar._native import decode_work_item
from sie_sidecar._twins.workitem import work_item_spans as work_item_spans_py
from sie_sidecar.errors import WorkItemError
from sie_sidecar.wire.workitem import SPLICED_FIELDS, WorkItem

from .strategies import MINIMAL_WORK_ITEM, mutated

pytestmark = pytest.mark.fuzz

_BASE = MINIMAL_WORK_ITEM
_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=6), st.binary(max_size=6)
)
_value = st.recursive(
    _leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=6
)
_opt_text = st.none() | st.text(max_size=8)
_opt_list = st.none() | st.lists(_value, max_size=3)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "item": _value,
    "output_types": _opt_list,
    "instruction": _opt_text,
    "options": st.none() | st.dictionaries(st.text(max_size=3), _value, max_size=3),
    "query_item": _value,
    "score_items": _opt_list,
    "labels": _opt_list,
    "output_schema": _value,
    "traceparent": _opt_text,
    "tracestate": _opt_text,
    "is_query": st.none() | st.booleans(),
    "timestamp": st.none() | st.floats(),
    "profile_id": _opt_text,
    "unknown": _value,
}


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    """A valid WorkItem, some optional keys present, in a random key order."""
    extra = draw(st.fixed_dictionaries({}, optional=_FIELDS))
    pairs = draw(st.permutations(list({**_BASE, **extra}.items())))
    return bytes(msgpack.packb(dict(pairs), use_bin_type=True))


_payload = _payloads()


def _spans(item: WorkItem) -> list[tuple[int, int]]:
    assert item.spans is not None
    values = struct.unpack(f"<{2 * len(SPLICED_FIELDS)}I", item.spans)
    return list(zip(values[::2], values[1::2], strict=True))


def _check(data: bytes | bytearray | memoryview) -> None:
    try:
        item = decode_work_item(data, cls=WorkItem)
    except WorkItemError:
        return
    raw = bytes(data)
    assert item.raw == raw
    if isinstance(data, bytes):
        assert item.raw is data
    assert item.spans == work_item_spans_py(raw)
    for name, (off, length) in zip(SPLICED_FIELDS, _spans(item), strict=True):
        assert off + length <= len(raw)
        if length == 0:
            assert off == 0
            continue
        value: Any = msgpack.unpackb(raw[off : off + length], raw=False, strict_map_key=False)
        # Compared re-encoded, so a NaN among the mutated bytes compares equal to itself.
        assert msgpack.packb(value) == msgpack.packb(getattr(item, name))


@given(data=st.binary(max_size=512))
def test_fuzz_spans_on_arbitrary_bytes(data: bytes) -> None:
    _check(data)


@given(data=_payload.flatmap(mutated))
def test_fuzz_spans_on_mutated_work_items(data: bytes) -> None:
    _check(data)


@given(data=_payload, kind=st.sampled_from([bytearray, memoryview]))
def test_fuzz_spans_of_a_buffer_point_into_a_bytes_copy(data: bytes, kind: type) -> None:
    _check(kind(data))
