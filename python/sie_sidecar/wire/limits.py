# SPDX-License-Identifier: Apache-2.0
"""Pinned protocol constants (wire-protocol §1, §6, §9; sidecar-behaviour §7)."""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB

IPC_VERSION: Final = 1
MAX_FRAME: Final = 32 * MiB
IPC_CHUNK_KIND: Final = "ipc_response_chunk_v1"
MAX_CHUNK_PAYLOAD: Final = 4 * MiB
MAX_CHUNK_FRAME: Final = 4 * MiB + 4 * KiB
MAX_CHUNKED_RESPONSE: Final = 128 * MiB
MAX_RESPONSE_CHUNKS: Final = 64
DIGEST_LEN: Final = 32
RESERVATION_OVERHEAD: Final = 4 * KiB
DEFAULT_RESPONSE_BUDGET: Final = 2 * MAX_CHUNKED_RESPONSE + RESERVATION_OVERHEAD

RESULT_CHUNK_KIND: Final = "result_chunk_v1"
RESULT_CHUNK_TARGET: Final = 768 * KiB
MAX_CHUNKED_RESULT: Final = 16 * MiB
MAX_RESULT_CHUNKS: Final = 64

TOMBSTONE_CAPACITY: Final = 100_000
TOMBSTONE_TTL_S: Final = 1800.0
BATCH_TOMBSTONE_TTL_S: Final = 120.0

UNIT_KEYS: Final = ("input_tokens", "pages", "images", "audio_ms", "pairs")
#: UnitCounts keys newer than v0.7.1 (wire-protocol §4.6): carried and re-emitted only when present.
NEWER_UNIT_KEYS: Final = ("content_input_tokens", "output_tokens")
DISPOSITIONS: Final = ("publish_and_ack", "publish_error_and_ack", "nak_retry")
