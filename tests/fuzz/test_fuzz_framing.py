# SPDX-License-Identifier: Apache-2.0
"""Fuzz the framing and chunk-reassembly path: only `WireError` subclasses may escape.

Bounded by the hypothesis profile (200 examples by default; `HYPOTHESIS_PROFILE=fuzz` for long runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar import errors

from .strategies import mutated

pytestmark = pytest.mark.fuzz
FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

DATA = b"0123456789abcdefghij"
DIGEST = hashlib.sha256(DATA).digest()


def chunk(index: int, payload: bytes, count: int = 2) -> bytes:
    fields: dict[str, Any] = {
        "version": 1,
        "request_id": "r1",
        "transfer_digest": DIGEST,
        "chunk_index": index,
        "chunk_count": count,
        "total_bytes": len(DATA),
        "payload": payload,
        "kind": "ipc_response_chunk_v1",
    }
    return bytes(msgpack.packb(fields, use_bin_type=True))


VALID_BODIES = [
    chunk(0, DATA[:10]),
    chunk(1, DATA[10:]),
    bytes(msgpack.packb({"version": 1, "request_id": "r1", "ok": True, "body": {"a": [1, b"x"]}, "error": None})),
    bytes(msgpack.packb({"version": 1, "request_id": "r1", "ok": False, "body": None, "error": "boom"})),
]


def limits(impl: ModuleType) -> Any:
    return impl.ChunkLimits(legacy_ceiling=4, max_chunk_payload=64, max_chunk_frame=4096, max_total=256, max_chunks=8)


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def run_stream(impl: ModuleType, pieces: list[bytes], max_body: int = 4096) -> None:
    """Feed a byte stream through the whole receive path, as a connection would."""
    splitter = impl.FrameSplitter(max_body=max_body)
    budget = impl.ResponseBudget()
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=limits(impl))
    try:
        for piece in pieces:
            for body in splitter.feed(piece):
                try:
                    decoded = impl.decode_response(body)
                    done = asm.feed(decoded)
                    if done is not None:
                        with done:
                            env = done.decode()
                            with contextlib.suppress(errors.WireError):
                                impl.decode_body(impl.response_body(env, "r1"))
                except errors.WireError:
                    asm.abort()
                    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=limits(impl))
    except errors.WireError:
        pass
    asm.abort()
    assert budget.reserved == 0


@FIXTURE
@given(pieces=st.lists(st.binary(max_size=200), max_size=10))
def test_fuzz_splitter_random_bytes(impl: ModuleType, pieces: list[bytes]) -> None:
    run_stream(impl, pieces)


@FIXTURE
@given(pieces=st.lists(st.binary(max_size=64), max_size=10))
def test_fuzz_splitter_default_ceiling(impl: ModuleType, pieces: list[bytes]) -> None:
    splitter = impl.FrameSplitter()
    try:
        for piece in pieces:
            for body in splitter.feed(piece):
                assert body.readonly
    except errors.FrameTooLarge:
        pass


@FIXTURE
@given(
    bodies=st.lists(st.sampled_from(range(len(VALID_BODIES))).flatmap(lambda i: mutated(VALID_BODIES[i])), max_size=6),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_fuzz_stream_of_mutated_frames(impl: ModuleType, bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    run_stream(impl, [stream[a:b] for a, b in itertools.pairwise(points)])


@FIXTURE
@given(stream=mutated(b"".join(frame(b) for b in VALID_BODIES)))
def test_fuzz_mutated_stream(impl: ModuleType, stream: bytes) -> None:
    run_stream(impl, [stream])


@FIXTURE
@given(
    frames=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(0, 9),
            st.integers(0, 300),
            st.binary(max_size=80),
            st.sampled_from(["r1", "r2"]),
            st.sampled_from([DIGEST, bytes(32)]),
        ),
        max_size=6,
    )
)
def test_fuzz_assembler_sequences(impl: ModuleType, frames: list[tuple[int, int, int, bytes, str, bytes]]) -> None:
    budget = impl.ResponseBudget(capacity=2 * 256 + 4096)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=limits(impl))
    for index, count, total, payload, request_id, digest in frames:
        fields = {
            "version": 1,
            "request_id": request_id,
            "transfer_digest": digest,
            "chunk_index": index,
            "chunk_count": count,
            "total_bytes": total,
            "payload": payload,
            "kind": "ipc_response_chunk_v1",
        }
        try:
            done = asm.feed(impl.decode_response(msgpack.packb(fields)))
            assert budget.reserved <= budget.capacity
            if done is not None:
                assert hashlib.sha256(bytes(done)).digest() == digest
                done.release()
        except errors.WireError:
            asm = impl.IpcChunkAssembler("r1", budget=budget, limits=limits(impl))
        assert budget.reserved <= budget.capacity
    asm.abort()
    assert budget.reserved == 0
