# SPDX-License-Identifier: Apache-2.0
"""IPC envelopes and BatchOutcome decoding (wire-protocol §2, §4.5-§4.7; TV-I1..TV-I10, TV-O1..TV-O6)."""

from __future__ import annotations

import dataclasses
import gc
import sys
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar import errors
from sie_sidecar.wire.limits import MAX_FRAME

FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

TV_I1_BODY = bytes.fromhex(
    "85a776657273696f6e01aa726571756573745f6964a7722d736d616c6ca26f6bc3a4626f647981a576616c756593010203a56572726f72c0"
)
TV_I2_REQUEST = bytes.fromhex(
    "0000002c84a776657273696f6ecd03e7a66d6574686f64a450696e67aa726571756573745f6964a27231a4626f647980"
)
TV_I2_RESPONSE = bytes.fromhex(
    "0000004085a776657273696f6e01aa726571756573745f6964a27231a26f6bc2a4626f6479c0a56572726f72b7756e737570706f727465642076657273696f6e20393939"
)
TV_I3_FRAME = bytes.fromhex(
    "0000006185a776657273696f6e01a66d6574686f64a450696e67aa726571756573745f6964a3772d31be616363657074735f6970635f726573706f6e73655f6368756e6b735f7631c3a4626f647981ac74696d657374616d705f6d73cb4045000000000000"
)
TV_I3_BODY = bytes.fromhex("81ac74696d657374616d705f6d73cb4045000000000000")
DIGEST = bytes.fromhex("c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225")
TV_I6_BODY = bytes.fromhex(
    "88a776657273696f6e01aa726571756573745f6964a27231af7472616e736665725f646967657374c420c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225ab6368756e6b5f696e64657800ab6368756e6b5f636f756e7402ab746f74616c5f62797465731ca77061796c6f6164c40a616e2065786163742073a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"
)
TV_I7_BODY = bytes.fromhex(
    "88a776657273696f6e01aa726571756573745f6964a27231af7472616e736665725f646967657374c420c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225ab6368756e6b5f696e64657801ab6368756e6b5f636f756e7402ab746f74616c5f62797465731ca77061796c6f6164c412657269616c697a656420726573706f6e7365a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"
)
TV_I9_CHUNK_KIND = bytes.fromhex(
    "86a776657273696f6e01aa726571756573745f6964a7722d6368756e6ba26f6bc3a4626f647981a576616c756501a56572726f72c0a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"
)
TV_I10_PING = bytes.fromhex("82ac74696d657374616d705f6d73cb405ec00000000000a9776f726b65725f6964a3772d31")
TV_O1 = bytes.fromhex(
    "89ac776f726b5f6974656d5f6964a3722e30aa726571756573745f6964a172aa6974656d5f696e64657800ab646973706f736974696f6eb57075626c6973685f6572726f725f616e645f61636bac6e616b5f64656c61795f6d73c0ae726573756c745f6d73677061636bc0a56572726f72a4626f6f6daa6572726f725f636f6465af696e666572656e63655f6572726f72ac696e666572656e63655f6d73c0"
)
TV_O2 = bytes.fromhex(
    "84ac776f726b5f6974656d5f6964a3722e30aa726571756573745f6964a172aa6974656d5f696e64657800ab646973706f736974696f6eaf7075626c6973685f616e645f61636b"
)
TV_O3 = bytes.fromhex("940b0203cd0fa0")
TV_O5 = bytes.fromhex("c404003c0180")
TV_O6 = bytes.fromhex(
    "84a26f70a6656e636f6465ac776f726b5f6974656d5f6964a3722e30aa726571756573745f6964a172aa6974656d5f696e64657800"
)

OUTCOMES_KEY = bytes.fromhex("a86f7574636f6d6573")  # "outcomes"


def pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def batch_of(*outcomes: bytes) -> bytes:
    """A BatchOutcome map {outcomes: [...]} around pre-encoded ItemOutcome maps."""
    assert len(outcomes) < 16
    return b"\x81" + OUTCOMES_KEY + bytes([0x90 | len(outcomes)]) + b"".join(outcomes)


def outcome_map(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "work_item_id": "r.0",
        "request_id": "r",
        "item_index": 0,
        "disposition": "publish_and_ack",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _ABSENT}


_ABSENT = object()


def decode_one(impl: ModuleType, **overrides: Any) -> Any:
    outcome = impl.decode_batch_outcome(pack({"outcomes": [outcome_map(**overrides)]}))
    assert len(outcome.outcomes) == 1
    return outcome.outcomes[0]


def units_of(impl: ModuleType, units_hex: str) -> Any:
    item = TV_O2[:1]  # fixmap header 0x84 → 0x85 with one more key
    body = bytes([item[0] + 1]) + TV_O2[1:] + pack("units") + bytes.fromhex(units_hex)
    return impl.decode_batch_outcome(batch_of(body)).outcomes[0].units


def envelope(**fields: Any) -> bytes:
    return pack(fields)


# --- TV-I1: a legacy response ------------------------------------------------------------------


def test_tv_i1_response_decode(impl: ModuleType) -> None:
    env = impl.decode_response(TV_I1_BODY)
    assert isinstance(env, impl.ResponseEnvelope)
    assert (env.version, env.request_id, env.ok, env.error) == (1, "r-small", True, None)
    assert isinstance(env.body, memoryview)
    assert bytes(env.body) == bytes.fromhex("81a576616c756593010203")
    body = impl.response_body(env, "r-small")
    assert impl.decode_body(body) == {"value": [1, 2, 3]}


def test_tv_i1_body_is_a_view_of_the_frame(impl: ModuleType) -> None:
    frame = bytearray(TV_I1_BODY)
    env = impl.decode_response(frame)
    start = TV_I1_BODY.index(bytes.fromhex("81a576616c7565"))
    frame[start + 8] = 0x04  # value[0] 1 → 4
    assert env.body is not None
    assert impl.decode_body(env.body) == {"value": [4, 2, 3]}


# --- TV-I2: error envelope (version mismatch answered by the backend) ---------------------------


def test_tv_i2_error_response(impl: ModuleType) -> None:
    bodies = impl.FrameSplitter().feed(TV_I2_REQUEST + TV_I2_RESPONSE)
    assert len(bodies) == 2
    assert impl.decode_body(bodies[0]) == {"version": 999, "method": "Ping", "request_id": "r1", "body": {}}
    env = impl.decode_response(bodies[1])
    assert (env.version, env.request_id, env.ok, env.body, env.error) == (
        1,
        "r1",
        False,
        None,
        "unsupported version 999",
    )
    with pytest.raises(errors.IpcServerError) as info:
        impl.response_body(env, "r1")
    assert info.value.message == "unsupported version 999"


# --- TV-I3: the first Ping request --------------------------------------------------------------


def test_tv_i3_ping_request_bytes(impl: ModuleType) -> None:
    assert impl.encode_request("Ping", "w-1", TV_I3_BODY) == TV_I3_FRAME
    assert impl.encode_request("Ping", "w-1", TV_I3_BODY, accepts_chunks=True) == TV_I3_FRAME
    assert impl.encode_request("Ping", "w-1", pack({"timestamp_ms": 42.0})) == TV_I3_FRAME


def test_tv_i3_request_without_capability(impl: ModuleType) -> None:
    frame = impl.encode_request("ProcessGenerate", "w-2", b"\x80", accepts_chunks=False)
    decoded = impl.decode_body(frame[4:])
    assert list(decoded) == ["version", "method", "request_id", "accepts_ipc_response_chunks_v1", "body"]
    assert decoded["accepts_ipc_response_chunks_v1"] is False
    assert frame.endswith(b"\xbeaccepts_ipc_response_chunks_v1\xc2\xa4body\x80")


def test_encode_request_long_strings(impl: ModuleType) -> None:
    for n in (31, 32, 255, 256, 65_535, 65_536):
        method = "m" * n
        frame = impl.encode_request(method, "é" * 20, b"\x80")
        assert impl.decode_body(frame[4:]) == {
            "version": 1,
            "method": method,
            "request_id": "é" * 20,
            "accepts_ipc_response_chunks_v1": True,
            "body": {},
        }
        assert frame[4:] == pack(
            {
                "version": 1,
                "method": method,
                "request_id": "é" * 20,
                "accepts_ipc_response_chunks_v1": True,
                "body": {},
            }
        )


def test_encode_request_body_spliced_verbatim(impl: ModuleType) -> None:
    # A non-canonical encoding (map16 header, uint32 value) must survive untouched.
    body = bytes.fromhex("de0001a178ce00000001")
    frame = impl.encode_request("Ping", "w-1", bytearray(body))
    assert frame.endswith(b"\xa4body" + body)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4


def test_tv_i5_encode_request_ceiling(impl: ModuleType) -> None:
    head = len(impl.encode_request("Ping", "w-1", b"\x80")) - 4 - 1
    # body = {"x": bin32(n)}: 1 (map) + 2 (key) + 5 (bin32 header) + n
    n = MAX_FRAME - head - 8
    body = b"\x81\xa1x\xc6" + n.to_bytes(4, "big") + bytes(n)
    frame = impl.encode_request("Ping", "w-1", body)
    assert frame[:4] == bytes.fromhex("02000000")
    assert len(frame) == MAX_FRAME + 4
    n += 1
    body = b"\x81\xa1x\xc6" + n.to_bytes(4, "big") + bytes(n)
    with pytest.raises(errors.FrameTooLarge):
        impl.encode_request("Ping", "w-1", body)


# --- TV-I4 / TV-I5: undecodable bodies ----------------------------------------------------------


@pytest.mark.parametrize("body", [b"", b"\xff\xff\xff", b"\x85", b"\xc1"], ids=["empty", "tv-i4", "truncated", "c1"])
def test_undecodable_frames(impl: ModuleType, body: bytes) -> None:
    with pytest.raises(errors.DecodeError):
        impl.decode_response(body)


# --- TV-I6 / TV-I7: chunk frames decode ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "index", "payload"),
    [(TV_I6_BODY, 0, b"an exact s"), (TV_I7_BODY, 1, b"erialized response")],
    ids=["tv-i6", "tv-i7"],
)
def test_tv_i6_i7_chunk_decode(impl: ModuleType, body: bytes, index: int, payload: bytes) -> None:
    chunk = impl.decode_response(body)
    assert isinstance(chunk, impl.IpcResponseChunk)
    assert chunk.version == 1
    assert chunk.request_id == "r1"
    assert chunk.transfer_digest == DIGEST
    assert (chunk.chunk_index, chunk.chunk_count, chunk.total_bytes) == (index, 2, 28)
    assert isinstance(chunk.payload, memoryview)
    assert bytes(chunk.payload) == payload
    assert chunk.frame_len == len(body)


def test_tv_i6_frame_lengths(impl: ModuleType) -> None:
    assert len(TV_I6_BODY) == 160
    assert len(TV_I7_BODY) == 168
    bodies = impl.FrameSplitter().feed(bytes.fromhex("000000a0") + TV_I6_BODY + bytes.fromhex("000000a8") + TV_I7_BODY)
    assert [bytes(b) for b in bodies] == [TV_I6_BODY, TV_I7_BODY]


def test_chunk_decode_key_order_independent(impl: ModuleType) -> None:
    fields = impl.decode_body(TV_I6_BODY)
    reordered = pack(dict(reversed(list(fields.items()))) | {"unknown": [1, 2]})
    chunk = impl.decode_response(reordered)
    assert isinstance(chunk, impl.IpcResponseChunk)
    assert bytes(chunk.payload) == b"an exact s"
    assert chunk.frame_len == len(reordered)


CHUNK_FIELDS = {
    "version": 1,
    "request_id": "r1",
    "transfer_digest": DIGEST,
    "chunk_index": 0,
    "chunk_count": 2,
    "total_bytes": 28,
    "payload": b"an exact s",
    "kind": "ipc_response_chunk_v1",
}


# --- decoding holds on to nothing -----------------------------------------------------------------

LEAK_CALLS = 20_000


def _blocks_left_by(decode: Any, frame: bytes) -> int:
    """Allocated blocks left behind by `LEAK_CALLS` decodes of `frame` (results dropped at once)."""
    for _ in range(100):  # warm-up: interned names, type caches, the slice cache
        decode(frame)
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(LEAK_CALLS):
        decode(frame)
    gc.collect()
    return sys.getallocatedblocks() - before


@pytest.mark.parametrize("kind", ["envelope", "chunk"])
def test_decode_response_leaves_nothing_behind(impl: ModuleType, kind: str) -> None:
    """The body (or payload) view of every response frame is a slice of the frame; pyo3 0.30's
    `PySlice::new` leaked its int bounds, so each frame whose view ends past 256 (every RunBatch
    response) left one int behind: one per batch, the leak check's steady RSS growth. A leak of
    one object per call would leave `LEAK_CALLS` blocks; the allowance is for allocator noise."""
    if kind == "envelope":
        frame = envelope(version=1, request_id="r-leak", ok=True, body={"value": b"x" * 1000}, error=None)
    else:
        frame = pack(CHUNK_FIELDS | {"payload": b"x" * 1000, "total_bytes": 2000})
    result = impl.decode_response(frame)
    view = result.body if kind == "envelope" else result.payload
    assert view is not None and frame.index(bytes(view)) + len(view) > 256  # the view's end is no small int
    del result, view
    assert _blocks_left_by(impl.decode_response, frame) < LEAK_CALLS // 20


@pytest.mark.parametrize("missing", [k for k in CHUNK_FIELDS if k != "kind"])
def test_chunk_missing_field(impl: ModuleType, missing: str) -> None:
    with pytest.raises(errors.DecodeError):
        impl.decode_response(pack({k: v for k, v in CHUNK_FIELDS.items() if k != missing}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("version", -1),
        ("version", "1"),
        ("version", True),
        ("request_id", 7),
        ("transfer_digest", DIGEST[:31]),
        ("transfer_digest", DIGEST + b"\x00"),
        ("transfer_digest", DIGEST.hex()),
        ("chunk_index", -1),
        ("chunk_index", 0.0),
        ("chunk_count", None),
        ("total_bytes", "28"),
        ("payload", "an exact s"),
        ("payload", None),
        ("payload", [1, 2]),
    ],
)
def test_chunk_wrong_field_type(impl: ModuleType, key: str, value: Any) -> None:
    with pytest.raises(errors.DecodeError):
        impl.decode_response(pack(CHUNK_FIELDS | {key: value}))


# --- TV-I9: kind classifies -------------------------------------------------------------------


def test_tv_i9a_exact_kind_is_a_chunk(impl: ModuleType) -> None:
    # An ordinary envelope carrying the v1 kind enters the chunk decoder and fails there.
    with pytest.raises(errors.DecodeError):
        impl.decode_response(TV_I9_CHUNK_KIND)


@pytest.mark.parametrize(
    "kind", ["future_response_v2", _ABSENT, None, 1, "IPC_RESPONSE_CHUNK_V1", b"ipc_response_chunk_v1"]
)
def test_tv_i9b_other_kind_is_a_response(impl: ModuleType, kind: Any) -> None:
    fields: dict[str, Any] = {"version": 1, "request_id": "r-chunk", "ok": True, "body": {"value": 1}, "error": None}
    if kind is not _ABSENT:
        fields["kind"] = kind
    env = impl.decode_response(pack(fields))
    assert isinstance(env, impl.ResponseEnvelope)
    assert env.body is not None
    assert bytes(env.body) == bytes.fromhex("81a576616c756501")
    assert impl.response_body(env, "r-chunk") == env.body


def test_tv_i9b_hex(impl: ModuleType) -> None:
    future = TV_I9_CHUNK_KIND.replace(
        bytes.fromhex("b56970635f726573706f6e73655f6368756e6b5f7631"), pack("future_response_v2")
    )
    env = impl.decode_response(future)
    assert isinstance(env, impl.ResponseEnvelope)
    assert (env.version, env.request_id, env.ok, env.error) == (1, "r-chunk", True, None)


def test_kind_decides_whatever_the_key_order(impl: ModuleType) -> None:
    fields = dict(CHUNK_FIELDS)
    kind = fields.pop("kind")
    first = pack({"kind": kind} | fields)
    assert isinstance(impl.decode_response(first), impl.IpcResponseChunk)


# --- TV-I10: PingResponse body --------------------------------------------------------------------


def test_tv_i10_ping_response_body(impl: ModuleType) -> None:
    frame = b"\x85" + pack("version") + b"\x01" + pack("request_id") + pack("w-1") + pack("ok") + b"\xc3"
    frame += pack("body") + TV_I10_PING + pack("error") + b"\xc0"
    env = impl.decode_response(frame)
    body = impl.response_body(env, "w-1")
    assert bytes(body) == TV_I10_PING
    assert impl.decode_body(body) == {"timestamp_ms": 123.0, "worker_id": "w-1"}


# --- envelopes: shape and client rules ------------------------------------------------------------


def test_envelope_key_order_and_unknown_keys(impl: ModuleType) -> None:
    raw = envelope(extra={"nested": [1, b"x"]}, error=None, body={"a": b"\x00"}, ok=True, request_id="w-9", version=1)
    env = impl.decode_response(raw)
    assert (env.version, env.request_id, env.ok, env.error) == (1, "w-9", True, None)
    assert env.body is not None
    assert bytes(env.body) == pack({"a": b"\x00"})


def test_envelope_optional_keys_absent(impl: ModuleType) -> None:
    env = impl.decode_response(envelope(version=1, request_id="w-1", ok=False))
    assert env.body is None
    assert env.error is None
    with pytest.raises(errors.IpcServerError):
        impl.response_body(env, "w-1")


def test_envelope_map16_body(impl: ModuleType) -> None:
    body = pack({f"k{i}": i for i in range(20)})
    assert body[0] == 0xDE
    env = impl.decode_response(envelope(version=1, request_id="w-1", ok=True, body={f"k{i}": i for i in range(20)}))
    assert bytes(impl.response_body(env, "w-1")) == body


def test_envelope_is_frozen(impl: ModuleType) -> None:
    env = impl.decode_response(TV_I1_BODY)
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
        env.ok = False


@pytest.mark.parametrize("missing", ["version", "request_id", "ok"])
def test_envelope_missing_required(impl: ModuleType, missing: str) -> None:
    fields = {"version": 1, "request_id": "w-1", "ok": True, "body": {}}
    del fields[missing]
    with pytest.raises(errors.DecodeError):
        impl.decode_response(pack(fields))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("version", -1),
        ("version", "1"),
        ("version", 1.0),
        ("version", False),
        ("request_id", None),
        ("request_id", b"w-1"),
        ("ok", 1),
        ("ok", None),
        ("body", [1]),
        ("body", 3),
        ("body", "{}"),
        ("body", b"\x80"),
        ("error", 5),
        ("error", b"boom"),
    ],
)
def test_envelope_wrong_types(impl: ModuleType, key: str, value: Any) -> None:
    fields: dict[str, Any] = {"version": 1, "request_id": "w-1", "ok": True, "body": {}, "error": None}
    fields[key] = value
    with pytest.raises(errors.DecodeError):
        impl.decode_response(pack(fields))


@pytest.mark.parametrize("raw", [pack([1, 2]), pack("x"), pack(None), TV_I1_BODY + b"\xc0", TV_I1_BODY[:-1]])
def test_envelope_not_a_single_map(impl: ModuleType, raw: bytes) -> None:
    with pytest.raises(errors.DecodeError):
        impl.decode_response(raw)


def test_envelope_invalid_utf8(impl: ModuleType) -> None:
    raw = b"\x83" + pack("version") + b"\x01" + pack("request_id") + b"\xa2\xff\xfe" + pack("ok") + b"\xc3"
    with pytest.raises(errors.DecodeError):
        impl.decode_response(raw)


def test_response_body_rules(impl: ModuleType) -> None:
    ok = impl.decode_response(envelope(version=1, request_id="w-1", ok=True, body={}))
    assert bytes(impl.response_body(ok, "w-1")) == b"\x80"
    with pytest.raises(errors.ProtocolError, match="request_id"):
        impl.response_body(ok, "w-2")
    v2 = impl.decode_response(envelope(version=2, request_id="w-1", ok=True, body={}))
    with pytest.raises(errors.ProtocolError, match="version mismatch"):
        impl.response_body(v2, "w-1")
    for fields in ({"body": None}, {}):
        no_body = impl.decode_response(envelope(version=1, request_id="w-1", ok=True, **fields))
        with pytest.raises(errors.ProtocolError, match="body missing") as info:
            impl.response_body(no_body, "w-1")
        assert not isinstance(info.value, errors.DecodeError)
    failed = impl.decode_response(envelope(version=1, request_id="w-1", ok=False, body={}, error="draining"))
    with pytest.raises(errors.IpcServerError) as server:
        impl.response_body(failed, "w-1")
    assert server.value.message == "draining"


def test_decode_body_generic(impl: ModuleType) -> None:
    value = {"a": [1, -2, 3.5, None, True], "b": b"\x00\x01", 7: "int key", "c": {"d": "é"}}
    assert impl.decode_body(pack(value)) == value
    assert impl.decode_body(memoryview(pack([1, 2]))) == [1, 2]
    for bad in (b"", b"\xc1", pack({}) + b"\x00", b"\x92\x01"):
        with pytest.raises(errors.DecodeError):
            impl.decode_body(bad)


# --- TV-O1..TV-O6: outcomes -----------------------------------------------------------------------


def test_tv_o1_nil_optional_bytes(impl: ModuleType) -> None:
    assert len(TV_O1) == 159
    batch = impl.decode_batch_outcome(batch_of(TV_O1))
    assert batch.batched_f16_multivectors == []
    (o,) = batch.outcomes
    assert isinstance(o, impl.ItemOutcome)
    assert (o.work_item_id, o.request_id, o.item_index) == ("r.0", "r", 0)
    assert o.disposition == "publish_error_and_ack"
    assert o.result_msgpack == b""
    assert o.error == "boom"
    assert o.error_code == "inference_error"
    assert o.nak_delay_ms is None
    assert o.inference_ms is None


def test_tv_o2_required_keys_only(impl: ModuleType) -> None:
    assert len(TV_O2) == 71
    (o,) = impl.decode_batch_outcome(batch_of(TV_O2)).outcomes
    assert o.disposition == "publish_and_ack"
    assert o.result_msgpack == b""
    assert (o.error, o.error_code, o.nak_delay_ms) == (None, None, None)
    assert (o.inference_ms, o.tokenization_ms, o.postprocessing_ms) == (None, None, None)
    assert (o.raw_output, o.units, o.retry_after_s) == (None, None, None)


def test_tv_o3_positional_units(impl: ModuleType) -> None:
    assert units_of(impl, TV_O3.hex()) == {"input_tokens": 11, "pages": 2, "images": 3, "audio_ms": 4000, "pairs": None}


@pytest.mark.parametrize(
    ("units_hex", "expected"),
    [
        ("82ac696e7075745f746f6b656e7307a8617564696f5f6d73cd3039", {"input_tokens": 7, "audio_ms": 12345}),
        ("81ac696e7075745f746f6b656e7307", {"input_tokens": 7}),
        (
            "85ac696e7075745f746f6b656e7307a57061676573c0a6696d61676573c0a8617564696f5f6d73cd3039a57061697273c0",
            {"input_tokens": 7, "audio_ms": 12345},
        ),
    ],
    ids=["tv-o4-row1", "tv-o4-row2", "tv-o4-row4"],
)
def test_tv_o4_named_units(impl: ModuleType, units_hex: str, expected: dict[str, int]) -> None:
    units = units_of(impl, units_hex)
    assert list(units) == ["input_tokens", "pages", "images", "audio_ms", "pairs"]
    assert units == {"input_tokens": None, "pages": None, "images": None, "audio_ms": None, "pairs": None} | expected


def test_tv_o4_negative_count(impl: ModuleType) -> None:
    with pytest.raises(errors.DecodeError):
        units_of(impl, "81a8617564696f5f6d73ff")


def test_tv_o5_f16_values(impl: ModuleType) -> None:
    item = {"work_item_id": "r.0", "byte_offset": 0, "byte_len": 4, "num_tokens": 1, "token_dims": 2}
    raw = (
        b"\x82"
        + pack("outcomes")
        + b"\x91"
        + TV_O2
        + pack("batched_f16_multivectors")
        + b"\x91\x82"
        + pack("values_f16")
        + TV_O5
        + pack("items")
        + pack([item])
    )
    batch = impl.decode_batch_outcome(raw)
    (mv,) = batch.batched_f16_multivectors
    assert isinstance(mv, impl.BatchedF16Multivector)
    assert mv.values_f16 == bytes.fromhex("003c0180")
    assert int.from_bytes(mv.values_f16[0:2], "little") == 0x3C00
    assert int.from_bytes(mv.values_f16[2:4], "little") == 0x8001
    assert mv.items == [item]


def test_tv_o5_odd_length_fails_the_batch(impl: ModuleType) -> None:
    raw = pack(
        {"outcomes": [outcome_map()], "batched_f16_multivectors": [{"values_f16": b"\x00\x3c\x01", "items": []}]}
    )
    with pytest.raises(errors.DecodeError):
        impl.decode_batch_outcome(raw)


def test_tv_o6_run_batch_item_body(impl: ModuleType) -> None:
    item = impl.decode_body(TV_O6)
    assert item == {"op": "encode", "work_item_id": "r.0", "request_id": "r", "item_index": 0}
    assert "traceparent" not in item
    assert "tracestate" not in item
    # A RunBatch request carries such items verbatim inside the spliced body.
    body = b"\x81" + pack("items") + b"\x91" + TV_O6
    frame = impl.encode_request("RunBatch", "w-3", body)
    assert frame.endswith(TV_O6)
    assert impl.decode_body(frame[4:])["body"] == {"items": [item]}


# --- ItemOutcome: every field -------------------------------------------------------------------


def test_outcome_all_fields(impl: ModuleType) -> None:
    raw_output = {"dense": {"values": [1.0, 2.0], "dim": 2, "normalize": True}}
    o = decode_one(
        impl,
        disposition="nak_retry",
        nak_delay_ms=2500,
        result_msgpack=b"\x80",
        error="e",
        error_code="QUEUE_FULL",
        inference_ms=1.5,
        tokenization_ms=2,
        postprocessing_ms=0.25,
        raw_output=raw_output,
        units={"input_tokens": 3, "pairs": 1, "gpu_second": 0.5, "output_tokens": 9},
        retry_after_s=4,
        future_field={"x": 1},
    )
    assert o.disposition == "nak_retry"
    assert o.nak_delay_ms == 2500
    assert o.result_msgpack == b"\x80"
    assert (o.error, o.error_code) == ("e", "QUEUE_FULL")
    assert (o.inference_ms, o.tokenization_ms, o.postprocessing_ms) == (1.5, 2.0, 0.25)
    assert isinstance(o.tokenization_ms, float)
    assert o.raw_output == raw_output
    five = {"input_tokens": 3, "pages": None, "images": None, "audio_ms": None, "pairs": 1}
    assert o.units == five | {"output_tokens": 9}  # newer than v0.7.1: kept; gpu_second dropped
    assert o.retry_after_s == 4


def test_outcome_float32_timings(impl: ModuleType) -> None:
    raw = batch_of(TV_O2[:0] + b"\x85" + TV_O2[1:] + pack("inference_ms") + b"\xca\x3f\xc0\x00\x00")
    assert impl.decode_batch_outcome(raw).outcomes[0].inference_ms == 1.5


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (_ABSENT, b""),
        (None, b""),
        (b"", b""),
        (b"\x92\x01\x02", b"\x92\x01\x02"),
        ("\x92", "\x92".encode()),
        ("abc", b"abc"),
        ([], b""),
        ([0, 127, 128, 255], b"\x00\x7f\x80\xff"),
    ],
    ids=["absent", "nil", "empty-bin", "bin", "str-non-ascii", "str", "empty-array", "array"],
)
def test_outcome_result_msgpack_forms(impl: ModuleType, value: Any, expected: bytes) -> None:
    assert decode_one(impl, result_msgpack=value).result_msgpack == expected


@pytest.mark.parametrize("value", [[256], [-1], [1.0], ["a"], [None], 5, {"a": 1}, True, [True]])
def test_outcome_result_msgpack_invalid(impl: ModuleType, value: Any) -> None:
    with pytest.raises(errors.DecodeError):
        decode_one(impl, result_msgpack=value)


@pytest.mark.parametrize("units", [[], [1], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0.5, "x"], [None, 2, None, 4]])
def test_outcome_positional_units(impl: ModuleType, units: list[Any]) -> None:
    expected = dict(
        zip(["input_tokens", "pages", "images", "audio_ms", "pairs"], [*units[:5], *[None] * 5], strict=False)
    )
    assert decode_one(impl, units=units).units == expected


@pytest.mark.parametrize(
    "units",
    [
        {"pages": -3},
        {"images": 1.0},
        {"audio_ms": "12"},
        {"pairs": True},
        {"input_tokens": [1]},
        [-1],
        [1, 2, 3, "4"],
        [1, 2, 3, 4, -5],
        "units",
        7,
        True,
    ],
)
def test_outcome_invalid_units(impl: ModuleType, units: Any) -> None:
    with pytest.raises(errors.DecodeError):
        decode_one(impl, units=units)


def test_outcome_units_unknown_keys_dropped_unchecked(impl: ModuleType) -> None:
    units = decode_one(impl, units={"gpu_second": -1.5, "tokens_of_tomorrow": "x", 3: 4}).units
    assert units == {"input_tokens": None, "pages": None, "images": None, "audio_ms": None, "pairs": None}


def test_outcome_units_newer_keys_are_kept_when_present(impl: ModuleType) -> None:
    """wire-protocol §4.6 (newer than v0.7.1): `content_input_tokens` and `output_tokens` are known,
    checked like every count, and present in the decoded map only when given."""
    units = decode_one(impl, units={"input_tokens": 9, "content_input_tokens": 4, "output_tokens": None}).units
    assert units == {
        "input_tokens": 9,
        "pages": None,
        "images": None,
        "audio_ms": None,
        "pairs": None,
        "content_input_tokens": 4,
    }
    with pytest.raises(errors.DecodeError):
        decode_one(impl, units={"output_tokens": -1})
    positional = decode_one(impl, units=[1, 2, 3, 4, 5, 6, 7]).units
    assert list(positional) == ["input_tokens", "pages", "images", "audio_ms", "pairs"]  # legacy order only


def test_outcome_big_counts(impl: ModuleType) -> None:
    o = decode_one(impl, item_index=2**64 - 1, units={"audio_ms": 2**63})
    assert o.item_index == 2**64 - 1
    assert o.units["audio_ms"] == 2**63


@pytest.mark.parametrize("missing", ["work_item_id", "request_id", "item_index", "disposition"])
def test_outcome_missing_required(impl: ModuleType, missing: str) -> None:
    with pytest.raises(errors.DecodeError):
        decode_one(impl, **{missing: _ABSENT})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("work_item_id", 1),
        ("work_item_id", None),
        ("request_id", b"r"),
        ("item_index", -1),
        ("item_index", "0"),
        ("item_index", 1.0),
        ("item_index", None),
        ("disposition", "ack"),
        ("disposition", "PUBLISH_AND_ACK"),
        ("disposition", None),
        ("disposition", 0),
        ("nak_delay_ms", -5),
        ("nak_delay_ms", 1.5),
        ("nak_delay_ms", "5"),
        ("error", 3),
        ("error_code", b"X"),
        ("inference_ms", "1"),
        ("inference_ms", True),
        ("tokenization_ms", [1]),
        ("postprocessing_ms", {}),
        ("raw_output", [1]),
        ("raw_output", "dense"),
        ("retry_after_s", -1),
        ("retry_after_s", 0.5),
    ],
)
def test_outcome_wrong_types(impl: ModuleType, key: str, value: Any) -> None:
    with pytest.raises(errors.DecodeError):
        decode_one(impl, **{key: value})


@pytest.mark.parametrize("disposition", ["publish_and_ack", "publish_error_and_ack", "nak_retry"])
def test_outcome_dispositions(impl: ModuleType, disposition: str) -> None:
    assert decode_one(impl, disposition=disposition).disposition == disposition


def test_outcome_is_frozen(impl: ModuleType) -> None:
    o = decode_one(impl)
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
        o.disposition = "nak_retry"


# --- BatchOutcome shape -------------------------------------------------------------------------


def test_batch_many_outcomes_in_order(impl: ModuleType) -> None:
    outcomes = [outcome_map(work_item_id=f"r.{i}", item_index=i) for i in range(40)]
    batch = impl.decode_batch_outcome(pack({"batched_f16_multivectors": [], "outcomes": outcomes}))
    assert [o.item_index for o in batch.outcomes] == list(range(40))
    assert batch.batched_f16_multivectors == []


def test_batch_f16_nil_means_empty(impl: ModuleType) -> None:
    batch = impl.decode_batch_outcome(pack({"outcomes": [], "batched_f16_multivectors": None}))
    assert batch.outcomes == []
    assert batch.batched_f16_multivectors == []


def test_batch_f16_items_keep_known_keys(impl: ModuleType) -> None:
    item = {"work_item_id": "r.1", "byte_offset": 2, "byte_len": 2, "num_tokens": 1, "token_dims": 1}
    raw = pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": b"\x00" * 4, "items": [item | {"x": 1}]}]})
    (mv,) = impl.decode_batch_outcome(raw).batched_f16_multivectors
    assert mv.items == [item]


@pytest.mark.parametrize(
    "raw",
    [
        pack([]),
        pack({}),
        pack({"outcomes": None}),
        pack({"outcomes": {"a": 1}}),
        pack({"outcomes": [1]}),
        pack({"outcomes": [None]}),
        pack({"outcomes": [], "batched_f16_multivectors": {}}),
        pack({"outcomes": [], "batched_f16_multivectors": [1]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"items": []}]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": b""}]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": "ab", "items": []}]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": [0, 1], "items": []}]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": b"", "items": None}]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": b"", "items": [1]}]}),
        pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": b"", "items": [{"work_item_id": "a"}]}]}),
        pack({"outcomes": []}) + b"\x00",
        b"",
        b"\xc1",
    ],
)
def test_batch_invalid_shapes(impl: ModuleType, raw: bytes) -> None:
    with pytest.raises(errors.DecodeError):
        impl.decode_batch_outcome(raw)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("work_item_id", 3),
        ("byte_offset", -2),
        ("byte_len", "4"),
        ("num_tokens", 1.0),
        ("token_dims", None),
        ("token_dims", True),
    ],
)
def test_batch_f16_item_wrong_types(impl: ModuleType, key: str, value: Any) -> None:
    item = {"work_item_id": "r.1", "byte_offset": 0, "byte_len": 2, "num_tokens": 1, "token_dims": 1, key: value}
    raw = pack({"outcomes": [], "batched_f16_multivectors": [{"values_f16": b"\x00\x00", "items": [item]}]})
    with pytest.raises(errors.DecodeError):
        impl.decode_batch_outcome(raw)


# --- properties ---------------------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text()
_values = st.recursive(
    _scalars | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@FIXTURE
@given(
    method=st.text(max_size=40),
    request_id=st.text(max_size=300),
    body=st.dictionaries(st.text(max_size=10), _values, max_size=6),
    accepts=st.booleans(),
)
def test_encode_request_round_trip(
    impl: ModuleType, method: str, request_id: str, body: dict[str, Any], accepts: bool
) -> None:
    raw_body = pack(body)
    frame = impl.encode_request(method, request_id, raw_body, accepts_chunks=accepts)
    assert frame[4:] == pack(
        {
            "version": 1,
            "method": method,
            "request_id": request_id,
            "accepts_ipc_response_chunks_v1": accepts,
            "body": body,
        }
    )
    (got,) = impl.FrameSplitter().feed(frame)
    assert bytes(got).endswith(raw_body)
    decoded = impl.decode_body(got)
    assert list(decoded) == ["version", "method", "request_id", "accepts_ipc_response_chunks_v1", "body"]
    assert decoded == {
        "version": 1,
        "method": method,
        "request_id": request_id,
        "accepts_ipc_response_chunks_v1": accepts,
        "body": body,
    }


@FIXTURE
@given(
    request_id=st.text(max_size=40),
    ok=st.booleans(),
    body=st.none() | st.dictionaries(st.text(max_size=10), _values, max_size=6),
    error=st.none() | st.text(max_size=40),
    extra=st.dictionaries(st.sampled_from(["kind", "x", "trace"]), _values, max_size=2),
    order=st.randoms(use_true_random=False),
)
def test_response_round_trip(  # noqa: PLR0917 - hypothesis draws
    impl: ModuleType,
    request_id: str,
    ok: bool,
    body: dict[str, Any] | None,
    error: str | None,
    extra: dict[str, Any],
    order: Any,
) -> None:
    if extra.get("kind") == "ipc_response_chunk_v1":
        extra["kind"] = "other"
    items = [("version", 1), ("request_id", request_id), ("ok", ok), ("body", body), ("error", error), *extra.items()]
    order.shuffle(items)
    env = impl.decode_response(pack(dict(items)))
    assert isinstance(env, impl.ResponseEnvelope)
    assert (env.version, env.request_id, env.ok, env.error) == (1, request_id, ok, error)
    if body is None:
        assert env.body is None
    else:
        assert env.body is not None
        assert bytes(env.body) == pack(body)
        assert impl.decode_body(env.body) == body


@FIXTURE
@given(
    outcomes=st.lists(
        st.fixed_dictionaries(
            {
                "work_item_id": st.text(max_size=10),
                "request_id": st.text(max_size=10),
                "item_index": st.integers(0, 2**32),
                "disposition": st.sampled_from(["publish_and_ack", "publish_error_and_ack", "nak_retry"]),
            },
            optional={
                "nak_delay_ms": st.none() | st.integers(0, 2**32),
                "result_msgpack": st.none() | st.binary(max_size=30),
                "error": st.none() | st.text(max_size=10),
                "error_code": st.none() | st.text(max_size=10),
                "inference_ms": st.none() | st.floats(allow_nan=False),
                "units": st.none()
                | st.fixed_dictionaries(
                    {}, optional={k: st.none() | st.integers(0, 2**40) for k in ["input_tokens", "pages", "pairs"]}
                ),
                "retry_after_s": st.none() | st.integers(0, 600),
            },
        ),
        max_size=5,
    )
)
def test_batch_outcome_round_trip(impl: ModuleType, outcomes: list[dict[str, Any]]) -> None:
    batch = impl.decode_batch_outcome(pack({"outcomes": outcomes}))
    assert len(batch.outcomes) == len(outcomes)
    for got, want in zip(batch.outcomes, outcomes, strict=True):
        assert got.work_item_id == want["work_item_id"]
        assert got.item_index == want["item_index"]
        assert got.disposition == want["disposition"]
        assert got.nak_delay_ms == want.get("nak_delay_ms")
        assert got.result_msgpack == (want.get("result_msgpack") or b"")
        assert got.inference_ms == want.get("inference_ms")
        units = want.get("units")
        if units is None:
            assert got.units is None
        else:
            assert got.units == {k: units.get(k) for k in ["input_tokens", "pages", "images", "audio_ms", "pairs"]}
