# SPDX-License-Identifier: Apache-2.0
"""The local-ingest payload digest (sidecar-behaviour §11, TV-L3): SHA-256 binding a request's body
fields to its dispatch context, so that a body cannot be replayed under another context."""

from __future__ import annotations

import hashlib
import struct
from typing import Final

DOMAIN: Final = b"sie-local-ingest-v1\x00"
DIGEST_SIZE: Final = 32
_LEN = struct.Struct(">Q")
_TIMEOUT = struct.Struct(">q")


def payload_digest(
    *,
    dispatch_context: bytes,
    lane: str,
    endpoint: str,
    model: str,
    engine: str,
    admission_pool: str,
    bundle_config_hash: str,
    request_id: str,
    params: bytes,
    items: bytes,
    timeout_ms: int,
) -> bytes:
    """SHA-256 of the domain tag, then each field as an 8-byte big-endian length and its bytes (in the
    §11 order), then `timeout_ms` as an 8-byte big-endian signed integer."""
    h = hashlib.sha256(DOMAIN)
    for value in (
        dispatch_context,
        lane.encode(),
        endpoint.encode(),
        model.encode(),
        engine.encode(),
        admission_pool.encode(),
        bundle_config_hash.encode(),
        request_id.encode(),
        params,
        items,
    ):
        h.update(_LEN.pack(len(value)))
        h.update(value)
    h.update(_TIMEOUT.pack(timeout_ms))
    return h.digest()


__all__ = ["DIGEST_SIZE", "DOMAIN", "payload_digest"]
