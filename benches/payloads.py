# SPDX-License-Identifier: Apache-2.0
"""Realistic wire payloads for the benchmarks (deterministic, built with msgpack directly)."""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np

from sie_sidecar._twins import wire as _wire_py

MiB = 1024 * 1024


def run_batch_response(items: int = 256, dim: int = 384, request_id: str = "w-17") -> bytes:
    """A whole IPC frame: a RunBatch response with `items` dense outcomes, as a backend sends it."""
    rng = np.random.default_rng(7)
    outcomes = []
    for i in range(items):
        vec = rng.standard_normal(dim).astype(np.float32)
        outcomes.append(
            {
                "work_item_id": f"req-{i // 8}.{i % 8}",
                "request_id": f"req-{i // 8}",
                "item_index": i % 8,
                "disposition": "publish_and_ack",
                "nak_delay_ms": None,
                "result_msgpack": _wire_py.frame_dense(vec),
                "error": None,
                "error_code": None,
                "inference_ms": 3.25,
                "tokenization_ms": None,
                "postprocessing_ms": 0.5,
                "raw_output": None,
                "units": {"input_tokens": 17, "pages": None, "images": None, "audio_ms": None, "pairs": None},
            }
        )
    body = {"outcomes": outcomes, "batched_f16_multivectors": []}
    envelope: bytes = msgpack.packb(
        {"version": 1, "request_id": request_id, "ok": True, "body": body, "error": None}, use_bin_type=True
    )
    return len(envelope).to_bytes(4, "big") + envelope


def chunked_response(total: int = 128 * MiB, request_id: str = "w-1") -> tuple[bytes, list[bytes]]:
    """A serialized response of `total` bytes and its IpcResponseChunkV1 frame bodies (4 MiB each)."""
    prefix = msgpack.packb({"version": 1, "request_id": request_id, "ok": True, "body": {"blob": b""}})
    # Grow the blob so the whole envelope is exactly `total` bytes (bin8 → bin32 header: 3 more bytes).
    blob_len = total - len(prefix) - 3
    envelope = msgpack.packb(
        {"version": 1, "request_id": request_id, "ok": True, "body": {"blob": b"\x07" * blob_len}},
        use_bin_type=True,
    )
    assert len(envelope) == total, len(envelope)
    digest = hashlib.sha256(envelope).digest()
    step = 4 * MiB
    count = -(-len(envelope) // step)
    frames = [
        msgpack.packb(
            {
                "version": 1,
                "request_id": request_id,
                "transfer_digest": digest,
                "chunk_index": i,
                "chunk_count": count,
                "total_bytes": len(envelope),
                "payload": envelope[i * step : (i + 1) * step],
                "kind": "ipc_response_chunk_v1",
            },
            use_bin_type=True,
        )
        for i in range(count)
    ]
    return envelope, frames
