# SPDX-License-Identifier: Apache-2.0
"""Local-ingest wire (sidecar-behaviour §11, test vectors TV-L1..TV-L4): framing, envelopes, the
payload digest, the body decoder and the item rules, byte-exact where a vector pins the bytes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar.errors import InvalidTransportBinding, LocalFrameError
from sie_sidecar.local import frames, work_items
from sie_sidecar.local.client import DEFAULT_DISPATCH_CONTEXT, request_body
from sie_sidecar.local.digest import payload_digest
from sie_sidecar.local.request import Body, check_items

TV_L3_FRAME = (
    "3601000083a2696401a26f70b77075626c6973685f67656e65726174655f73747265616da4626f64798ca46c616e65bc64656661"
    "756c747c613130302d383067627c746573742f6d6f64656ca8656e64706f696e74a867656e6572617465a56d6f64656caa746573"
    "742f6d6f64656ca6656e67696e65a673676c616e67ae61646d697373696f6e5f706f6f6ca764656661756c74b262756e646c655f"
    "636f6e6669675f68617368a468617368aa726571756573745f6964a57265712d31a6706172616d73c406706172616d73a5697465"
    "6d73c4056974656d73b064697370617463685f636f6e74657874c41181a6736f75726365a8696e7465726e616c"
    "ae7061796c6f61645f646967657374c4209809ba4272139344cdbec6c68f6b0db6c8f65d6de1f5f9b79db0435efe41ed41aa74696d"
    "656f75745f6d7300"
)


def test_tv_l1_ping_request() -> None:
    frame = frames.encode_request(1, "ping", {})
    assert frame.hex() == "1300000083a2696401a26f70a470696e67a4626f647980"
    request = frames.decode_request(frame[4:])
    assert (request.id, request.op, request.body) == (1, "ping", {})
    assert Body.decode(request.body) == Body()  # every field defaulted


@pytest.mark.parametrize(
    ("ok", "error", "body", "hex_frame"),
    [
        (True, None, {}, "1600000084a2696401a26f6bc3a56572726f72c0a4626f647980"),
        (
            False,
            'ValueError: unknown op: "bogus"',
            {},
            "3500000084a2696401a26f6bc2a56572726f72bf56616c75654572726f723a20756e6b6e6f776e206f703a2022626f67757322a4626f647980",
        ),
        (
            True,
            None,
            {"chunk": b"a", "seq": 0},
            "2400000084a2696401a26f6bc3a56572726f72c0a4626f647982a56368756e6bc40161a373657100",
        ),
        (
            True,
            None,
            {"final": True, "outcome": {"status": "complete", "chunks": 2}},
            "3e00000084a2696401a26f6bc3a56572726f72c0a4626f647982a566696e616cc3a76f7574636f6d6582a6737461747573a8636f6d706c657465a66368756e6b7302",
        ),
    ],
)
def test_tv_l2_responses(ok: bool, error: str | None, body: dict[str, Any], hex_frame: str) -> None:
    frame = frames.encode_response(1, ok, error, body)
    assert frame.hex() == hex_frame
    decoded = frames.decode_response(frame[4:])
    assert (decoded.id, decoded.ok, decoded.error, decoded.body) == (1, ok, error, body)


def test_tv_l3_self_bound_generation_request() -> None:
    assert DEFAULT_DISPATCH_CONTEXT.hex() == "81a6736f75726365a8696e7465726e616c"
    body = request_body(
        lane="default|a100-80gb|test/model",
        endpoint="generate",
        model="test/model",
        engine="sglang",
        admission_pool="default",
        bundle_config_hash="hash",
        request_id="req-1",
        items=b"items",
        params=b"params",
        timeout_ms=0,
    )
    assert body["payload_digest"].hex() == "9809ba4272139344cdbec6c68f6b0db6c8f65d6de1f5f9b79db0435efe41ed41"
    frame = frames.encode_request(1, "publish_generate_stream", body)
    assert len(frame) - 4 == 310
    assert frame.hex() == TV_L3_FRAME
    decoded = Body.decode(frames.decode_request(frame[4:]).body)
    decoded.check_binding()  # the sidecar's side of the same rule


def test_tv_l3_second_digest() -> None:
    digest = payload_digest(
        dispatch_context=b"loopback-test",
        lane="default|l4|default",
        endpoint="encode",
        model="BAAI/bge-m3",
        engine="",
        admission_pool="default",
        bundle_config_hash="",
        request_id="li-1",
        params=bytes.fromhex("80"),
        items=bytes.fromhex("90"),
        timeout_ms=1000,
    )
    assert digest.hex() == "93930a4c7cb1eeae788d4ab729a819d08e2dfe4af5aac2cf32a80e40314888bf"


def test_a_caller_supplied_context_and_digest_are_forwarded_unchanged() -> None:
    body = request_body(
        lane="l", endpoint="encode", model="m", request_id="r", items=b"\x90", dispatch_context=b"ctx", digest=b"d" * 32
    )
    assert body["dispatch_context"] == b"ctx" and body["payload_digest"] == b"d" * 32
    with pytest.raises(ValueError, match="32 bytes"):
        request_body(lane="l", endpoint="encode", model="m", request_id="r", items=b"\x90", digest=b"short")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"dispatch_context": b""}, "dispatch_context is empty"),
        ({"payload_digest": b"x" * 31}, "32 bytes"),
        ({"payload_digest": b"x" * 32}, "does not match"),
        ({"lane": "other|x|y"}, "does not match"),  # a field changed after binding
        ({"timeout_ms": 5}, "does not match"),
    ],
)
def test_the_binding_is_refused_when_it_does_not_bind_the_body(change: dict[str, Any], match: str) -> None:
    raw = request_body(lane="l|p|b", endpoint="encode", model="m", request_id="r", items=b"\x90")
    raw.update(change)
    with pytest.raises(InvalidTransportBinding, match=match):
        Body.decode(raw).check_binding()


async def _read(data: bytes) -> bytes | None:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    payload = await frames.read_frame(reader)
    return None if payload is None else frames.decode_response(payload).body  # type: ignore[return-value]


@pytest.mark.parametrize(("data", "match"), [("0100", "header is truncated"), ("01000000c1", "invalid MessagePack")])
async def test_tv_l4_client_framing_errors(data: str, match: str) -> None:
    with pytest.raises(LocalFrameError, match=match):
        await _read(bytes.fromhex(data))


async def test_a_clean_end_between_frames_is_not_an_error() -> None:
    assert await _read(b"") is None


def test_a_frame_over_64_mib_is_refused_from_its_header() -> None:
    with pytest.raises(LocalFrameError, match="over the limit"):
        frames.declared_length((frames.MAX_FRAME + 1).to_bytes(4, "little"))
    assert frames.declared_length(frames.MAX_FRAME.to_bytes(4, "little")) == frames.MAX_FRAME


@pytest.mark.parametrize(
    ("envelope", "match"),
    [
        ([1, 2], "not a msgpack map"),
        ({"id": -1, "op": "ping", "body": {}}, "u64"),
        ({"id": True, "op": "ping", "body": {}}, "u64"),
        ({"id": 1, "op": 3, "body": {}}, "op must be a string"),
        ({"id": 1, "op": "ping", "body": [1]}, "body must be a map"),
        ({"op": "ping"}, "u64"),
    ],
)
def test_bad_envelopes_are_typed_errors(envelope: Any, match: str) -> None:
    with pytest.raises(LocalFrameError, match=match):
        frames.decode_request(msgpack.packb(envelope))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_request_or_a_frame_error(data: bytes) -> None:
    try:
        request = frames.decode_request(data)
    except LocalFrameError:
        return
    assert isinstance(request.id, int) and isinstance(request.op, str) and isinstance(request.body, dict)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.text(max_size=20),
    st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1), max_size=4),
)
def test_requests_round_trip(op_id: int, op: str, body: dict[str, Any]) -> None:
    request = frames.decode_request(frames.encode_request(op_id, op, body)[4:])
    assert (request.id, request.op, request.body) == (op_id, op, body)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["lane", "model", "items", "timeout_ms", "x"]),
        st.one_of(st.text(), st.binary(), st.integers(), st.none()),
    )
)
def test_the_body_decoder_defaults_or_refuses_but_never_crashes(raw: dict[str, Any]) -> None:
    with contextlib.suppress(ValueError):
        Body.decode(raw)


# -- item rules: the native checker and its twin, held to each other --------------------------------

from sie_sidecar._native import check_local_items as native_check  # noqa: E402
from sie_sidecar._twins.local_items import check_local_items as twin_check  # noqa: E402

CHECKERS = {"native": native_check, "twin": twin_check}


def _body(items: list[dict[str, Any]] | bytes, **fields: Any) -> Body:
    packed = items if isinstance(items, bytes) else msgpack.packb(items, use_bin_type=True)
    base: dict[str, Any] = {"lane": "default|cpu|default", "endpoint": "encode", "model": "m", "request_id": "r"}
    base.update(fields)
    return Body(items=packed, **base)


def _check(name: str, body: Body, prefix: str = "_INBOX.local.1.", numbered: bool = True) -> Any:
    """`check_items` through one implementation, as its three columns."""
    slots = check_items(body, prefix, numbered=numbered, checker=CHECKERS[name])
    return slots.datas, slots.indexes, slots.admitted


def _items(n: int = 2, **extra: Any) -> list[dict[str, Any]]:
    return work_items("r", "encode", "m", [{"item": {"text": str(i)}, **extra} for i in range(n)], timestamp=1.0)


def test_good_items_pass_in_slot_order_with_their_reply_subject_bound() -> None:
    items = _items(3)
    slots = check_items(_body(items), "_INBOX.local.5.")
    assert slots.indexes == [0, 1, 2] and all(slots.admitted)
    for n, data in enumerate(slots.datas):
        expected = dict(items[n], reply_subject=f"_INBOX.local.5.{n}")
        decoded = msgpack.unpackb(data)
        assert decoded == expected and list(decoded) == list(expected)  # key order kept
    (gen,) = check_items(_body(_items(1)), "_LOCAL.r", numbered=False).datas
    assert msgpack.unpackb(gen)["reply_subject"] == "_LOCAL.r"


@pytest.mark.parametrize("checker", sorted(CHECKERS))
def test_an_item_without_a_reply_subject_gets_one_appended(checker: str) -> None:
    items = _items(1)
    del items[0]["reply_subject"]
    datas, _, _ = _check(checker, _body(items))
    decoded = msgpack.unpackb(datas[0])
    assert list(decoded)[-1] == "reply_subject" and decoded["reply_subject"] == "_INBOX.local.1.0"


def _mutate(slot: int, key: str, value: Any) -> list[dict[str, Any]]:
    items = _items(2)
    if value is _DELETE:
        del items[slot][key]
    else:
        items[slot][key] = value
    return items


_DELETE = object()
_BIG_IMAGE = b"\0" * (16 * 1024 * 1024 + 1)
_BIG_AUDIO = b"\0" * (24 * 1024 * 1024 + 1)


@pytest.mark.parametrize("checker", sorted(CHECKERS))
@pytest.mark.parametrize(
    ("items", "fields", "match"),
    [
        (b"\xc1", {}, "items must be a msgpack array"),
        (msgpack.packb([1])[:1] + b"\xc1", {}, "items are not msgpack"),
        (msgpack.packb({"a": 1}), {}, "items must be a msgpack array"),
        (msgpack.packb(_items(2)) + b"\x01", {}, "items have trailing bytes"),
        (msgpack.packb([[1, 2]]), {}, "item 0: not a map (got array)"),
        ([], {}, "items is empty"),
        (None, {"request_id": ""}, "request_id is empty"),
        (None, {"request_id": "x" * 129}, "request_id is over 128 bytes"),
        (None, {"request_id": "a b"}, "request_id contains whitespace"),
        (_mutate(1, "request_id", "other"), {}, "item 1: request_id differs"),
        (_mutate(1, "request_id", 5), {}, "item 1: request_id must be a str, got int"),
        (_mutate(0, "total_items", 3), {}, "item 0: total_items must be 2"),
        (_mutate(0, "total_items", -1), {}, "item 0: total_items must be an unsigned int, got int"),
        (_mutate(1, "item_index", 2), {}, "item 1: item_index must be below 2"),
        (_mutate(1, "item_index", True), {}, "item 1: item_index must be an unsigned int, got bool"),
        (_mutate(1, "item_index", 0), {}, "item 1: item_index 0 is repeated"),
        (_mutate(1, "work_item_id", "r.7"), {}, "item 1: work_item_id must be r.1"),
        (_mutate(0, "operation", "score"), {}, "item 0: operation differs from the endpoint"),
        (_mutate(0, "operation", "load"), {}, "item 0: operation load is not accepted"),
        (_mutate(0, "model_id", "n"), {}, "item 0: model_id differs"),
        (_mutate(0, "engine", "sglang"), {}, "item 0: engine differs"),
        (_mutate(0, "bundle_config_hash", "h"), {}, "item 0: bundle_config_hash differs"),
        (_mutate(0, "payload_ref", "blob.msgpack"), {}, "item 0: payload references"),
        (_mutate(0, "query_payload_ref", "q.msgpack"), {}, "item 0: payload references"),
        (_mutate(0, "fallback_reason", "x"), {}, "item 0: fallback_reason is not accepted on encode"),
        (_mutate(0, "numerical_admission_sha256", "x"), {}, "item 0: numerical_admission_sha256 is not accepted"),
        (_mutate(0, "pool_name", _DELETE), {}, "item 0: missing required field pool_name"),
        (_mutate(0, "machine_profile", _DELETE), {}, "item 0: missing required field machine_profile"),
        (_mutate(0, "item", {"image": _BIG_IMAGE}), {}, "item 0 item: binary of 16777217 bytes is over the limit"),
        (_mutate(0, "item", {"images": [{"data": _BIG_IMAGE}]}), {}, "item 0 item: binary of 16777217 bytes"),
        (_mutate(0, "query_item", {"document": _BIG_IMAGE}), {}, "item 0 query_item: binary of"),
        (_mutate(0, "item", {"audio": {"bytes": _BIG_AUDIO}}), {}, "item 0 item: binary of 25165825 bytes"),
    ],
)
def test_each_item_rule_is_enforced_with_the_same_text(
    checker: str, items: Any, fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError) as caught:
        _check(checker, _body(_items(2) if items is None else items, **fields))
    assert str(caught.value).startswith(match), str(caught.value)


@pytest.mark.parametrize("checker", sorted(CHECKERS))
def test_media_within_limits_other_binaries_and_texts_naming_refused_keys_pass(checker: str) -> None:
    items = _items(2)
    items[0]["item"] = {"audio": {"bytes": b"\0" * (24 * 1024 * 1024)}, "blob": b"\0" * (20 * 1024 * 1024)}
    items[1]["item"] = {"text": "fallback_reason numerical_admission_sha256"}
    items[1]["fallback"] = {"fallback_reason": 1}  # nested, not a top-level key
    assert len(_check(checker, _body(items))[0]) == 2
    refused_on_extract = _items(1)
    for item in refused_on_extract:
        item["operation"] = "extract"
        item["fallback_reason"] = "x"
    assert len(_check(checker, _body(refused_on_extract, endpoint="extract"))[0]) == 1


@pytest.mark.parametrize("checker", sorted(CHECKERS))
def test_more_than_4096_items_are_refused(checker: str) -> None:
    items = work_items("r", "encode", "m", [{} for _ in range(4097)])
    with pytest.raises(ValueError, match="4097 items is over the limit of 4096"):
        _check(checker, _body(items))


@pytest.mark.parametrize("checker", sorted(CHECKERS))
@pytest.mark.parametrize(
    ("meta", "own", "ok"),
    [
        ("", "", True),
        ("default", "default", True),
        (" Default ", "default", True),
        ("default", " DEFAULT", True),
        ("default", "", False),
        ("", "default", False),
        ("gpu", "gpu", False),
    ],
)
def test_admission_pools_must_agree_and_match_the_lane(checker: str, meta: str, own: str, ok: bool) -> None:
    items = _items(1)
    items[0]["admission_pool"] = own
    _, _, admitted = _check(checker, _body(items, admission_pool=meta))
    assert admitted == [ok]


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6), st.binary(max_size=6), st.floats(allow_nan=False)
)
_field_names = st.sampled_from(
    [
        "request_id",
        "work_item_id",
        "item_index",
        "total_items",
        "operation",
        "model_id",
        "engine",
        "bundle_config_hash",
        "admission_pool",
        "pool_name",
        "machine_profile",
        "reply_subject",
        "payload_ref",
        "item",
        "fallback_reason",
        "other",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.dictionaries(_field_names, _values, max_size=4), min_size=1, max_size=3), st.booleans())
def test_native_and_twin_agree_on_any_items(mutations: list[dict[str, Any]], shuffle: bool) -> None:
    """Either both accept with equal slots (the items decoded equal), or both refuse with the same
    message (up to the decoder's own wording inside a msgpack error)."""
    items = _items(len(mutations))
    for item, change in zip(items, mutations, strict=True):
        item.update(change)
    if shuffle:  # key order is the caller's: the rules must not depend on it
        items = [dict(reversed(list(item.items()))) for item in items]
    body = _body(items)
    outcomes: dict[str, tuple[Any, ...]] = {}
    for name in CHECKERS:
        try:
            datas, indexes, admitted = _check(name, body)
            outcomes[name] = ("ok", [msgpack.unpackb(d, strict_map_key=False) for d in datas], indexes, admitted)
        except ValueError as exc:
            text = str(exc)
            outcomes[name] = ("error", text.split(": ", 1)[0] if text.startswith("items are not msgpack") else text)
    assert outcomes["native"] == outcomes["twin"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_checked_or_refused_but_never_crash(data: bytes) -> None:
    for name in CHECKERS:
        with contextlib.suppress(ValueError):
            _check(name, _body(data))


@pytest.mark.parametrize("timeout_ms", [-1, 300_001])
def test_publish_work_timeout_is_bounded(timeout_ms: int) -> None:
    with pytest.raises(ValueError, match="timeout_ms"):
        Body(timeout_ms=timeout_ms).publish_timeout_ms()
    assert Body(timeout_ms=0).publish_timeout_ms() == 300_000
    assert Body(timeout_ms=250).publish_timeout_ms() == 250
