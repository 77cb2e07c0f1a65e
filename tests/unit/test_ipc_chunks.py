# SPDX-License-Identifier: Apache-2.0
"""IpcResponseChunkV1 reassembly and the response budget (wire-protocol §6; TV-I6..TV-I9)."""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar import errors
from sie_sidecar.wire.limits import (
    DEFAULT_RESPONSE_BUDGET,
    MAX_CHUNK_FRAME,
    MAX_CHUNK_PAYLOAD,
    MAX_CHUNKED_RESPONSE,
    MAX_FRAME,
    MAX_RESPONSE_CHUNKS,
    MiB,
)

FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

TV_I6_BODY = bytes.fromhex(
    "88a776657273696f6e01aa726571756573745f6964a27231af7472616e736665725f646967657374c420c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225ab6368756e6b5f696e64657800ab6368756e6b5f636f756e7402ab746f74616c5f62797465731ca77061796c6f6164c40a616e2065786163742073a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"
)
TV_I7_BODY = bytes.fromhex(
    "88a776657273696f6e01aa726571756573745f6964a27231af7472616e736665725f646967657374c420c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225ab6368756e6b5f696e64657801ab6368756e6b5f636f756e7402ab746f74616c5f62797465731ca77061796c6f6164c412657269616c697a656420726573706f6e7365a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"
)
TV_I6_ORIGINAL = b"an exact serialized response"
TV_I6_DIGEST = bytes.fromhex("c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225")

TV_I8_ORIGINAL = b"0123456789"
TV_I8_DIGEST = hashlib.sha256(TV_I8_ORIGINAL).digest()


def relaxed(impl: ModuleType, legacy_ceiling: int = 4) -> Any:
    """The unit-test limits: production bounds except a tiny legacy ceiling (TV-I6/TV-I7)."""
    return impl.ChunkLimits(
        legacy_ceiling=legacy_ceiling,
        max_chunk_payload=MAX_CHUNK_PAYLOAD,
        max_chunk_frame=MAX_CHUNK_FRAME,
        max_total=MAX_CHUNKED_RESPONSE,
        max_chunks=MAX_RESPONSE_CHUNKS,
    )


def small(impl: ModuleType) -> Any:
    """Tight limits to reach every bound with a few bytes."""
    return impl.ChunkLimits(legacy_ceiling=4, max_chunk_payload=8, max_chunk_frame=4096, max_total=64, max_chunks=4)


def chunk_body(  # noqa: PLR0917 - mirrors the frame's field order
    request_id: str,
    digest: bytes,
    index: int,
    count: int,
    total: int,
    payload: bytes,
    *,
    version: int = 1,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """A chunk frame body with the keys in producer order (§6.2)."""
    fields: dict[str, Any] = {
        "version": version,
        "request_id": request_id,
        "transfer_digest": digest,
        "chunk_index": index,
        "chunk_count": count,
        "total_bytes": total,
        "payload": payload,
    }
    fields.update(extra or {})
    fields["kind"] = "ipc_response_chunk_v1"
    return bytes(msgpack.packb(fields, use_bin_type=True))


def tv_i8(impl: ModuleType, index: int, **kw: Any) -> Any:
    """A TV-I8 chunk of "0123456789" split 5 + 5, decoded; keywords override the fields."""
    args: dict[str, Any] = {
        "request_id": "r1",
        "digest": TV_I8_DIGEST,
        "index": index,
        "count": 2,
        "total": 10,
        "payload": TV_I8_ORIGINAL[index * 5 : index * 5 + 5],
    }
    args.update(kw)
    return impl.decode_response(chunk_body(**args))


def response_bytes(request_id: str, body: dict[str, Any]) -> bytes:
    env = {"version": 1, "request_id": request_id, "ok": True, "body": body, "error": None}
    return bytes(msgpack.packb(env, use_bin_type=True))


def split_frames(impl: ModuleType, request_id: str, data: bytes, sizes: list[int]) -> list[Any]:
    digest = hashlib.sha256(data).digest()
    frames, pos = [], 0
    for i, size in enumerate(sizes):
        frames.append(
            impl.decode_response(chunk_body(request_id, digest, i, len(sizes), len(data), data[pos : pos + size]))
        )
        pos += size
    assert pos == len(data)
    return frames


def assert_failed(budget: Any, *, protocol_error: int = 1, budget_rejected: int = 0) -> None:
    assert budget.reserved == 0
    assert budget.protocol_error == protocol_error
    assert budget.budget_rejected == budget_rejected
    assert budget.completed == 0


# --- limits and the budget object ---------------------------------------------------------------


def test_production_limits(impl: ModuleType) -> None:
    limits = impl.PRODUCTION_LIMITS
    assert limits.legacy_ceiling == MAX_FRAME == 32 * MiB
    assert limits.max_chunk_payload == 4 * MiB
    assert limits.max_chunk_frame == 4 * MiB + 4096
    assert limits.max_total == 128 * MiB
    assert limits.max_chunks == 64
    with pytest.raises(AttributeError):
        limits.max_total = 1


def test_process_budget_singleton(impl: ModuleType) -> None:
    budget = impl.response_budget()
    assert budget is impl.response_budget()
    assert budget.capacity == DEFAULT_RESPONSE_BUDGET == 2 * 128 * MiB + 4096


def test_default_assembler_uses_process_budget(impl: ModuleType) -> None:
    budget = impl.response_budget()
    before = budget.reserved
    asm = impl.IpcChunkAssembler("r1", limits=relaxed(impl))
    assert asm.feed(impl.decode_response(TV_I6_BODY)) is None
    assert budget.reserved == before + 4152
    asm.abort()
    assert budget.reserved == before


def test_fresh_budget(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=1000)
    assert (budget.capacity, budget.reserved) == (1000, 0)
    assert (budget.completed, budget.protocol_error, budget.budget_rejected) == (0, 0, 0)
    assert impl.ResponseBudget().capacity == DEFAULT_RESPONSE_BUDGET


# --- TV-I6 / TV-I7: a two-frame transfer --------------------------------------------------------


def test_tv_i6_i7_frames_are_what_the_producer_writes() -> None:
    assert chunk_body("r1", TV_I6_DIGEST, 0, 2, 28, b"an exact s") == TV_I6_BODY
    assert chunk_body("r1", TV_I6_DIGEST, 1, 2, 28, b"erialized response") == TV_I7_BODY
    assert hashlib.sha256(TV_I6_ORIGINAL).digest() == TV_I6_DIGEST


def test_tv_i6_i7_reassembly(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert not asm.in_progress
    assert asm.feed(impl.decode_response(TV_I6_BODY)) is None
    assert asm.in_progress
    assert budget.reserved == 2 * 28 + 4096 == 4152
    done = asm.feed(impl.decode_response(TV_I7_BODY))
    assert done is not None
    assert not asm.in_progress
    assert bytes(done) == TV_I6_ORIGINAL
    assert bytes(done.view) == TV_I6_ORIGINAL
    assert done.view.readonly
    assert len(done) == done.nbytes == 28
    assert done.reservation == 4152
    assert budget.completed == 1
    # Held until the assembled response is dropped.
    assert budget.reserved == 4152
    done.release()
    assert budget.reserved == 0
    assert done.reservation == 0
    done.release()
    assert budget.reserved == 0
    assert (budget.completed, budget.protocol_error, budget.budget_rejected) == (1, 0, 0)


def test_tv_i6_rejected_under_production_limits(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget)
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(impl.decode_response(TV_I6_BODY))
    assert_failed(budget)


def test_tv_i6_i7_through_the_splitter(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    stream = impl.encode_frame(TV_I6_BODY) + impl.encode_frame(TV_I7_BODY)
    splitter = impl.FrameSplitter()
    results = []
    for i in range(0, len(stream), 7):
        for body in splitter.feed(stream[i : i + 7]):
            results.append(asm.feed(impl.decode_response(body)))
    assert results[0] is None
    with results[1] as done:
        assert bytes(done) == TV_I6_ORIGINAL
        assert budget.reserved == 4152
    assert budget.reserved == 0


# --- TV-I8: rejection cases, one test each ------------------------------------------------------


def test_tv_i8_duplicate(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert asm.feed(tv_i8(impl, 0)) is None
    assert budget.reserved == 4116
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0))
    assert not asm.in_progress
    assert_failed(budget)


def test_tv_i8_missing_first(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 1))
    assert_failed(budget)


def test_tv_i8_layout_change(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert asm.feed(tv_i8(impl, 0, count=2)) is None
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 1, count=3))
    assert_failed(budget)


def test_tv_i8_bad_digest(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0, count=1, payload=TV_I8_ORIGINAL, digest=bytes(32)))
    assert_failed(budget)


def test_tv_i8_over_total(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=0)  # any reservation attempt would be a budget refusal
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0, count=1, total=128 * MiB + 1, payload=TV_I8_ORIGINAL))
    assert_failed(budget)


def test_tv_i8_over_count(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=0)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0, count=65, total=1000))
    assert_failed(budget)


def test_tv_i8_production_total_at_legacy_ceiling(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=0)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=impl.PRODUCTION_LIMITS)
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0, count=8, total=32 * MiB))
    assert_failed(budget)


def test_tv_i8_production_payload_too_large(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=0)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=impl.PRODUCTION_LIMITS)
    frame = tv_i8(impl, 0, count=8, total=32 * MiB + 1, payload=bytes(4 * MiB + 1))
    assert frame.frame_len <= MAX_CHUNK_FRAME  # the frame size is fine: the payload bound fires
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(frame)
    assert_failed(budget)


def test_tv_i8_production_padded_frame(impl: ModuleType) -> None:
    def frame(padding: int) -> Any:
        body = chunk_body(
            "r1",
            TV_I8_DIGEST,
            0,
            9,
            32 * MiB + 1,
            bytes(4 * MiB),
            extra={"padding": bytes(padding)} if padding else None,
        )
        return impl.decode_response(body)

    # Without the padding the same chunk is acceptable and takes a reservation.
    ok_budget = impl.ResponseBudget()
    ok = impl.IpcChunkAssembler("r1", budget=ok_budget, limits=impl.PRODUCTION_LIMITS)
    assert ok.feed(frame(0)) is None
    assert ok_budget.reserved == 2 * (32 * MiB + 1) + 4096
    ok.abort()
    assert ok_budget.reserved == 0

    budget = impl.ResponseBudget(capacity=0)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=impl.PRODUCTION_LIMITS)
    padded = frame(8192)
    assert padded.frame_len > MAX_CHUNK_FRAME
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(padded)
    assert_failed(budget)


def test_tv_i8_budget(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=2 * 10 + 4096)  # sized for one transfer
    first = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    second = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert first.feed(tv_i8(impl, 0)) is None
    with pytest.raises(errors.BudgetExceeded):
        second.feed(tv_i8(impl, 0))
    assert not second.in_progress
    assert budget.budget_rejected == 1
    assert budget.protocol_error == 0
    assert budget.reserved == 4116
    done = first.feed(tv_i8(impl, 1))
    assert done is not None
    assert bytes(done) == TV_I8_ORIGINAL
    done.release()
    assert budget.reserved == 0
    # Once the first is dropped the second transfer can start (on a fresh assembler).
    retry = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert retry.feed(tv_i8(impl, 0)) is None
    assert budget.reserved == 4116
    with retry.feed(tv_i8(impl, 1)) as again:
        assert bytes(again) == TV_I8_ORIGINAL
    assert budget.reserved == 0
    assert (budget.completed, budget.protocol_error, budget.budget_rejected) == (2, 0, 1)


# --- TV-I9: a chunk-kind envelope, a non-v1 kind ------------------------------------------------


def test_tv_i9b_future_kind_passes_through_as_legacy(impl: ModuleType) -> None:
    raw = bytes(
        msgpack.packb(
            {
                "version": 1,
                "request_id": "r-chunk",
                "ok": True,
                "body": {"value": 1},
                "error": None,
                "kind": "future_response_v2",
            }
        )
    )
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r-chunk", budget=budget, limits=relaxed(impl))
    env = impl.decode_response(raw)
    done = asm.feed(env)
    assert done is not None
    assert done.reservation == 0
    assert done.decode() == env
    assert bytes(impl.response_body(done.decode(), "r-chunk")) == bytes.fromhex("81a576616c756501")
    done.release()
    assert (budget.reserved, budget.completed, budget.protocol_error) == (0, 0, 0)
    assert not asm.in_progress


# --- the other §6.5 rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"version": 2}, "version"),
        ({"request_id": "r2"}, "request id"),
        ({"count": 0}, "count 0"),
        ({"count": 5}, "count over max_chunks"),
        ({"count": 3, "total": 2, "payload": b"ab"}, "count over total"),
        ({"total": 4, "payload": b"abcd"}, "total at the legacy ceiling"),
        ({"total": 65, "payload": b"a"}, "total over max_total"),
        ({"payload": b""}, "empty payload"),
        ({"payload": b"123456789"}, "payload over max_chunk_payload"),
        ({"total": 6, "payload": b"1234567"}, "payload over total"),
        ({"extra": {"pad": bytes(5000)}}, "frame over max_chunk_frame"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bounds(impl: ModuleType, overrides: dict[str, Any], why: str) -> None:
    budget = impl.ResponseBudget(capacity=0)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=small(impl))
    args: dict[str, Any] = {"request_id": "r1", "digest": TV_I8_DIGEST, "index": 0, "count": 2, "total": 10}
    args["payload"] = b"01234"
    overrides = dict(overrides)  # the parametrize dict is shared by both implementations' runs
    extra = overrides.pop("extra", None)
    args.update(overrides)
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(impl.decode_response(chunk_body(**args, extra=extra)))
    assert_failed(budget)


def test_bounds_accept_the_edges(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=small(impl))
    data = bytes(range(5))  # total 5 > ceiling 4; count 4 <= max; payloads 1..2
    frames = split_frames(impl, "r1", data, [2, 1, 1, 1])
    results = [asm.feed(f) for f in frames]
    assert results[:3] == [None, None, None]
    with results[3] as done:
        assert bytes(done) == data


def test_bounds_checked_on_later_frames(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=small(impl))
    assert asm.feed(tv_i8(impl, 0)) is None
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 1, payload=b""))
    assert_failed(budget)


@pytest.mark.parametrize(
    ("second", "why"),
    [
        ({"index": 2, "count": 3}, "index skipped (count also changed)"),
        ({"index": 2}, "index out of range"),
        ({"total": 11, "payload": b"567890"}, "total changed"),
        ({"digest": bytes(32)}, "digest changed"),
        ({"request_id": "r2"}, "request id changed"),
        ({"payload": b"567890"}, "over-accumulated"),
        ({"payload": b"5678"}, "short at the last index"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_sequence_rules(impl: ModuleType, second: dict[str, Any], why: str) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert asm.feed(tv_i8(impl, 0)) is None
    second = dict(second)  # the parametrize dict is shared by both implementations' runs
    index = second.pop("index", 1)
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, index, **second))
    assert not asm.in_progress
    assert_failed(budget)


def test_total_reached_before_last_index(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert asm.feed(tv_i8(impl, 0, count=3)) is None
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 1, count=3))
    assert_failed(budget)


def test_first_frame_carries_everything(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0, payload=TV_I8_ORIGINAL))  # count 2 but total reached at index 0
    assert_failed(budget)


def test_envelope_mid_transfer(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert asm.feed(tv_i8(impl, 0)) is None
    env = impl.decode_response(response_bytes("r1", {}))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(env)
    assert not asm.in_progress
    assert_failed(budget)


def test_failed_assembler_stays_dead(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 1))
    with pytest.raises(errors.ChunkProtocolError):
        asm.feed(tv_i8(impl, 0))
    assert budget.reserved == 0
    assert budget.completed == 0


def test_abort_releases(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    asm.abort()  # idle: nothing to release
    assert budget.reserved == 0
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    assert asm.feed(tv_i8(impl, 0)) is None
    assert budget.reserved == 4116
    asm.abort()
    assert not asm.in_progress
    assert budget.reserved == 0
    asm.abort()
    assert budget.reserved == 0
    assert (budget.completed, budget.protocol_error, budget.budget_rejected) == (0, 0, 0)


def test_legacy_envelope_on_idle_assembler(impl: ModuleType) -> None:
    budget = impl.ResponseBudget(capacity=0)
    asm = impl.IpcChunkAssembler("w-1", budget=budget)
    env = impl.decode_response(response_bytes("w-1", {"a": 1}))
    with asm.feed(env) as done:
        assert done.reservation == 0
        decoded = done.decode()
        assert decoded == env
        assert impl.decode_body(impl.response_body(decoded, "w-1")) == {"a": 1}
    assert (budget.reserved, budget.completed, budget.protocol_error, budget.budget_rejected) == (0, 0, 0, 0)


# --- AssembledResponse.decode ---------------------------------------------------------------------


def test_decode_reassembled_envelope(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    data = response_bytes("w-7", {"payload": bytes(range(256)) * 4, "n": 3})
    asm = impl.IpcChunkAssembler("w-7", budget=budget, limits=relaxed(impl, legacy_ceiling=100))
    frames = split_frames(impl, "w-7", data, [300, 300, 300, len(data) - 900])
    results = [asm.feed(f) for f in frames]
    done = results[-1]
    assert done is not None
    reservation = 2 * len(data) + 4096
    with done:
        env = done.decode()
        assert isinstance(env, impl.ResponseEnvelope)
        body = impl.response_body(env, "w-7")
        assert impl.decode_body(body) == {"payload": bytes(range(256)) * 4, "n": 3}
        assert done.reservation == reservation
        assert budget.reserved == reservation
    assert budget.reserved == 0
    assert (budget.completed, budget.protocol_error) == (1, 0)


def test_decode_reassembled_chunk_is_an_error(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    (done,) = [asm.feed(f) for f in split_frames(impl, "r1", TV_I6_BODY, [len(TV_I6_BODY)])]
    assert done is not None
    assert budget.reserved == 2 * 160 + 4096
    with pytest.raises(errors.ChunkProtocolError):
        done.decode()
    assert budget.reserved == 0
    assert budget.protocol_error == 1


def test_decode_undecodable_reassembly(impl: ModuleType) -> None:
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=relaxed(impl))
    asm.feed(impl.decode_response(TV_I6_BODY))
    done = asm.feed(impl.decode_response(TV_I7_BODY))
    assert done is not None
    with pytest.raises(errors.DecodeError):
        done.decode()
    assert budget.reserved == 0
    assert budget.protocol_error == 1


# --- properties and floods ------------------------------------------------------------------------


@FIXTURE
@given(data=st.data())
def test_random_payload_random_split(impl: ModuleType, data: st.DataObject) -> None:
    payload = data.draw(st.binary(min_size=1, max_size=2000), label="payload")
    count = data.draw(st.integers(1, min(64, len(payload))), label="count")
    cuts: list[int] = []
    if count > 1:
        cuts = sorted(data.draw(st.sets(st.integers(1, len(payload) - 1), min_size=count - 1, max_size=count - 1)))
    bounds = [0, *cuts, len(payload)]
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    limits = impl.ChunkLimits(
        legacy_ceiling=0, max_chunk_payload=max(sizes), max_chunk_frame=4096, max_total=2000, max_chunks=64
    )
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("w-1", budget=budget, limits=limits)
    frames = split_frames(impl, "w-1", payload, sizes)
    for frame in frames[:-1]:
        assert asm.feed(frame) is None
        assert budget.reserved == 2 * len(payload) + 4096
    done = asm.feed(frames[-1])
    assert done is not None
    assert bytes(done) == payload
    done.release()
    assert budget.reserved == 0
    assert budget.completed == 1


def test_flood_interleaved(impl: ModuleType) -> None:
    """50 transfers interleaved at random against one budget sized for five."""
    rng = random.Random(1234)
    per = 2 * 64 + 4096
    budget = impl.ResponseBudget(capacity=5 * per)
    limits = relaxed(impl, legacy_ceiling=8)
    transfers = []
    for n in range(50):
        data = rng.randbytes(64)
        transfers.append(
            (
                impl.IpcChunkAssembler(f"w-{n}", budget=budget, limits=limits),
                split_frames(impl, f"w-{n}", data, [16] * 4),
                data,
            )
        )
    positions = [0] * 50
    pending = list(range(50))
    refused = completed = 0
    while pending:
        n = rng.choice(pending)
        asm, frames, data = transfers[n]
        try:
            done = asm.feed(frames[positions[n]])
        except errors.BudgetExceeded:
            refused += 1
            pending.remove(n)
            continue
        positions[n] += 1
        assert budget.reserved <= budget.capacity
        if done is not None:
            assert bytes(done) == data
            if rng.random() < 0.5:
                done.release()
            completed += 1
            pending.remove(n)
        assert budget.reserved <= budget.capacity
    assert refused > 0
    assert refused + completed == 50
    assert budget.budget_rejected == refused
    assert budget.completed == completed
    assert budget.protocol_error == 0
    del done, transfers  # unreleased responses give their reservation back when dropped
    assert budget.reserved == 0


def test_flood_threads(impl: ModuleType) -> None:
    """50 threads race for one budget; the reservation never exceeds its capacity."""
    per = 2 * 4096 + 4096
    budget = impl.ResponseBudget(capacity=7 * per)
    limits = relaxed(impl, legacy_ceiling=8)
    barrier = threading.Barrier(50)
    lock = threading.Lock()
    outcome = {"refused": 0, "completed": 0, "max_reserved": 0, "failures": 0}

    def observe() -> None:
        reserved = budget.reserved
        with lock:
            outcome["max_reserved"] = max(outcome["max_reserved"], reserved)

    def worker(n: int) -> None:
        data = random.Random(n).randbytes(4096)
        frames = split_frames(impl, f"w-{n}", data, [1024] * 4)
        asm = impl.IpcChunkAssembler(f"w-{n}", budget=budget, limits=limits)
        barrier.wait()
        try:
            for frame in frames:
                done = asm.feed(frame)
                observe()
                time.sleep(0)
        except errors.BudgetExceeded:
            with lock:
                outcome["refused"] += 1
            return
        except Exception:  # pragma: no cover - reported by the assertion below
            with lock:
                outcome["failures"] += 1
            raise
        assert done is not None
        ok = bytes(done) == data
        done.release()
        observe()
        with lock:
            outcome["completed" if ok else "failures"] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcome["failures"] == 0
    assert outcome["max_reserved"] <= budget.capacity
    assert outcome["refused"] + outcome["completed"] == 50
    assert budget.budget_rejected == outcome["refused"]
    assert budget.completed == outcome["completed"]
    assert budget.reserved == 0


@pytest.mark.slow
def test_128_mib_response(impl: ModuleType) -> None:
    total = 128 * MiB
    head = response_bytes("w-1", {"data": b""})
    # {"data": bin32(n)} instead of bin8(0): three more header bytes.
    n = total - (len(head) + 3)
    data = random.Random(7).randbytes(1 * MiB) * 128
    data = data[:n]
    response = (
        head[: head.index(b"\xc4\x00")] + b"\xc6" + n.to_bytes(4, "big") + data + head[head.index(b"\xc4\x00") + 2 :]
    )
    assert len(response) == total
    digest = hashlib.sha256(response).digest()

    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("w-1", budget=budget, limits=impl.PRODUCTION_LIMITS)
    splitter = impl.FrameSplitter()
    done = None
    for i in range(32):
        body = chunk_body("w-1", digest, i, 32, total, response[i * 4 * MiB : (i + 1) * 4 * MiB])
        (frame,) = splitter.feed(impl.encode_frame(body))
        chunk = impl.decode_response(frame)
        assert chunk.frame_len <= MAX_CHUNK_FRAME
        done = asm.feed(chunk)
        assert budget.reserved == 2 * total + 4096 == DEFAULT_RESPONSE_BUDGET
        if i == 0:
            # The budget is full: nothing else above the legacy ceiling fits now.
            other = impl.IpcChunkAssembler("w-2", budget=budget, limits=impl.PRODUCTION_LIMITS)
            with pytest.raises(errors.BudgetExceeded):
                other.feed(impl.decode_response(chunk_body("w-2", digest, 0, 9, 32 * MiB + 1, b"x")))
    assert done is not None
    assert done.nbytes == total
    assert done.reservation == 2 * total + 4096
    with done:
        env = done.decode()
        assert impl.decode_body(impl.response_body(env, "w-1"))["data"] == data
        assert budget.reserved == 2 * total + 4096
    assert budget.reserved == 0
    assert (budget.completed, budget.protocol_error, budget.budget_rejected) == (1, 0, 1)
