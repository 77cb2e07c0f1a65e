# SPDX-License-Identifier: Apache-2.0
"""`SIE_PAYLOAD_STORE_URL` → one reader (sidecar-behaviour §12), built once at start-up.

| URL | reader |
|---|---|
| unset or `""` | local, no base directory: every read is an invalid ref |
| `s3://bucket[/prefix]` | S3 (obstore, credentials from the standard AWS environment) |
| `gs://bucket[/prefix]` | GCS (obstore, credentials from the standard Google environment) |
| `oss://bucket[/prefix]` | Alibaba OSS (native V4-signed client; `SIE_OSS_REGION`, Alibaba/OSS/RRSA credentials) |
| `abfs[s]://container@account.dfs.core.windows.net[/prefix]` | Azure Blob (obstore, standard Azure environment) |
| `file://<path>` or any other string | local, pinned base directory `<path>` |
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from ..telemetry import (
    DURATION_BOUNDS_S,
    PAYLOAD_FETCH_DURATION,
    PAYLOAD_FETCHES,
    PAYLOAD_SIZE,
    SIZE_BOUNDS_BYTES,
    Registry,
)
from .errors import InvalidPayloadRef, PayloadError
from .local import LocalReader

if TYPE_CHECKING:
    from sie_sidecar.config import Settings

#: §12 envelope cap: the widest accepted extract request (34 MiB) plus 64 KiB of msgpack overhead.
PAYLOAD_ENVELOPE_LIMIT = 34 * 1024 * 1024 + 64 * 1024
FILE_SCHEME = "file://"


class PayloadReader(Protocol):
    """What a backing store offers: a bounded fetch, and release at shutdown."""

    async def fetch(self, ref: str, limit: int) -> bytes: ...

    def close(self) -> None: ...


class PayloadStore:
    """Resolves payload refs against the configured store; every failure is a `PayloadError`."""

    def __init__(self, reader: PayloadReader, kind: str) -> None:
        self.reader = reader
        self.kind = kind
        #: Where `sie.worker.payload.fetches`, `.fetch.duration` and `.size` are recorded (§13), one
        #: fetch at a time (fetches are per offloaded item, not the hot path); None: not recorded.
        self.telemetry: Registry | None = None

    @classmethod
    def from_url(cls, url: str | None) -> PayloadStore:
        """The §12 table; `PayloadStoreConfigError` for a URL this build can not serve (fatal at start-up)."""
        if not url:
            return cls(LocalReader(None), "local")
        if url.startswith("s3://"):
            from .s3 import S3Reader  # obstore is imported only when an object store is configured

            return cls(S3Reader(url), "s3")
        if url.startswith("gs://"):
            from .gcs import GCSReader

            return cls(GCSReader(url), "gcs")
        if url.startswith("oss://"):
            from .oss import OssReader

            return cls(OssReader(url), "oss")
        if url.startswith(("abfs://", "abfss://")):
            from .azure import AzureReader

            return cls(AzureReader(url), "azure")
        if url.startswith(FILE_SCHEME):
            return cls(LocalReader(url[len(FILE_SCHEME) :]), "local")
        return cls(LocalReader(url), "local")

    @classmethod
    def from_settings(cls, settings: Settings) -> PayloadStore:
        """The store named by `SIE_PAYLOAD_STORE_URL` / `--payload-store-url`."""
        return cls.from_url(settings.payload_store_url)

    async def fetch(self, ref: str, *, limit: int = PAYLOAD_ENVELOPE_LIMIT) -> bytes:
        """The stored blob, at most `limit` bytes; raises a `PayloadError` subclass (check `.too_large`)."""
        if not isinstance(ref, str):
            raise InvalidPayloadRef("payload ref must be a string")
        telemetry = self.telemetry
        if telemetry is None:
            return await self.reader.fetch(ref, limit)
        started = time.perf_counter()
        try:
            blob = await self.reader.fetch(ref, limit)
        except PayloadError as exc:
            # §13's reason vocabulary has no `too_large` (v0.7.1): it reports as `other`.
            self._record(telemetry, "error", "other" if exc.too_large else exc.reason, started, None)
            raise
        self._record(telemetry, "success", "none", started, len(blob))
        return blob

    @staticmethod
    def _record(telemetry: Registry, outcome: str, reason: str, started: float, size: int | None) -> None:
        attrs = (("outcome", outcome), ("reason", reason))
        telemetry.add(PAYLOAD_FETCHES, 1, attrs)
        telemetry.histogram(PAYLOAD_FETCH_DURATION, attrs, DURATION_BOUNDS_S).record(time.perf_counter() - started)
        if size is not None:
            telemetry.histogram(PAYLOAD_SIZE, attrs, SIZE_BOUNDS_BYTES).record(size)

    def close(self) -> None:
        """Release the reader's resources (the pinned directory descriptor, an HTTP session)."""
        self.reader.close()


__all__ = ["PAYLOAD_ENVELOPE_LIMIT", "PayloadReader", "PayloadStore"]
