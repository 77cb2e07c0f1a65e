# SPDX-License-Identifier: Apache-2.0
"""WorkItem decoding with the v0.7.1 sidecar's rules (wire-protocol §7.2, TV-W1)."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar._twins.workitem import decode_work_item as decode_work_item_py
from sie_sidecar.wire.workitem import REQUIRED, WorkItem, WorkItemError

try:
    from sie_sidecar._native import decode_work_item as _native_decode

    def decode_native(data: bytes) -> WorkItem:
        return _native_decode(data, cls=WorkItem)  # type: ignore[no-any-return]

except ImportError:  # pragma: no cover - the native core is always built for the test suite
    decode_native = decode_work_item_py

DECODERS = {"native": decode_native, "py": decode_work_item_py}


@pytest.fixture(params=sorted(DECODERS))
def decode_work_item(request: pytest.FixtureRequest) -> Any:
    """Every test runs against the native one-pass decoder and the Python twin."""
    return DECODERS[request.param]


TV_W1 = bytes.fromhex(
    "89ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f6964a57265712d31aa6974656d5f696e64657800"
    "ab746f74616c5f6974656d7301a96f7065726174696f6ea6656e636f6465a86d6f64656c5f6964ab424141492f6267652d6d33"
    "a9706f6f6c5f6e616d65a764656661756c74af6d616368696e655f70726f66696c65a26c34ad7265706c795f7375626a656374"
    "af5f494e424f582e67772e7265712d31"
)


def test_tv_w1_minimal_work_item_decodes_with_defaults(decode_work_item: Any) -> None:
    item = decode_work_item(TV_W1)
    assert (item.work_item_id, item.request_id, item.item_index, item.total_items) == ("req-1.0", "req-1", 0, 1)
    assert (item.operation, item.model_id, item.pool_name, item.machine_profile) == (
        "encode",
        "BAAI/bge-m3",
        "default",
        "l4",
    )
    assert item.reply_subject == "_INBOX.gw.req-1"
    assert (item.profile_id, item.engine, item.admission_pool, item.bundle_config_hash, item.router_id) == ("",) * 5
    assert (item.is_query, item.accepts_result_chunks, item.timestamp) == (False, False, 0.0)
    assert (item.item, item.payload_ref, item.options, item.traceparent) == (None, None, None, None)


@pytest.mark.parametrize("missing", REQUIRED)
def test_tv_w1_each_required_key_is_required(decode_work_item: Any, missing: str) -> None:
    raw = msgpack.unpackb(TV_W1)
    del raw[missing]
    with pytest.raises(WorkItemError, match=missing):
        decode_work_item(msgpack.packb(raw))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("item_index", -1),
        ("item_index", "0"),
        ("total_items", True),
        ("operation", 7),
        ("reply_subject", None),
        ("is_query", "yes"),
        ("accepts_result_chunks", 1),
        ("timestamp", "now"),
        ("options", [1]),
        ("output_types", "dense"),
        ("bundle_config_hash", 5),
        ("payload_ref", 3),
    ],
)
def test_wrong_field_types_are_typed_errors(decode_work_item: Any, key: str, value: Any) -> None:
    raw = msgpack.unpackb(TV_W1)
    raw[key] = value
    with pytest.raises(WorkItemError):
        decode_work_item(msgpack.packb(raw))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x91\x01", msgpack.packb([1, 2]), b"\x89"])
def test_not_a_map_or_not_msgpack(decode_work_item: Any, data: bytes) -> None:
    with pytest.raises(WorkItemError):
        decode_work_item(data)


def test_unknown_keys_are_ignored_and_nil_defaults_apply(decode_work_item: Any) -> None:
    raw = msgpack.unpackb(TV_W1)
    raw.update({"future_field": {"x": 1}, "profile_id": None, "timestamp": 12, "accepts_result_chunks": True})
    item = decode_work_item(msgpack.packb(raw))
    assert (item.profile_id, item.timestamp, item.accepts_result_chunks) == ("", 12.0, True)


@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_anything_but_work_item_error(data: bytes) -> None:
    for decode in DECODERS.values():
        with contextlib.suppress(WorkItemError):
            decode(data)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=4),
)
_VALUES = st.one_of(
    _SCALARS, st.lists(_SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), _SCALARS, max_size=3)
)
_KEYS = st.sampled_from([*REQUIRED, "options", "timestamp", "is_query", "labels", "router_id", "item", "unknown"])


@given(overrides=st.dictionaries(_KEYS, _VALUES, max_size=4), drop=st.lists(st.sampled_from(REQUIRED), max_size=2))
def test_native_and_python_decoders_agree(overrides: dict[str, Any], drop: list[str]) -> None:
    raw = msgpack.unpackb(TV_W1)
    raw.update(overrides)
    for key in drop:
        raw.pop(key, None)
    data = msgpack.packb(raw, use_bin_type=True)
    outcomes: list[tuple[str, WorkItem | None]] = []
    for decode in DECODERS.values():
        try:
            outcomes.append(("ok", decode(data)))
        except WorkItemError:
            outcomes.append(("error", None))
    assert outcomes[0] == outcomes[1]


class _Plain:
    """No __slots__ at all."""


@pytest.mark.parametrize("cls", [_Plain, WorkItem])
def test_the_native_decoder_fills_any_class_like_setattr(cls: type) -> None:
    """The slot fast path is only for the class whose layout it read (WorkItem); another class gets
    the same values through setattr, and repeated values are equal but may be shared objects."""
    from sie_sidecar._native import decode_work_item as native

    first = native(TV_W1, cls=cls)
    second = native(TV_W1, cls=cls)
    expected = decode_work_item_py(TV_W1)
    for name in WorkItem.__slots__:
        if name not in ("raw", "spans"):  # the twin keeps no payload; the native decoder does
            assert getattr(first, name) == getattr(expected, name) == getattr(second, name)
    assert first.raw is TV_W1 and first.spans == second.spans and len(first.spans) == 80
    assert type(first) is cls


def test_a_key_given_twice_keeps_the_last_value_and_slots_hold_one_reference_each() -> None:
    import sys

    raw = msgpack.unpackb(TV_W1)
    head = msgpack.packb({"model_id": "first"})[1:]  # a map entry without its map header
    body = msgpack.packb(raw)[1:]
    data = bytes([0x80 | (len(raw) + 1)]) + head + body
    assert decode_native(data).model_id == raw["model_id"]
    items = [decode_native(TV_W1) for _ in range(100)]
    shared = items[0].model_id  # a repeating field: one str object for all of them
    assert all(item.model_id is shared for item in items)
    held = sys.getrefcount(shared)
    del items[1:]
    assert sys.getrefcount(shared) == held - 99  # each slot owned exactly one reference


def _with_entries(*entries: bytes) -> bytes:
    """TV_W1 with extra map entries (each a key and a value, already encoded) before its own."""
    raw = msgpack.unpackb(TV_W1)
    return bytes([0x80 | (len(raw) + len(entries))]) + b"".join(entries) + bytes(msgpack.packb(raw)[1:])


@pytest.mark.parametrize(
    "entry",
    [
        msgpack.packb("reply_subject") + msgpack.packb(5),  # TV_W1's str comes after
        msgpack.packb("item_index") + msgpack.packb(-1),
        msgpack.packb("is_query") + msgpack.packb("yes") + msgpack.packb("is_query") + msgpack.packb(True),
        msgpack.packb("work_item_id") + b"\xd4\xfe\x00",  # an ext value where a str is read
    ],
)
def test_every_occurrence_of_a_repeated_key_is_checked(decode_work_item: Any, entry: bytes) -> None:
    with pytest.raises(WorkItemError, match="must be"):
        decode_work_item(_with_entries(entry))


def test_a_repeated_key_with_good_values_keeps_the_last(decode_work_item: Any) -> None:
    item = decode_work_item(_with_entries(msgpack.packb("model_id") + msgpack.packb("first")))
    assert item.model_id == "BAAI/bge-m3"


@pytest.mark.parametrize(
    ("key", "decodes"),
    [
        (b"\xd4\xfe\x00", False),  # ext type -2: reserved, no ExtType for it
        (b"\xc7\x03\xff\x00\x00\x00", False),  # ext -1 (a Timestamp) of a length no Timestamp has
        (b"\xd4\x05\x00", True),
    ],
)
def test_an_ext_key_is_skipped_undecoded_but_an_ext_value_is_decoded(
    decode_work_item: Any, key: bytes, decodes: bool
) -> None:
    assert decode_work_item(_with_entries(key + msgpack.packb(1))).work_item_id == "req-1.0"
    unknown_value = msgpack.packb("future_field") + key
    if decodes:
        assert decode_work_item(_with_entries(unknown_value)).work_item_id == "req-1.0"
    else:
        with pytest.raises(WorkItemError, match="not msgpack"):
            decode_work_item(_with_entries(unknown_value))


@pytest.mark.parametrize("where", ["item", "future_field"])
def test_values_nest_at_most_128_deep(decode_work_item: Any, where: str) -> None:
    key = msgpack.packb(where)
    deepest: Any = 0
    for _ in range(128):
        deepest = [deepest]
    assert decode_work_item(_with_entries(key + b"\x91" * 128 + b"\x00")).item == (deepest if where == "item" else None)
    assert decode_work_item(_with_entries(key + b"\x91" * 128 + b"\x80")).work_item_id == "req-1.0"  # empty map
    with pytest.raises(WorkItemError, match="too deep"):
        decode_work_item(_with_entries(key + b"\x91" * 129 + b"\x00"))
