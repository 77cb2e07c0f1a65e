# SPDX-License-Identifier: Apache-2.0
"""Plain data shared by both wire implementations and the runtime."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class WorkResult:
    """One reply to the gateway (wire-protocol §8.1); encoded by `wire.encode_work_result`."""

    work_item_id: str
    request_id: str
    item_index: int
    success: bool
    result_msgpack: bytes = b""
    error: str | None = None
    error_code: str | None = None
    inference_ms: float | None = None
    queue_ms: float | None = None
    processing_ms: float | None = None
    worker_id: str | None = None
    tokenization_ms: float | None = None
    postprocessing_ms: float | None = None
    payload_fetch_ms: float | None = None
    units: dict[str, int | None] | None = None
    worker_direct: bool = False
    executed_bundle_config_hash: str | None = None
    retry_after_s: int | None = None


@dataclass(slots=True)
class Reply:
    """One WorkResult to send to one reply subject."""

    subject: str
    result: WorkResult
    accepts_result_chunks: bool


__all__ = ["Reply", "WorkResult"]
