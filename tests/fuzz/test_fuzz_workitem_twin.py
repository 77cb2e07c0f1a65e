# SPDX-License-Identifier: Apache-2.0
"""Fuzz the WorkItem twin (`decode_work_item_py`) against the native decoder on WorkItem-shaped maps
written entry by entry, so a key can repeat: known keys given again with any value (the wrong type
first, the right one last, and so on), ext values of every type code (-128..127, Timestamps of any
length) under unknown keys, under known ones and as keys, values nested around the native depth
limit. Both must give the same verdict (a WorkItem or a `WorkItemError`), and equal WorkItems."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar._native import decode_work_item
from sie_sidecar._twins.workitem import decode_work_item as decode_work_item_py
from sie_sidecar.errors import WorkItemError
from sie_sidecar.wire.workitem import MAX_DEPTH, REQUIRED, WorkItem

from .strategies import MINIMAL_WORK_ITEM

pytestmark = pytest.mark.fuzz

_BASE: dict[str, Any] = {**MINIMAL_WORK_ITEM, "item": {"text": "hi"}, "timestamp": 1.7e9}
_KNOWN = [*REQUIRED, "is_query", "timestamp", "options", "labels", "profile_id", "payload_ref", "item", "query_item"]
_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def _ext(code: int, data: bytes) -> bytes:
    """An ext value of any type code (msgpack-python's packer refuses the negative ones)."""
    head = bytes([_FIXEXT[len(data)]]) if len(data) in _FIXEXT else bytes([0xC7, len(data)])
    return head + (code & 0xFF).to_bytes(1, "big") + data


_timestamp_sized = st.sampled_from([4, 8, 12]).flatmap(lambda n: st.binary(min_size=n, max_size=n))
_exts = st.builds(_ext, st.integers(-128, 127), st.one_of(st.binary(max_size=17), _timestamp_sized))
_timestamps = _timestamp_sized.map(lambda d: _ext(-1, d))  # valid and invalid (nanoseconds) ones
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=6), st.binary(max_size=4)
)
_packed_scalars = _scalars.map(lambda v: msgpack.packb(v, use_bin_type=True))


@st.composite
def _nested(draw: st.DrawFn) -> bytes:
    """A scalar or an ext value inside arrays and maps, sometimes around `MAX_DEPTH` levels deep."""
    inner = draw(st.one_of(_packed_scalars, _exts, _timestamps, st.just(b"\x90"), st.just(b"\x80")))
    depth = draw(st.one_of(st.integers(0, 3), st.integers(MAX_DEPTH - 2, MAX_DEPTH + 2)))
    head, tail = draw(st.sampled_from([(b"\x91", b""), (b"\x81\xa1k", b""), (b"\x81", b"\x01")]))
    return head * depth + inner + tail * depth  # in arrays, as map values, or as map keys


_values = st.one_of(_packed_scalars, _exts, _timestamps, _nested())
_keys = st.one_of(
    st.sampled_from(_KNOWN).map(msgpack.packb),
    st.text(max_size=6).map(msgpack.packb),  # unknown keys (and now and then a known one)
    _exts,  # an ext as a key: any type code
    _packed_scalars,  # a key that is not a str
)


@st.composite
def work_item_maps(draw: st.DrawFn) -> bytes:
    """A WorkItem map: the base entries (some dropped) and extra ones, repeated keys included."""
    entries = [(msgpack.packb(k), msgpack.packb(v)) for k, v in _BASE.items() if draw(st.integers(0, 19))]
    extra = draw(st.lists(st.tuples(_keys, _values), max_size=6))
    # A known key given twice or more: once with the base's value, once with any other.
    again = draw(st.lists(st.sampled_from(_KNOWN), max_size=3))
    extra += [(msgpack.packb(k), draw(_values)) for k in again]
    entries = draw(st.permutations(entries + extra))
    return b"\xde" + len(entries).to_bytes(2, "big") + b"".join(k + v for k, v in entries)


def _outcome(decode: Any, data: bytes) -> WorkItem | str:
    try:
        item = decode(data)
    except WorkItemError:
        return "WorkItemError"
    assert isinstance(item, WorkItem)
    return item


@given(data=work_item_maps())
def test_twin_and_native_agree_on_repeated_keys_and_ext_values(data: bytes) -> None:
    native = _outcome(lambda d: decode_work_item(d, WorkItem), data)
    twin = _outcome(decode_work_item_py, data)
    assert native == twin or (  # a NaN timestamp is unequal to itself
        isinstance(native, WorkItem) and isinstance(twin, WorkItem) and repr(native) == repr(twin)
    )
