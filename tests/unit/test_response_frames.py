# SPDX-License-Identifier: Apache-2.0
"""Backend side of IpcResponseChunkV1: `encode_response_frames` (wire-protocol §6.1, §6.4)."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar import errors

# TV-I6's digest of b"an exact serialized response".
TV_I6_DIGEST = bytes.fromhex("c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225")


def test_producer_small_response_stays_one_legacy_frame_tv_i1(impl: ModuleType) -> None:
    body = bytes.fromhex(
        "85a776657273696f6e01aa726571756573745f6964a7722d736d616c6ca26f6bc3a4626f647981a576616c756593010203a56572726f72c0"
    )
    assert impl.encode_response_frames(body, "r-small") == [body]


def test_producer_fixed_slices_under_relaxed_limits(impl: ModuleType) -> None:
    limits = impl.ChunkLimits(
        legacy_ceiling=8, max_chunk_payload=10, max_chunk_frame=4096, max_total=1024, max_chunks=64
    )
    frames = impl.encode_response_frames(b"an exact serialized response", "r1", limits=limits)
    chunks = [impl.decode_response(f) for f in frames]
    # Fixed slices of max_chunk_payload, the last one shorter; same digest, count and total on all.
    assert [bytes(c.payload) for c in chunks] == [b"an exact s", b"erialized ", b"response"]
    assert {(c.transfer_digest, c.chunk_count, c.total_bytes) for c in chunks} == {(TV_I6_DIGEST, 3, 28)}
    assert [c.chunk_index for c in chunks] == [0, 1, 2]
    assert frames[0][-22:] == b"\xb5ipc_response_chunk_v1"  # kind written last
    done = None
    asm = impl.IpcChunkAssembler("r1", budget=impl.ResponseBudget(), limits=limits)
    for frame in frames:
        done = asm.feed(impl.decode_response(frame))
    assert done is not None
    assert bytes(done) == b"an exact serialized response"
    done.release()


def test_producer_refuses_without_negotiation(impl: ModuleType) -> None:
    limits = impl.ChunkLimits(
        legacy_ceiling=8, max_chunk_payload=10, max_chunk_frame=4096, max_total=1024, max_chunks=64
    )
    with pytest.raises(errors.FrameTooLarge, match="not negotiated"):
        impl.encode_response_frames(b"x" * 9, "r1", accepts_chunks=False, limits=limits)


@pytest.mark.parametrize(("size", "max_chunks"), [(1025, 200), (100, 9)])
def test_producer_refuses_out_of_bounds(impl: ModuleType, size: int, max_chunks: int) -> None:
    limits = impl.ChunkLimits(
        legacy_ceiling=8, max_chunk_payload=10, max_chunk_frame=4096, max_total=1024, max_chunks=max_chunks
    )
    with pytest.raises(errors.FrameTooLarge, match="bounds"):
        impl.encode_response_frames(b"x" * size, "r1", limits=limits)


@settings(max_examples=50)
@given(data=st.binary(min_size=9, max_size=400), step=st.integers(1, 64))
def test_producer_parity_and_round_trip(data: bytes, step: int) -> None:
    from sie_sidecar._twins import wire as _wire_py
    from sie_sidecar.wire import _native_api as _wire_native

    frames = []
    for mod in (_wire_native, _wire_py):
        limits = mod.ChunkLimits(
            legacy_ceiling=8, max_chunk_payload=step, max_chunk_frame=1 << 20, max_total=1 << 20, max_chunks=400
        )
        frames.append(mod.encode_response_frames(data, "r-9", limits=limits))
    assert frames[0] == frames[1]


def test_assembler_is_idle_again_after_a_transfer(impl: ModuleType) -> None:
    limits = impl.ChunkLimits(
        legacy_ceiling=8, max_chunk_payload=10, max_chunk_frame=4096, max_total=1024, max_chunks=64
    )
    asm = impl.IpcChunkAssembler("r1", budget=impl.ResponseBudget(), limits=limits)
    for payload in (b"first response bytes", b"second response!"):
        done = None
        for frame in impl.encode_response_frames(payload, "r1", limits=limits):
            done = asm.feed(impl.decode_response(frame))
        assert done is not None and bytes(done) == payload
        assert not asm.in_progress
        done.release()
