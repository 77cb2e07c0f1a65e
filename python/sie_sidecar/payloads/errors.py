# SPDX-License-Identifier: Apache-2.0
"""Typed payload-store failures, one class per telemetry reason of sidecar-behaviour §13.

The caller needs only two facts to settle an item (§4.2): whether the payload was too large
(`PAYLOAD_TOO_LARGE`) or not (`payload_error`). The reason is kept for telemetry and logs.
"""

from __future__ import annotations

from typing import ClassVar, Literal

Reason = Literal["not_found", "permission_denied", "io", "invalid_ref", "unsupported", "object_store", "too_large"]


class PayloadStoreConfigError(Exception):
    """An unusable `SIE_PAYLOAD_STORE_URL`: fatal at start-up (§3), never raised per read."""


class PayloadError(Exception):
    """A payload reference could not be read; `reason` names why in the §13 vocabulary."""

    reason: ClassVar[Reason] = "io"

    @property
    def too_large(self) -> bool:
        """Whether the caller answers `PAYLOAD_TOO_LARGE` rather than `payload_error`."""
        return self.reason == "too_large"


class PayloadNotFound(PayloadError):
    """A local file that does not exist (object stores report a missing key as an invalid ref)."""

    reason: ClassVar[Reason] = "not_found"


class PayloadPermissionDenied(PayloadError):
    """The file exists but this process may not open it."""

    reason: ClassVar[Reason] = "permission_denied"


class PayloadIOError(PayloadError):
    """Any other operating-system error while opening or reading."""

    reason: ClassVar[Reason] = "io"


class InvalidPayloadRef(PayloadError):
    """The reference is malformed, escapes the store, crosses a symlink, or names no object."""

    reason: ClassVar[Reason] = "invalid_ref"


class PayloadUnsupported(PayloadError):
    """The platform cannot open files safely (no `openat2`): refuse rather than fall back."""

    reason: ClassVar[Reason] = "unsupported"


class ObjectStoreError(PayloadError):
    """The object store failed (transport, credentials, throttling, server error)."""

    reason: ClassVar[Reason] = "object_store"


class PayloadOversized(PayloadError):
    """The stored blob is larger than the fetch limit (from metadata or while reading)."""

    reason: ClassVar[Reason] = "too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of at least {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


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
]
