# SPDX-License-Identifier: Apache-2.0
"""The native RunBatch writer against its spec, the twin `_twins.requests.write_run_batch_body`
(wire-protocol §3.10, §4.1-4.3): the same bytes for canonically encoded payloads, the same decoded
body (key order included) for any payload, and never a value spliced from a payload that no longer
describes the item."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar._native import decode_work_item as _native_decode
from sie_sidecar._native import encode_request, write_run_batch_body
from sie_sidecar._twins.requests import write_run_batch_body as write_run_batch_body_py
from sie_sidecar._twins.workitem import decode_work_item as decode_work_item_py
from sie_sidecar.ipc.requests import run_batch_body
from sie_sidecar.payloads.resolve import inline_payload, resolve_item
from sie_sidecar.payloads.store import PayloadStore
from sie_sidecar.wire.workitem import WorkItem

OPS = ("encode", "score", "extract")


def decode_native(data: bytes) -> WorkItem:
    item: WorkItem = _native_decode(data, cls=WorkItem)
    return item


def native(
    items: Sequence[WorkItem],
    op: str = "encode",
    *,
    fetch: Sequence[float] | None = None,
    tokens: Sequence[Mapping[str, Any] | None] | None = None,
    audio: Sequence[Mapping[str, Any] | None] | None = None,
    model: str = "m",
    lora: str = "",
    cost: int = 1,
    batch_id: int = 7,
) -> bytes:
    return write_run_batch_body(model, op, lora, cost, batch_id, items, fetch, tokens, audio)


def twin(
    items: Sequence[WorkItem],
    op: str = "encode",
    *,
    fetch: Sequence[float] | None = None,
    tokens: Sequence[Mapping[str, Any] | None] | None = None,
    audio: Sequence[Mapping[str, Any] | None] | None = None,
    model: str = "m",
    lora: str = "",
    cost: int = 1,
    batch_id: int = 7,
) -> bytes:
    return write_run_batch_body_py(model, op, lora, cost, batch_id, items, fetch, tokens, audio)


def ordered(value: Any) -> Any:
    """A decoded value with every map as its list of pairs, so equality also checks key order."""
    if isinstance(value, dict):
        return [(k, ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return value


def unpack(body: bytes) -> Any:
    return ordered(msgpack.unpackb(body, raw=False, strict_map_key=False))


BASE = {
    "work_item_id": "req-1.0",
    "request_id": "req-1",
    "item_index": 0,
    "total_items": 1,
    "operation": "encode",
    "model_id": "BAAI/bge-m3",
    "pool_name": "default",
    "machine_profile": "l4",
    "reply_subject": "_INBOX.gw.req-1",
}

# -- generated payloads ----------------------------------------------------------------------------

_ODD_TEXT = ["", "ü", "\x00", "\U0001d518\U0001d52b\U0001d526", "\u2028", "\ufeff", "x" * 40, "é" * 200]
_text = st.text(max_size=12) | st.sampled_from(_ODD_TEXT)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    _text,
    st.binary(max_size=8) | st.just(b"\xff" * 300),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=6)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**34), st.integers(0, 999_999_999)),
)
_value = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_text | st.integers(-3, 3), inner, max_size=4)
        | st.dictionaries(st.text(min_size=1, max_size=3), st.integers(-(2**63), 2**64 - 1), min_size=16, max_size=20)
    ),
    max_leaves=12,
)
#: `options` and `output_schema` are JSON-shaped (wire-protocol §0 rule 6): no bin, no ext inside.
_json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), _text),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_opt_text = st.none() | _text
_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "profile_id": _opt_text,
    "bundle_config_hash": _opt_text,
    "item": _value,
    "output_types": st.none() | st.lists(_text, max_size=3),
    "instruction": _opt_text,
    "is_query": st.none() | st.booleans(),
    "options": st.none() | st.dictionaries(_text, _json_value, max_size=4),
    "query_item": _value,
    "score_items": st.none() | st.lists(_value, max_size=4),
    "labels": st.none() | st.lists(_value, max_size=3),
    "output_schema": _json_value,
    "traceparent": _opt_text,
    "tracestate": _opt_text,
    "timestamp": st.none() | st.integers(0, 2**40) | st.floats(allow_nan=False, allow_infinity=False),
    "payload_ref": _opt_text,
    "future_key": _value,
}


@st.composite
def payload_maps(draw: st.DrawFn, op: str) -> dict[str, Any]:
    """One WorkItem map with random optional keys, in a random key order."""
    base = dict(BASE, operation=op)
    base["work_item_id"], base["request_id"] = draw(_text), draw(_text)
    base["item_index"], base["total_items"] = draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**32))
    present = draw(st.fixed_dictionaries({}, optional=_OPTIONAL))
    pairs = list({**base, **present}.items())
    return dict(draw(st.permutations(pairs)))


_tokens = st.none() | st.fixed_dictionaries(
    {
        "input_ids": st.lists(st.lists(st.integers(0, 250_000), max_size=8), min_size=1, max_size=1),
        "attention_mask": st.just([[1, 1]]),
        "token_type_ids": st.just([]),
        "tokenizer_id": _text,
        "max_seq_len": st.integers(1, 2**20),
    }
)
_audio = st.none() | st.fixed_dictionaries({"pcm_s16le": st.binary(max_size=64), "sample_rate": st.just(16_000)})


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    """A batch of one op: payload maps and the per-item extras the dispatcher passes."""
    op = draw(st.sampled_from(OPS))
    maps = draw(st.lists(payload_maps(op), min_size=0, max_size=5))
    n = len(maps)
    fetch = draw(st.none() | st.lists(st.floats(0, 1e6) | st.integers(0, 10**6), min_size=n, max_size=n))
    extras = _tokens if op == "encode" else _audio
    per_item = draw(st.none() | st.lists(extras, min_size=n, max_size=n))
    return {
        "op": op,
        "maps": maps,
        "fetch": fetch,
        "tokens": per_item if op == "encode" else draw(st.none() | st.lists(_tokens, min_size=n, max_size=n)),
        "audio": per_item if op == "extract" else None,
        "model": draw(_text),
        "lora": draw(_text),
        "cost": draw(st.integers(0, 2**40)),
        "batch_id": draw(st.integers(0, 2**63)),
    }


def _args(b: dict[str, Any]) -> dict[str, Any]:
    return {k: b[k] for k in ("op", "fetch", "tokens", "audio", "model", "lora", "cost", "batch_id")}


@settings(max_examples=120, deadline=None)
@given(b=batches())
def test_native_body_is_byte_identical_to_the_twin_for_canonical_payloads(b: dict[str, Any]) -> None:
    payloads = [msgpack.packb(m, use_bin_type=True) for m in b["maps"]]
    spliced = [decode_native(p) for p in payloads]
    assert all(i.raw is p for i, p in zip(spliced, payloads, strict=True))
    expected = twin(spliced, **_args(b))
    assert native(spliced, **_args(b)) == expected
    # Items without a payload (the twin decoder's, or edited ones) are written from their attributes.
    assert native([decode_work_item_py(p) for p in payloads], **_args(b)) == expected


@settings(max_examples=60, deadline=None)
@given(b=batches(), traced=st.booleans(), request_id=st.text(max_size=60))
def test_a_request_body_holds_the_body_and_its_first_frame_is_the_copied_frame(
    b: dict[str, Any], traced: bool, request_id: str
) -> None:
    """The body written with room (`room=True`, a `RequestBody`) is the bytes written without, and the request frame
    `encode_request` makes of it in place equals the frame of those bytes (the envelope written in
    front of the body, or a copy when the id does not fit the room)."""
    items = [decode_native(msgpack.packb(m, use_bin_type=True)) for m in b["maps"]]
    a = _args(b)
    args = (a["model"], a["op"], a["lora"], a["cost"], a["batch_id"], items, a["fetch"], a["tokens"], a["audio"])
    trace = ("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", None) if traced else None
    body = write_run_batch_body(*args, trace)
    request = write_run_batch_body(*args, trace, room=True)
    assert bytes(request) == bytes(memoryview(request)) == body and len(request) == len(body)
    frame = encode_request("RunBatch", request_id, request, True)
    assert bytes(frame) == encode_request("RunBatch", request_id, body, True)


_LIST_OK = ["item", "output_types", "query_item", "score_items", "labels", "output_schema", "future_key"]


def _loose(value: Any) -> bytes:
    """A valid but never-canonical msgpack encoding: the widest header of every kind."""
    if value is None or isinstance(value, bool | msgpack.ExtType | msgpack.Timestamp):
        return bytes(msgpack.packb(value))
    if isinstance(value, int):
        return (b"\xcf" + struct.pack(">Q", value)) if value >= 0 else (b"\xd3" + struct.pack(">q", value))
    if isinstance(value, float):
        single = struct.unpack(">f", struct.pack(">f", value))[0] if abs(value) < 3e38 else None
        return (b"\xca" + struct.pack(">f", value)) if single == value else (b"\xcb" + struct.pack(">d", value))
    if isinstance(value, str):
        data = value.encode()
        return b"\xdb" + struct.pack(">I", len(data)) + data
    if isinstance(value, bytes):
        return b"\xc6" + struct.pack(">I", len(value)) + value
    if isinstance(value, list):
        return b"\xdd" + struct.pack(">I", len(value)) + b"".join(_loose(v) for v in value)
    assert isinstance(value, dict)
    body = b"".join(_loose(k) + _loose(v) for k, v in value.items())
    return b"\xdf" + struct.pack(">I", len(value)) + body


@settings(max_examples=80, deadline=None)
@given(b=batches(), shadowed=st.lists(st.sampled_from(_LIST_OK), max_size=3))
def test_native_body_decodes_like_the_twin_for_any_encoding(b: dict[str, Any], shadowed: list[str]) -> None:
    """Wide headers, f32 floats, and keys that repeat (the last one wins, in the span table too)."""
    payloads = []
    for m in b["maps"]:
        body = _loose(m)
        n = struct.unpack(">I", body[1:5])[0] + len(shadowed)
        early = b"".join(_loose(k) + _loose([k, "shadowed"]) for k in shadowed)
        payloads.append(b"\xdf" + struct.pack(">I", n) + early + body[5:])
    items = [decode_native(p) for p in payloads]
    assert unpack(native(items, **_args(b))) == unpack(twin(items, **_args(b)))


@pytest.mark.parametrize("op", OPS)
def test_large_values_splice_intact(op: str) -> None:
    """map32 / array32 / str32 / bin32 sizes and unicode outside the BMP."""
    big = {f"k{i}": i for i in range(70_000)}
    payload = {
        **BASE,
        "operation": op,
        "item": {"text": "\U0001d518" * 20_000, "blob": b"\x00" * 70_000, "map": big},
        "options": big,
        "query_item": {"text": "q"},
        "score_items": [{"text": str(i)} for i in range(70_000)],
        "labels": ["a"] * 70_000,
    }
    item = decode_native(msgpack.packb(payload, use_bin_type=True))
    assert native([item], op) == twin([item], op)


def test_odd_python_values_are_written_by_msgpack_itself() -> None:
    """Subclasses, tuples, bytearray and ints past 64 bits in Python-side values: the same bytes as
    msgpack, or the same error."""

    class Text(str):
        pass

    tokens: dict[str, Any] = {
        "input_ids": ([1, 2], (3,)),
        "tag": Text("t"),
        "raw": bytearray(b"xy"),
        "ext": msgpack.ExtType(3, b"z"),
        "neg": -(2**63),
        "top": 2**64 - 1,
    }
    item = decode_native(msgpack.packb(BASE))
    assert native([item], tokens=[tokens]) == twin([item], tokens=[tokens])
    for bad in ({"n": 2**64}, {"n": -(2**63) - 1}, {"s": "\ud800"}, {"o": object()}):
        with pytest.raises(Exception) as expected:
            twin([item], tokens=[bad])
        with pytest.raises(type(expected.value)):
            native([item], tokens=[bad])


def test_per_item_lists_must_match_the_items() -> None:
    item = decode_native(msgpack.packb(BASE))
    with pytest.raises(ValueError):
        native([item], fetch=[1.0, 2.0])
    with pytest.raises(ValueError):
        native([item], tokens=[])
    with pytest.raises(KeyError):
        native([item], "generate")
    assert native([item], "score", tokens=[]) == twin([item], "score", tokens=[])  # score ignores them


def test_run_batch_body_numbers_batches() -> None:
    item = decode_native(msgpack.packb(BASE))
    first, second = (msgpack.unpackb(run_batch_body("m", "encode", [item], "", 1)) for _ in range(2))
    assert second["batch_id"] == first["batch_id"] + 1
    assert unpack(run_batch_body("m", "encode", [item], "", 1)) == unpack(twin([item], batch_id=first["batch_id"] + 2))


@pytest.mark.parametrize(("env", "native_writer"), [("1", False), ("", True)])
def test_the_environment_switch_selects_the_writer_and_the_decoder(env: str, native_writer: bool) -> None:
    code = (
        "import msgpack; from sie_sidecar.ipc import requests; from sie_sidecar.wire.workitem import decode_work_item;"
        "from sie_sidecar._twins.requests import write_run_batch_body as twin;"
        f"item = decode_work_item(msgpack.packb({BASE!r}));"
        "print(requests._write_run_batch_body is not twin, item.raw is not None)"
    )
    env_vars = {**os.environ, "SIE_SIDECAR_NO_EXTENSIONS": env}
    out = subprocess.run([sys.executable, "-c", code], env=env_vars, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(native_writer)] * 2


# -- byte-exact golden bodies (constructed from the v0.7.1 item builders) -------------------------

GOLDEN_ENCODE_PAYLOAD = {
    **BASE,
    "profile_id": "default",
    "item": {"text": "hello"},
    "output_types": ["dense"],
    "is_query": True,
    "options": {"lora": "a"},
    "timestamp": 1.5,
    "traceparent": "00-ab-cd-01",
}
GOLDEN_ENCODE = bytes.fromhex(
    "86a86d6f64656c5f6964ab424141492f6267652d6d33a862617463685f696403a86c6f72615f6b6579a161aa746f74616c5f636f"
    "737402a56974656d739189a26f70a6656e636f6465ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f69"
    "64a57265712d31aa6974656d5f696e64657800a6656e636f64658eac776f726b5f6974656d5f6964a77265712d312e30aa726571"
    "756573745f6964a57265712d31aa6974656d5f696e64657800ab746f74616c5f6974656d7301a974696d657374616d70cb3ff800"
    "0000000000a46974656d81a474657874a568656c6c6fac6f75747075745f747970657391a564656e7365ab696e73747275637469"
    "6f6ec0a869735f7175657279c3a76f7074696f6e7381a46c6f7261a161aa70726f66696c655f6964a764656661756c74b262756e"
    "646c655f636f6e6669675f68617368c0b07061796c6f61645f66657463685f6d73cb3fd0000000000000af70726570617265645f"
    "746f6b656e7385a9696e7075745f69647391926566ae617474656e74696f6e5f6d61736b91920101ae746f6b656e5f747970655f"
    "69647390ac746f6b656e697a65725f6964a27466ab6d61785f7365715f6c656ecd0200a573636f7265c0a765787472616374c0ab"
    "7472616365706172656e74ab30302d61622d63642d3031aa74726163657374617465c0d920616363657074735f62617463686564"
    "5f6631365f6d756c7469766563746f7273c3"
)
GOLDEN_SCORE_PAYLOAD = {
    **BASE,
    "operation": "score",
    "query_item": {"text": "q"},
    "score_items": [{"text": "a", "id": "c0"}, {"text": "b"}],
    "instruction": "rank",
    "bundle_config_hash": "h1",
    "timestamp": 2,
}
#: The v0.7.1 ScoreBatchItem (12 keys) with `bundle_config_hash` inserted after `profile_id` (13 keys),
#: as wire-protocol §4.3 says newer releases write it.
GOLDEN_SCORE = bytes.fromhex(
    "86a86d6f64656c5f6964ab424141492f6267652d6d33a862617463685f69640ca86c6f72615f6b6579a0aa746f74616c5f636f73"
    "7403a56974656d739189a26f70a573636f7265ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f6964a5"
    "7265712d31aa6974656d5f696e64657800a6656e636f6465c0a573636f72658dac776f726b5f6974656d5f6964a77265712d312e"
    "30aa726571756573745f6964a57265712d31aa6974656d5f696e64657800ab746f74616c5f6974656d7301a974696d657374616d"
    "70cb4000000000000000aa71756572795f6974656d81a474657874a171ab73636f72655f6974656d739282a474657874a161a269"
    "64a2633081a474657874a162ab696e737472756374696f6ea472616e6ba76f7074696f6e73c0aa70726f66696c655f6964c0b262"
    "756e646c655f636f6e6669675f68617368a26831b07061796c6f61645f66657463685f6d73cb0000000000000000af7072657061"
    "7265645f746f6b656e73c0a765787472616374c0ab7472616365706172656e74c0aa74726163657374617465c0d9206163636570"
    "74735f626174636865645f6631365f6d756c7469766563746f7273c3"
)
GOLDEN_TOKENS = {
    "input_ids": [[101, 102]],
    "attention_mask": [[1, 1]],
    "token_type_ids": [],
    "tokenizer_id": "tf",
    "max_seq_len": 512,
}


@pytest.mark.parametrize("decode", [decode_native, decode_work_item_py], ids=["spliced", "attrs"])
def test_golden_encode_batch(decode: Any) -> None:
    item = decode(msgpack.packb(GOLDEN_ENCODE_PAYLOAD))
    args: dict[str, Any] = {"model": "BAAI/bge-m3", "lora": "a", "cost": 2, "batch_id": 3, "fetch": [0.25]}
    assert twin([item], "encode", tokens=[GOLDEN_TOKENS], **args) == GOLDEN_ENCODE
    assert native([item], "encode", tokens=[GOLDEN_TOKENS], **args) == GOLDEN_ENCODE


@pytest.mark.parametrize("decode", [decode_native, decode_work_item_py], ids=["spliced", "attrs"])
def test_golden_score_batch(decode: Any) -> None:
    item = decode(msgpack.packb(GOLDEN_SCORE_PAYLOAD))
    args: dict[str, Any] = {"model": "BAAI/bge-m3", "lora": "", "cost": 3, "batch_id": 12}
    assert twin([item], "score", **args) == GOLDEN_SCORE
    assert native([item], "score", **args) == GOLDEN_SCORE


# -- never stale: fields changed after decoding are written from the attributes -------------------


async def test_a_resolved_offloaded_payload_is_sent_not_its_ref(tmp_path: Path) -> None:
    """`inline_payload` copies the item with `dataclasses.replace`, which must not carry `raw`: the
    payload that held the ref (and no item) would be spliced."""
    (tmp_path / "blob.bin").write_bytes(msgpack.packb({"text": "fetched"}))
    item = decode_native(msgpack.packb({**BASE, "payload_ref": "blob.bin", "item": None}))
    outcome = await resolve_item(PayloadStore.from_url(str(tmp_path)), item)
    assert outcome.ok, outcome
    assert outcome.item.raw is None and outcome.item.item == {"text": "fetched"}
    (sent,) = msgpack.unpackb(run_batch_body("m", "encode", [outcome.item], "", 1))["items"]
    assert sent["encode"]["item"] == {"text": "fetched"}


async def test_a_resolved_score_payload_is_sent_not_its_ref(tmp_path: Path) -> None:
    (tmp_path / "score.bin").write_bytes(msgpack.packb({"query": {"text": "fq"}, "items": [{"text": "fa"}]}))
    payload = {**BASE, "operation": "score", "query_payload_ref": "score.bin", "score_items": None}
    outcome = await resolve_item(PayloadStore.from_url(str(tmp_path)), decode_native(msgpack.packb(payload)))
    assert outcome.ok, outcome
    (sent,) = msgpack.unpackb(run_batch_body("m", "score", [outcome.item], "", 1))["items"]
    assert (sent["score"]["query_item"], sent["score"]["score_items"]) == ({"text": "fq"}, [{"text": "fa"}])


def test_inline_payload_drops_the_payload_of_the_ref() -> None:
    item = decode_native(msgpack.packb({**BASE, "payload_ref": "x", "item": None}))
    assert item.raw is not None and item.spans is not None
    copy = inline_payload(item, msgpack.packb("fetched"))
    assert (copy.raw, copy.spans, copy.item) == (None, None, "fetched")


def test_an_item_edited_in_place_is_written_from_its_attributes_once_raw_is_dropped() -> None:
    """The contract every in-place edit follows (the dispatcher's audio preparation does)."""
    item = decode_native(msgpack.packb({**BASE, "operation": "extract", "item": {"text": "t", "audio": {}}}))
    item.item = {"text": "t"}
    stale = msgpack.unpackb(native([item], "extract"))["items"][0]["extract"]["item"]
    assert stale == {"text": "t", "audio": {}}  # why the edit must drop raw
    item.raw = None
    assert msgpack.unpackb(native([item], "extract"))["items"][0]["extract"]["item"] == {"text": "t"}
