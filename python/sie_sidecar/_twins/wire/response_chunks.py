# SPDX-License-Identifier: Apache-2.0
"""Backend side of IpcResponseChunkV1: how one serialized response goes out (wire-protocol §6.4)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import msgpack

from ...errors import FrameTooLarge
from ...wire.limits import IPC_CHUNK_KIND, IPC_VERSION
from .ipc_chunks import PRODUCTION_LIMITS, ChunkLimits

if TYPE_CHECKING:
    from typing_extensions import Buffer

NOT_NEGOTIATED = "IPC response exceeds the legacy frame limit; response chunking v1 was not negotiated"
OUT_OF_BOUNDS = "IPC response exceeds the negotiated response chunking v1 bounds"


def encode_response_frames(
    response: Buffer, request_id: str, *, accepts_chunks: bool = True, limits: ChunkLimits | None = None
) -> list[bytes]:
    """Frame bodies for one serialized response: itself when it fits the legacy ceiling, else v1
    chunk frames of fixed slices (the last one shorter), all carrying the same digest."""
    lim = limits if limits is not None else PRODUCTION_LIMITS
    whole = bytes(response)
    total = len(whole)
    if total <= lim.legacy_ceiling:
        return [whole]
    if not accepts_chunks:
        raise FrameTooLarge(NOT_NEGOTIATED)
    step = max(lim.max_chunk_payload, 1)
    count = -(-total // step)
    if total > lim.max_total or count > lim.max_chunks:
        raise FrameTooLarge(OUT_OF_BOUNDS)
    digest = hashlib.sha256(whole).digest()
    view = memoryview(whole)
    return [
        msgpack.packb(
            {
                "version": IPC_VERSION,
                "request_id": request_id,
                "transfer_digest": digest,
                "chunk_index": i,
                "chunk_count": count,
                "total_bytes": total,
                "payload": view[i * step : (i + 1) * step],
                "kind": IPC_CHUNK_KIND,
            },
            use_bin_type=True,
        )
        for i in range(count)
    ]
