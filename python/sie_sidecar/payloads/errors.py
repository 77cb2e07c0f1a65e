# SPDX-License-Identifier: Apache-2.0
"""Typed payload-store failures, one class per telemetry reason of sidecar-behaviour §13 (defined in
`sie_sidecar.errors` with every other exception of the sidecar; named here for the payloads room).

The caller needs only two facts to settle an item (§4.2): whether the payload was too large
(`PAYLOAD_TOO_LARGE`) or not (`payload_error`). The reason is kept for telemetry and logs.
"""

from __future__ import annotations

from ..errors import (
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
    StsError,
)

__all__ = [
    "InvalidPayloadRef",
    "ObjectStoreError",
    "PayloadError",
    "PayloadIOError",
    "PayloadNotFound",
    "PayloadOversized",
    "PayloadPermissionDenied",
    "PayloadStoreConfigError",
    "PayloadUnsupported",
    "Reason",
    "StsError",
]
