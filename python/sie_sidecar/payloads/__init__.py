# SPDX-License-Identifier: Apache-2.0
"""Offloaded payloads (sidecar-behaviour §12): a store built once from `SIE_PAYLOAD_STORE_URL`, and
`resolve_items`, which inlines each item's payload or returns that item's typed failure."""

from __future__ import annotations

from .errors import (
    InvalidPayloadRef,
    ObjectStoreError,
    PayloadError,
    PayloadIOError,
    PayloadNotFound,
    PayloadOversized,
    PayloadPermissionDenied,
    PayloadStoreConfigError,
    PayloadUnsupported,
    Reason,
)
from .resolve import (
    PAYLOAD_ERROR_CODE,
    PAYLOAD_ERROR_MESSAGE,
    TOO_LARGE_CODE,
    TOO_LARGE_MESSAGE,
    Resolved,
    ResolveFailure,
    ResolveOutcome,
    resolve_item,
    resolve_items,
)
from .store import PAYLOAD_ENVELOPE_LIMIT, PayloadReader, PayloadStore

__all__ = [
    "PAYLOAD_ENVELOPE_LIMIT",
    "PAYLOAD_ERROR_CODE",
    "PAYLOAD_ERROR_MESSAGE",
    "TOO_LARGE_CODE",
    "TOO_LARGE_MESSAGE",
    "InvalidPayloadRef",
    "ObjectStoreError",
    "PayloadError",
    "PayloadIOError",
    "PayloadNotFound",
    "PayloadOversized",
    "PayloadPermissionDenied",
    "PayloadReader",
    "PayloadStore",
    "PayloadStoreConfigError",
    "PayloadUnsupported",
    "Reason",
    "ResolveFailure",
    "ResolveOutcome",
    "Resolved",
    "resolve_item",
    "resolve_items",
]
