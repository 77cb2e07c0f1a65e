# SPDX-License-Identifier: Apache-2.0
"""WorkResult encoding, ResultChunkV1 planning and reassembly (wire-protocol §8, §9): TV-R1..TV-R4."""

from __future__ import annotations

import hashlib
import math
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.errors import ChunkProtocolError, PayloadTooLarge, ProtocolError, WireError
from sie_sidecar.wire.limits import MAX_CHUNKED_RESULT, MAX_RESULT_CHUNKS, RESULT_CHUNK_TARGET
from sie_sidecar.wire.types import WorkResult

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

TV_R1 = bytes.fromhex(
    "89a46b696e64af726573756c745f6368756e6b5f7631ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f6964a572"
    "65712d31aa6974656d5f696e64657800af7472616e736665725f646967657374c42007070707070707070707070707070707070707070707"
    "07070707070707070707ab6368756e6b5f696e64657801ab6368756e6b5f636f756e7403ab746f74616c5f6279746573cd04d2a7706179"
    "6c6f6164c404000102ff"
)
TV_R2 = bytes.fromhex(
    "8fac776f726b5f6974656d5f6964a77265712d312e32aa726571756573745f6964a57265712d31aa6974656d5f696e64657802a7737563"
    "63657373c3ae726573756c745f6d73677061636bc40881a568656c6c6f05a56572726f72c0aa6572726f725f636f6465c0ac696e666572"
    "656e63655f6d73cb4029000000000000a871756575655f6d73c0ad70726f63657373696e675f6d73cb402c000000000000a9776f726b65"
    "725f6964a3772d31af746f6b656e697a6174696f6e5f6d73c0b1706f737470726f63657373696e675f6d73c0b07061796c6f61645f6665"
    "7463685f6d73c0ad776f726b65725f646972656374c3"
)
TV_R4 = bytes.fromhex(
    "87ac776f726b5f6974656d5f6964a77265712d392e30aa726571756573745f6964a57265712d39aa6974656d5f696e64657800a7737563"
    "63657373c2ae726573756c745f6d73677061636bc0a56572726f72b5756e737570706f72746564206f7065726174696f6eaa6572726f72"
    "5f636f6465af696e666572656e63655f6572726f72"
)

BASE_KEYS = [
    "work_item_id",
    "request_id",
    "item_index",
    "success",
    "result_msgpack",
    "error",
    "error_code",
    "inference_ms",
    "queue_ms",
    "processing_ms",
    "worker_id",
    "tokenization_ms",
    "postprocessing_ms",
    "payload_fetch_ms",
]


def tv_r2_result() -> WorkResult:
    return WorkResult(
        work_item_id="req-1.2",
        request_id="req-1",
        item_index=2,
        success=True,
        result_msgpack=bytes.fromhex("81a568656c6c6f05"),
        inference_ms=12.5,
        processing_ms=14.0,
        worker_id="w-1",
        worker_direct=True,
    )


def ordered(data: bytes) -> list[tuple[Any, Any]]:
    pairs: list[tuple[Any, Any]] = msgpack.unpackb(data, raw=False, object_pairs_hook=list)
    return pairs


def result_with_payload(size: int, seed: int = 0, **kwargs: Any) -> WorkResult:
    payload = np.random.default_rng(seed).bytes(size)
    return WorkResult(
        work_item_id="req-7.3",
        request_id="req-7",
        item_index=3,
        success=True,
        result_msgpack=payload,
        worker_id="worker-a",
        **kwargs,
    )


def chunk(
    impl: ModuleType,
    *,
    work_item_id: str = "req.0",
    request_id: str = "req",
    item_index: int = 0,
    digest: bytes | None = None,
    index: int = 0,
    count: int = 1,
    total: int | None = None,
    payload: bytes = b"abc",
) -> bytes:
    """A ResultChunkV1 envelope; digest and total default to a valid single-chunk transfer."""
    return bytes(
        impl.encode_result_chunk(
            work_item_id,
            request_id,
            item_index,
            hashlib.sha256(payload).digest() if digest is None else digest,
            index,
            count,
            len(payload) if total is None else total,
            payload,
        )
    )


def raw_chunk(**fields: Any) -> bytes:
    """A hand-made envelope (for field types the encoder would never write)."""
    base: dict[str, Any] = {
        "kind": "result_chunk_v1",
        "work_item_id": "req.0",
        "request_id": "req",
        "item_index": 0,
        "transfer_digest": hashlib.sha256(b"abc").digest(),
        "chunk_index": 0,
        "chunk_count": 1,
        "total_bytes": 3,
        "payload": b"abc",
    }
    for key, value in fields.items():
        if value is _DROP:
            del base[key]
        else:
            base[key] = value
    return bytes(msgpack.packb(base, use_bin_type=True))


_DROP = object()


# --- TV-R1..TV-R4 --------------------------------------------------------------------------------


def test_tv_r1_result_chunk(impl: ModuleType) -> None:
    out = impl.encode_result_chunk("req-1.0", "req-1", 0, b"\x07" * 32, 1, 3, 1234, bytes.fromhex("000102ff"))
    assert out == TV_R1
    assert len(out) == 177
    assert ordered(out)[0][0] == "kind"


def test_tv_r1_buffers_accepted(impl: ModuleType) -> None:
    out = impl.encode_result_chunk(
        "req-1.0", "req-1", 0, bytearray(b"\x07" * 32), 1, 3, 1234, memoryview(bytes.fromhex("000102ff"))
    )
    assert out == TV_R1


def test_tv_r1_digest_and_payload_are_bin(impl: ModuleType) -> None:
    decoded = msgpack.unpackb(TV_R1, raw=False)
    assert isinstance(decoded["transfer_digest"], bytes)
    assert isinstance(decoded["payload"], bytes)
    assert decoded["work_item_id"] == f"{decoded['request_id']}.{decoded['item_index']}"


def test_tv_r2_work_result(impl: ModuleType) -> None:
    out = impl.encode_work_result(tv_r2_result())
    assert out == TV_R2
    assert len(out) == 242
    assert [k for k, _ in ordered(out)] == [*BASE_KEYS, "worker_direct"]


@pytest.mark.parametrize(
    ("n", "total_enc", "payload_hdr", "length"),
    [
        (255, "ccff", "c4ff", 423),
        (256, "cd0100", "c50100", 426),
        (65_535, "cdffff", "c5ffff", 65_705),
        (65_536, "ce00010000", "c600010000", 65_710),
    ],
)
def test_tv_r3_boundaries(impl: ModuleType, n: int, total_enc: str, payload_hdr: str, length: int) -> None:
    payload = b"\x07" * n
    out = impl.encode_result_chunk("req.0", "req", 0, b"\x09" * 32, 0, 1, n, payload)
    assert len(out) == length
    assert b"\xabtotal_bytes" + bytes.fromhex(total_enc) + b"\xa7payload" + bytes.fromhex(payload_hdr) in out
    assert out.endswith(bytes.fromhex(payload_hdr) + payload)
    ordinary = msgpack.packb(
        {
            "kind": "result_chunk_v1",
            "work_item_id": "req.0",
            "request_id": "req",
            "item_index": 0,
            "transfer_digest": b"\x09" * 32,
            "chunk_index": 0,
            "chunk_count": 1,
            "total_bytes": n,
            "payload": payload,
        },
        use_bin_type=True,
    )
    assert out == ordinary


def test_tv_r4_gateway_decode() -> None:
    decoded = msgpack.unpackb(TV_R4, raw=False)
    assert len(TV_R4) == 131
    assert decoded["work_item_id"] == "req-9.0"
    assert decoded["request_id"] == "req-9"
    assert decoded["item_index"] == 0
    assert decoded["success"] is False
    assert decoded["result_msgpack"] is None
    assert (decoded["result_msgpack"] or b"") == b""
    assert decoded["error"] == "unsupported operation"
    assert decoded["error_code"] == "inference_error"
    # Every other WorkResult key is absent and defaults on the gateway.
    assert list(decoded) == [
        "work_item_id",
        "request_id",
        "item_index",
        "success",
        "result_msgpack",
        "error",
        "error_code",
    ]


def test_tv_r4_is_not_a_chunk(impl: ModuleType) -> None:
    with pytest.raises(ChunkProtocolError):
        impl.ResultChunkAssembler().feed(TV_R4)


# --- encode_work_result rules --------------------------------------------------------------------


def test_work_result_units_between_fetch_and_worker_direct(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.units = {"input_tokens": 7, "pages": None, "images": 2, "audio_ms": 70_000, "pairs": None}
    out = impl.encode_work_result(result)
    pairs = ordered(out)
    assert out[:3] == b"\xde\x00\x10"  # 16 entries: map16
    assert [k for k, _ in pairs] == [*BASE_KEYS, "units", "worker_direct"]
    units = dict(pairs)["units"]
    assert units == [("input_tokens", 7), ("pages", None), ("images", 2), ("audio_ms", 70_000), ("pairs", None)]


def test_work_result_units_fills_missing_and_drops_unknown(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.units = {"pairs": 3, "gpu_second": 9, "input_tokens": 1}
    units = dict(ordered(impl.encode_work_result(result)))["units"]
    assert units == [("input_tokens", 1), ("pages", None), ("images", None), ("audio_ms", None), ("pairs", 3)]


def test_work_result_units_newer_keys_follow_the_five_when_present(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.units = {"input_tokens": 9, "output_tokens": 12, "content_input_tokens": None}
    units = dict(ordered(impl.encode_work_result(result)))["units"]
    assert units == [
        ("input_tokens", 9),
        ("pages", None),
        ("images", None),
        ("audio_ms", None),
        ("pairs", None),
        ("output_tokens", 12),
    ]


def test_work_result_empty_units_map_still_written(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.units = {}
    units = dict(ordered(impl.encode_work_result(result)))["units"]
    assert [v for _, v in units] == [None] * 5


def test_work_result_executed_hash_after_worker_direct(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.executed_bundle_config_hash = "abc123"
    out = impl.encode_work_result(result)
    assert out == b"\xde\x00\x10" + TV_R2[1:] + b"\xbbexecuted_bundle_config_hash\xa6abc123"


@pytest.mark.parametrize("value", [None, ""])
def test_work_result_executed_hash_omitted_when_empty(impl: ModuleType, value: str | None) -> None:
    result = tv_r2_result()
    result.executed_bundle_config_hash = value
    assert impl.encode_work_result(result) == TV_R2


def test_work_result_retry_after_last(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.units = {"input_tokens": 1}
    result.executed_bundle_config_hash = "h"
    result.retry_after_s = 5
    pairs = ordered(impl.encode_work_result(result))
    assert [k for k, _ in pairs] == [
        *BASE_KEYS,
        "units",
        "worker_direct",
        "executed_bundle_config_hash",
        "retry_after_s",
    ]
    assert pairs[-1] == ("retry_after_s", 5)


def test_work_result_retry_after_without_hash(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.retry_after_s = 300
    out = impl.encode_work_result(result)
    assert out == b"\xde\x00\x10" + TV_R2[1:] + b"\xadretry_after_s\xcd\x01\x2c"


def test_work_result_floats_always_f64(impl: ModuleType) -> None:
    result = WorkResult(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        success=False,
        inference_ms=42,  # an int still goes out as float64
        queue_ms=0.0,
        processing_ms=0.0,
        tokenization_ms=1.5,
        postprocessing_ms=2.25,
        payload_fetch_ms=3.0,
    )
    out = impl.encode_work_result(result)
    assert b"\xacinference_ms\xcb\x40\x45\x00\x00\x00\x00\x00\x00" in out
    assert out.count(b"\xcb") == 6
    assert b"\xa7success\xc2" in out


def test_work_result_error_fields(impl: ModuleType) -> None:
    result = WorkResult(
        work_item_id="r.1", request_id="r", item_index=1, success=False, error="boom", error_code="payload_error"
    )
    decoded = msgpack.unpackb(impl.encode_work_result(result), raw=False)
    assert decoded["result_msgpack"] == b""
    assert decoded["error"] == "boom"
    assert decoded["error_code"] == "payload_error"
    assert decoded["worker_direct"] is False
    assert len(decoded) == 15


def test_work_result_large_payload_bin32(impl: ModuleType) -> None:
    result = result_with_payload(70_000)
    out = impl.encode_work_result(result)
    assert b"\xaeresult_msgpack\xc6\x00\x01\x11\x70" + result.result_msgpack in out


def test_work_result_matches_ordinary_encoder(impl: ModuleType) -> None:
    result = tv_r2_result()
    result.units = {"input_tokens": 300, "pages": 1, "images": None, "audio_ms": 2**33, "pairs": 0}
    result.executed_bundle_config_hash = "x" * 40
    result.retry_after_s = 1
    ordinary = msgpack.packb(
        {
            "work_item_id": "req-1.2",
            "request_id": "req-1",
            "item_index": 2,
            "success": True,
            "result_msgpack": result.result_msgpack,
            "error": None,
            "error_code": None,
            "inference_ms": 12.5,
            "queue_ms": None,
            "processing_ms": 14.0,
            "worker_id": "w-1",
            "tokenization_ms": None,
            "postprocessing_ms": None,
            "payload_fetch_ms": None,
            "units": {"input_tokens": 300, "pages": 1, "images": None, "audio_ms": 2**33, "pairs": 0},
            "worker_direct": True,
            "executed_bundle_config_hash": "x" * 40,
            "retry_after_s": 1,
        },
        use_bin_type=True,
    )
    assert impl.encode_work_result(result) == ordinary


# --- plan_reply ----------------------------------------------------------------------------------


def test_plan_single_when_it_fits(impl: ModuleType) -> None:
    plan = impl.plan_reply(tv_r2_result(), accepts_result_chunks=False, max_payload=1024)
    assert plan.mode == "single"
    assert plan.messages == [TV_R2]
    assert plan.total_bytes == 242
    assert plan.transfer_digest is None


def test_plan_single_at_exact_limit(impl: ModuleType) -> None:
    plan = impl.plan_reply(tv_r2_result(), accepts_result_chunks=True, max_payload=242)
    assert plan.mode == "single"
    assert plan.messages == [TV_R2]


def test_plan_is_frozen(impl: ModuleType) -> None:
    plan = impl.plan_reply(tv_r2_result(), accepts_result_chunks=False, max_payload=1024)
    with pytest.raises((AttributeError, TypeError)):
        plan.mode = "chunked"


def envelope_overhead(impl: ModuleType, result: WorkResult, n: int, total: int) -> int:
    """Actual size of the largest chunk envelope for n chunks, built with the encoder."""
    largest = -(-total // n)
    return len(
        impl.encode_result_chunk(
            result.work_item_id, result.request_id, result.item_index, b"\x00" * 32, n - 1, n, total, b"\x00" * largest
        )
    )


def check_chunked(impl: ModuleType, result: WorkResult, plan: Any, max_payload: int) -> None:
    """Every property of a chunked plan: sizes, balance, minimality, identity, reassembly."""
    encoded = impl.encode_work_result(result)
    total = len(encoded)
    assert plan.mode == "chunked"
    assert plan.total_bytes == total
    assert plan.transfer_digest == hashlib.sha256(encoded).digest()
    n = len(plan.messages)
    assert math.ceil(total / RESULT_CHUNK_TARGET) <= n <= min(MAX_RESULT_CHUNKS, total)
    assert all(len(m) <= max_payload for m in plan.messages)
    # Minimal: n - 1 chunks are below the floor or would not fit.
    if n - 1 >= max(1, math.ceil(total / RESULT_CHUNK_TARGET)):
        assert envelope_overhead(impl, result, n - 1, total) > max_payload
    assembler = impl.ResultChunkAssembler()
    done = None
    for i, message in enumerate(plan.messages):
        env = msgpack.unpackb(message, raw=False)
        assert ordered(message)[0][0] == "kind"
        assert env["kind"] == "result_chunk_v1"
        assert (env["work_item_id"], env["request_id"], env["item_index"]) == (
            result.work_item_id,
            result.request_id,
            result.item_index,
        )
        assert (env["chunk_index"], env["chunk_count"], env["total_bytes"]) == (i, n, total)
        assert env["transfer_digest"] == plan.transfer_digest
        assert env["payload"] == encoded[total * i // n : total * (i + 1) // n]
        done = assembler.feed(message)
        assert (done is None) == (i < n - 1)
    assert done == (result.work_item_id, encoded)
    assert assembler.pending == 0


def test_plan_chunked_small_limit(impl: ModuleType) -> None:
    result = result_with_payload(50_000)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=4_000)
    check_chunked(impl, result, plan, 4_000)
    assert len(plan.messages) > 1


def test_plan_chunked_uses_768k_floor(impl: ModuleType) -> None:
    # 2.5 MB with a generous limit: ceil(total / 768 KiB) = 4 chunks, the first count tried.
    result = result_with_payload(2_500_000)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=1024 * 1024)
    check_chunked(impl, result, plan, 1024 * 1024)
    assert len(plan.messages) == math.ceil(plan.total_bytes / RESULT_CHUNK_TARGET) == 4


def test_plan_chunked_below_floor_grows_n(impl: ModuleType) -> None:
    result = result_with_payload(2_500_000)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=500_000)
    check_chunked(impl, result, plan, 500_000)
    assert len(plan.messages) == 6


def test_plan_chunked_single_chunk_never_fits(impl: ModuleType) -> None:
    # total <= 768 KiB starts at n = 1, whose envelope is bigger than the WorkResult itself.
    result = result_with_payload(10_000)
    total = len(impl.encode_work_result(result))
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=total - 1)
    check_chunked(impl, result, plan, total - 1)
    assert len(plan.messages) == 2


def test_plan_chunked_64_chunks(impl: ModuleType) -> None:
    result = result_with_payload(100_000)
    total = len(impl.encode_work_result(result))
    limit = envelope_overhead(impl, result, 64, total)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=limit)
    check_chunked(impl, result, plan, limit)
    assert len(plan.messages) == 64


def test_plan_chunked_exactly_16_mib(impl: ModuleType) -> None:
    probe = impl.encode_work_result(result_with_payload(0))
    # A result_msgpack over 64 KiB adds 3 bytes of bin32 header over the empty (bin8) case.
    result = result_with_payload(MAX_CHUNKED_RESULT - len(probe) - 3)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=1024 * 1024)
    assert plan.total_bytes == MAX_CHUNKED_RESULT
    assert plan.mode == "chunked"
    assert len(plan.messages) == 22
    assert all(len(m) <= 1024 * 1024 for m in plan.messages)


def compact_message(size: int, limit: int) -> str:
    return (
        f"Encoded result exceeds the transport limit ({size} > {limit} bytes); "
        "reduce the input length or requested output size."
    )


def check_compact(impl: ModuleType, result: WorkResult, plan: Any, limit: int) -> None:
    size = len(impl.encode_work_result(result))
    assert plan.mode == "compact_error"
    assert plan.transfer_digest is None
    assert plan.total_bytes == size
    assert len(plan.messages) == 1
    assert len(plan.messages[0]) <= limit
    expected = WorkResult(
        work_item_id=result.work_item_id,
        request_id=result.request_id,
        item_index=result.item_index,
        success=False,
        result_msgpack=b"",
        error=compact_message(size, limit),
        error_code="PAYLOAD_TOO_LARGE",
        inference_ms=result.inference_ms,
        queue_ms=result.queue_ms,
        processing_ms=result.processing_ms,
        worker_id=result.worker_id,
        tokenization_ms=result.tokenization_ms,
        postprocessing_ms=result.postprocessing_ms,
        payload_fetch_ms=result.payload_fetch_ms,
        units=result.units,
        worker_direct=result.worker_direct,
        executed_bundle_config_hash=result.executed_bundle_config_hash,
        retry_after_s=result.retry_after_s,
    )
    assert plan.messages[0] == impl.encode_work_result(expected)


def test_plan_compact_without_capability(impl: ModuleType) -> None:
    result = result_with_payload(5_000, inference_ms=3.0, executed_bundle_config_hash="h1")
    plan = impl.plan_reply(result, accepts_result_chunks=False, max_payload=1_000)
    check_compact(impl, result, plan, 1_000)
    decoded = msgpack.unpackb(plan.messages[0], raw=False)
    assert decoded["success"] is False
    assert decoded["result_msgpack"] == b""
    assert decoded["error_code"] == "PAYLOAD_TOO_LARGE"
    assert decoded["executed_bundle_config_hash"] == "h1"


def test_plan_compact_over_16_mib(impl: ModuleType) -> None:
    probe = impl.encode_work_result(result_with_payload(0))
    result = result_with_payload(MAX_CHUNKED_RESULT - len(probe) - 3 + 1)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=1024 * 1024)
    assert plan.total_bytes == MAX_CHUNKED_RESULT + 1
    check_compact(impl, result, plan, 1024 * 1024)


def test_plan_compact_when_no_count_fits(impl: ModuleType) -> None:
    # 64 chunks of ~3.1 KB do not fit 1,000 bytes; the compact error does.
    result = result_with_payload(200_000)
    plan = impl.plan_reply(result, accepts_result_chunks=True, max_payload=1_000)
    check_compact(impl, result, plan, 1_000)


def test_plan_payload_too_large(impl: ModuleType) -> None:
    result = result_with_payload(5_000)
    with pytest.raises(PayloadTooLarge) as info:
        impl.plan_reply(result, accepts_result_chunks=True, max_payload=100)
    assert info.value.code == "PAYLOAD_TOO_LARGE"
    assert isinstance(info.value, WireError)


def test_plan_does_not_mutate_result(impl: ModuleType) -> None:
    result = result_with_payload(5_000)
    before = impl.encode_work_result(result)
    impl.plan_reply(result, accepts_result_chunks=False, max_payload=1_000)
    assert impl.encode_work_result(result) == before
    assert result.success is True


@fixture_ok
@given(
    size=st.integers(0, 120_000),
    seed=st.integers(0, 2**32 - 1),
    limit=st.integers(300, 150_000),
    accepts=st.booleans(),
)
def test_plan_reply_property(impl: ModuleType, size: int, seed: int, limit: int, accepts: bool) -> None:
    result = result_with_payload(size, seed)
    total = len(impl.encode_work_result(result))
    try:
        plan = impl.plan_reply(result, accepts_result_chunks=accepts, max_payload=limit)
    except PayloadTooLarge:
        assert total > limit
        return
    assert all(len(m) <= limit for m in plan.messages)
    if total <= limit:
        assert plan.mode == "single"
    elif plan.mode == "chunked":
        assert accepts
        check_chunked(impl, result, plan, limit)
    else:
        assert plan.mode == "compact_error"
        if accepts:
            # Not even 64 (or `total`) chunks fit.
            assert envelope_overhead(impl, result, min(MAX_RESULT_CHUNKS, total), total) > limit
        check_compact(impl, result, plan, limit)


# --- ResultChunkAssembler ------------------------------------------------------------------------


def split(
    impl: ModuleType, data: bytes, n: int, *, work_item_id: str = "req.0", request_id: str = "req"
) -> list[bytes]:
    digest = hashlib.sha256(data).digest()
    total = len(data)
    return [
        bytes(
            impl.encode_result_chunk(
                work_item_id, request_id, 0, digest, i, n, total, data[total * i // n : total * (i + 1) // n]
            )
        )
        for i in range(n)
    ]


def test_assembler_single_chunk(impl: ModuleType) -> None:
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(chunk(impl, payload=b"hello")) == ("req.0", b"hello")
    assert assembler.pending == 0


def test_assembler_out_of_order(impl: ModuleType) -> None:
    data = bytes(range(256)) * 4
    messages = split(impl, data, 5)
    assembler = impl.ResultChunkAssembler()
    for message in [messages[3], messages[0], messages[4], messages[1]]:
        assert assembler.feed(message) is None
    assert assembler.pending == 1
    assert assembler.feed(messages[2]) == ("req.0", data)
    assert assembler.pending == 0


def test_assembler_identical_duplicates(impl: ModuleType) -> None:
    data = b"0123456789"
    messages = split(impl, data, 3)
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(messages[0]) is None
    assert assembler.feed(messages[0]) is None
    assert assembler.feed(messages[1]) is None
    assert assembler.feed(messages[1]) is None
    assert assembler.feed(messages[2]) == ("req.0", data)


def test_assembler_accepts_buffers(impl: ModuleType) -> None:
    # One assembler per buffer type: once an item completed, its later chunks are ignored.
    assert impl.ResultChunkAssembler().feed(memoryview(chunk(impl, payload=b"xy"))) == ("req.0", b"xy")
    assert impl.ResultChunkAssembler().feed(bytearray(chunk(impl, payload=b"xy"))) == ("req.0", b"xy")


def test_assembler_interleaved_items(impl: ModuleType) -> None:
    a = split(impl, b"a" * 100, 2, work_item_id="r.0", request_id="r")
    b_data = b"b" * 90
    digest = hashlib.sha256(b_data).digest()
    b = [impl.encode_result_chunk("r.1", "r", 1, digest, i, 2, 90, b_data[i * 45 : (i + 1) * 45]) for i in range(2)]
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(a[0]) is None
    assert assembler.feed(b[1]) is None
    assert assembler.pending == 2
    assert assembler.feed(a[1]) == ("r.0", b"a" * 100)
    assert assembler.feed(b[0]) == ("r.1", b_data)
    assert assembler.pending == 0


def test_assembler_custom_max_total(impl: ModuleType) -> None:
    assembler = impl.ResultChunkAssembler(max_total=4)
    assert assembler.feed(chunk(impl, payload=b"abcd")) == ("req.0", b"abcd")
    with pytest.raises(ChunkProtocolError):
        assembler.feed(chunk(impl, payload=b"abcde"))


def expect_reject(impl: ModuleType, *messages: bytes) -> Any:
    """Feed all but the last message, expect the last to fail and the item's state to be gone."""
    assembler = impl.ResultChunkAssembler()
    for message in messages[:-1]:
        assert assembler.feed(message) is None
    with pytest.raises(ChunkProtocolError):
        assembler.feed(messages[-1])
    assert assembler.pending == 0
    return assembler


def test_reject_wrong_kind(impl: ModuleType) -> None:
    expect_reject(impl, raw_chunk(kind="ipc_response_chunk_v1"))


def test_reject_missing_kind(impl: ModuleType) -> None:
    expect_reject(impl, raw_chunk(kind=_DROP))


def test_reject_kind_as_bin(impl: ModuleType) -> None:
    expect_reject(impl, raw_chunk(kind=b"result_chunk_v1"))


def test_reject_empty_work_item_id(impl: ModuleType) -> None:
    expect_reject(impl, chunk(impl, work_item_id=""))


def test_reject_empty_request_id(impl: ModuleType) -> None:
    expect_reject(impl, chunk(impl, work_item_id=".0", request_id=""))


@pytest.mark.parametrize(
    ("work_item_id", "request_id", "item_index"),
    [("req.1", "req", 0), ("other.0", "req", 0), ("req0", "req", 0), ("req.00", "req", 0), ("req.0 ", "req", 0)],
)
def test_reject_identity_mismatch(impl: ModuleType, work_item_id: str, request_id: str, item_index: int) -> None:
    expect_reject(impl, chunk(impl, work_item_id=work_item_id, request_id=request_id, item_index=item_index))


def test_reject_item_index_over_u32(impl: ModuleType) -> None:
    expect_reject(impl, raw_chunk(work_item_id=f"req.{2**32}", item_index=2**32))


def test_accept_item_index_u32_max(impl: ModuleType) -> None:
    envelope = raw_chunk(work_item_id=f"req.{2**32 - 1}", item_index=2**32 - 1)
    assert impl.ResultChunkAssembler().feed(envelope) == (f"req.{2**32 - 1}", b"abc")


@pytest.mark.parametrize("length", [0, 31, 33])
def test_reject_digest_length(impl: ModuleType, length: int) -> None:
    expect_reject(impl, chunk(impl, digest=b"\x01" * length))


@pytest.mark.parametrize("count", [0, 65])
def test_reject_chunk_count_bounds(impl: ModuleType, count: int) -> None:
    expect_reject(impl, chunk(impl, index=0, count=count))


@pytest.mark.parametrize(("index", "count"), [(1, 1), (3, 3), (64, 64)])
def test_reject_index_not_below_count(impl: ModuleType, index: int, count: int) -> None:
    expect_reject(impl, chunk(impl, index=index, count=count, total=1000))


def test_reject_total_zero(impl: ModuleType) -> None:
    expect_reject(impl, chunk(impl, total=0, payload=b""))


def test_reject_total_over_16_mib(impl: ModuleType) -> None:
    expect_reject(impl, chunk(impl, index=0, count=2, total=MAX_CHUNKED_RESULT + 1))


def test_accept_total_exactly_16_mib_first_chunk(impl: ModuleType) -> None:
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(chunk(impl, index=0, count=2, total=MAX_CHUNKED_RESULT)) is None
    assert assembler.pending == 1


def test_reject_payload_longer_than_total(impl: ModuleType) -> None:
    expect_reject(impl, chunk(impl, total=2, payload=b"abc"))


def test_reject_different_payload_for_received_index(impl: ModuleType) -> None:
    digest = hashlib.sha256(b"abcdef").digest()
    first = chunk(impl, digest=digest, index=0, count=2, total=6, payload=b"abc")
    other = chunk(impl, digest=digest, index=0, count=2, total=6, payload=b"abX")
    expect_reject(impl, first, other)


def test_new_digest_at_a_nonzero_index_is_a_stale_chunk(impl: ModuleType) -> None:
    # §9.4: only index 0 of a new digest may replace a transfer; elsewhere it is ignored, not fatal.
    first = chunk(impl, digest=b"\x01" * 32, index=0, count=2, total=6, payload=b"abc")
    second = chunk(impl, digest=b"\x02" * 32, index=1, count=2, total=6, payload=b"def")
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(first) is None
    assert assembler.feed(second) is None
    assert assembler.pending == 1  # the first transfer is still waiting for its index 1


def test_reject_count_conflict(impl: ModuleType) -> None:
    first = chunk(impl, digest=b"\x01" * 32, index=0, count=2, total=6, payload=b"abc")
    second = chunk(impl, digest=b"\x01" * 32, index=1, count=3, total=6, payload=b"de")
    expect_reject(impl, first, second)


def test_reject_total_conflict(impl: ModuleType) -> None:
    first = chunk(impl, digest=b"\x01" * 32, index=0, count=2, total=6, payload=b"abc")
    second = chunk(impl, digest=b"\x01" * 32, index=1, count=2, total=7, payload=b"def")
    expect_reject(impl, first, second)


def test_reject_accumulated_short_of_total(impl: ModuleType) -> None:
    data = b"abcdef"
    digest = hashlib.sha256(data).digest()
    first = chunk(impl, digest=digest, index=0, count=2, total=10, payload=b"abc")
    second = chunk(impl, digest=digest, index=1, count=2, total=10, payload=b"def")
    expect_reject(impl, first, second)


def test_reject_accumulated_over_total(impl: ModuleType) -> None:
    # Each payload fits total on its own; together they exceed it (memory stays bounded by total).
    digest = b"\x01" * 32
    first = chunk(impl, digest=digest, index=0, count=3, total=5, payload=b"abcd")
    second = chunk(impl, digest=digest, index=1, count=3, total=5, payload=b"efgh")
    expect_reject(impl, first, second)


def test_reject_digest_mismatch(impl: ModuleType) -> None:
    expect_reject(impl, chunk(impl, digest=hashlib.sha256(b"other").digest(), payload=b"abc"))


def test_reject_digest_mismatch_multi_chunk(impl: ModuleType) -> None:
    messages = split(impl, b"abcdef", 2)
    tampered = chunk(impl, digest=hashlib.sha256(b"abcdef").digest(), index=1, count=2, total=6, payload=b"deX")
    expect_reject(impl, messages[0], tampered)


def test_reject_not_msgpack(impl: ModuleType) -> None:
    with pytest.raises(ProtocolError):
        impl.ResultChunkAssembler().feed(b"\xc1")


def test_reject_trailing_bytes(impl: ModuleType) -> None:
    with pytest.raises(ProtocolError):
        impl.ResultChunkAssembler().feed(chunk(impl) + b"\x00")


@pytest.mark.parametrize("value", [[1, 2], "result_chunk_v1", 7, None])
def test_reject_not_a_map(impl: ModuleType, value: Any) -> None:
    with pytest.raises(ProtocolError):
        impl.ResultChunkAssembler().feed(msgpack.packb(value, use_bin_type=True))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("work_item_id", b"req.0"),
        ("request_id", 5),
        ("item_index", "0"),
        ("item_index", -1),
        ("transfer_digest", "x" * 32),
        ("chunk_index", 0.0),
        ("chunk_count", None),
        ("total_bytes", "3"),
        ("payload", "abc"),
    ],
)
def test_reject_wrong_field_type(impl: ModuleType, key: str, value: Any) -> None:
    expect_reject(impl, raw_chunk(**{key: value}))


@pytest.mark.parametrize(
    "key",
    [
        "work_item_id",
        "request_id",
        "item_index",
        "transfer_digest",
        "chunk_index",
        "chunk_count",
        "total_bytes",
        "payload",
    ],
)
def test_reject_missing_field(impl: ModuleType, key: str) -> None:
    expect_reject(impl, raw_chunk(**{key: _DROP}))


def test_unknown_keys_ignored(impl: ModuleType) -> None:
    assert impl.ResultChunkAssembler().feed(raw_chunk(extra=[1, 2, 3])) == ("req.0", b"abc")


def test_key_order_independent(impl: ModuleType) -> None:
    env = msgpack.unpackb(chunk(impl), raw=False)
    reordered = msgpack.packb(dict(reversed(list(env.items()))), use_bin_type=True)
    assert impl.ResultChunkAssembler().feed(reordered) == ("req.0", b"abc")


def test_state_dropped_after_error_then_fresh_transfer(impl: ModuleType) -> None:
    messages = split(impl, b"abcdefgh", 2)
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(messages[0]) is None
    conflicting = msgpack.unpackb(messages[0])
    conflicting["payload"] = b"ABCD"  # same digest and index, other bytes: a real conflict
    with pytest.raises(ChunkProtocolError):
        assembler.feed(msgpack.packb(conflicting))
    assert assembler.pending == 0
    # The earlier chunk 0 is gone: chunk 1 alone starts a new, incomplete transfer.
    assert assembler.feed(messages[1]) is None
    assert assembler.feed(messages[0]) == ("req.0", b"abcdefgh")


def test_error_on_one_item_keeps_others(impl: ModuleType) -> None:
    a = split(impl, b"a" * 10, 2, work_item_id="r.0", request_id="r")
    assembler = impl.ResultChunkAssembler()
    assert assembler.feed(a[0]) is None
    with pytest.raises(ChunkProtocolError):
        assembler.feed(chunk(impl, work_item_id="s.0", request_id="s", digest=b"\x00" * 32))
    assert assembler.pending == 1
    assert assembler.feed(a[1]) == ("r.0", b"a" * 10)


@fixture_ok
@given(
    layout=st.tuples(st.integers(1, 20_000), st.integers(1, 64), st.integers(0, 2**32 - 1)),
    order=st.randoms(use_true_random=False),
    dupes=st.lists(st.integers(0, 63), max_size=8),
)
def test_assembler_any_order_with_duplicates(
    impl: ModuleType, layout: tuple[int, int, int], order: Any, dupes: list[int]
) -> None:
    size, n, seed = layout
    n = min(n, size)
    data = np.random.default_rng(seed).bytes(size)
    messages = split(impl, data, n)
    # One chunk (and none of its duplicates) goes last, so the completion point is known.
    last = messages[seed % n]
    sequence = [m for m in messages + [messages[d % n] for d in dupes] if m != last]
    order.shuffle(sequence)
    assembler = impl.ResultChunkAssembler()
    for message in sequence:
        assert assembler.feed(message) is None
    assert assembler.feed(last) == ("req.0", data)
    assert assembler.pending == 0


# --- §9.4 retry handling: a redelivered item is chunked again with a new digest -------------------


def _chunks(impl: ModuleType, whole: bytes, n: int) -> list[bytes]:
    import hashlib

    digest = hashlib.sha256(whole).digest()
    total = len(whole)
    return [
        impl.encode_result_chunk("rr.0", "rr", 0, digest, i, n, total, whole[total * i // n : total * (i + 1) // n])
        for i in range(n)
    ]


def test_retry_with_a_new_digest_replaces_the_transfer_at_index_zero(impl: ModuleType) -> None:
    first = _chunks(impl, b"first attempt " * 20, 3)
    second = _chunks(impl, b"second attempt, other bytes " * 20, 4)
    asm = impl.ResultChunkAssembler()
    assert asm.feed(first[0]) is None and asm.feed(first[1]) is None  # the first attempt broke off
    assert asm.feed(second[2]) is None  # a new digest at index 2: stale until index 0 arrives
    assert asm.feed(second[0]) is None  # index 0 of the new digest replaces the transfer
    assert asm.feed(first[2]) is None  # the retired digest is ignored, not an error
    assert asm.feed(second[1]) is None and asm.feed(second[2]) is None
    assert asm.feed(second[3]) == ("rr.0", b"second attempt, other bytes " * 20)
    assert asm.pending == 0


def test_chunks_after_completion_are_ignored(impl: ModuleType) -> None:
    whole = b"payload " * 30
    asm = impl.ResultChunkAssembler()
    done = [asm.feed(c) for c in _chunks(impl, whole, 2)]
    assert done[-1] == ("rr.0", whole)
    assert all(asm.feed(c) is None for c in _chunks(impl, b"late retry " * 30, 2))
    assert asm.pending == 0


def test_same_digest_new_layout_restarts_at_index_zero_and_conflicts_elsewhere(impl: ModuleType) -> None:
    whole = b"0123456789" * 10
    two, four = _chunks(impl, whole, 2), _chunks(impl, whole, 4)
    asm = impl.ResultChunkAssembler()
    assert asm.feed(two[0]) is None
    assert asm.feed(four[0]) is None  # same digest, new layout at index 0: restart
    assert asm.feed(two[1]) is None  # the retired layout is ignored
    for chunk in four[1:3]:
        assert asm.feed(chunk) is None
    assert asm.feed(four[3]) == ("rr.0", whole)
    fresh = impl.ResultChunkAssembler()
    assert fresh.feed(two[0]) is None
    with pytest.raises(ChunkProtocolError):
        fresh.feed(four[1])  # a new layout at a non-zero index is a conflict
