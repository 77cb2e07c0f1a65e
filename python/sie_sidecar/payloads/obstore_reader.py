# SPDX-License-Identifier: Apache-2.0
"""A bounded payload read through obstore (the Rust `object_store` crate's binding), for S3 and GCS.

obstore does its I/O on its own Tokio runtime and hands bytes back without passing them through
Python-level buffers. What differs between the stores is only how the store object is built
(credentials, endpoint), so the fetch, the size cap and the mapping of its errors onto the §13
reasons live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import InvalidPathError

from .errors import InvalidPayloadRef, ObjectStoreError, PayloadError, PayloadOversized
from .object_keys import ObjectRoot

if TYPE_CHECKING:
    from obstore import GetResult
    from obstore.store import AzureStore, ClientConfig, GCSStore, RetryConfig, S3Store

_ERROR_TEXT_MAX = 300
_TRUE = frozenset({"1", "true", "yes", "on"})

#: Bounded like the OSS reader of §12: three attempts, 30 s in all, short backoff.
RETRY: RetryConfig = {
    "max_retries": 2,
    "retry_timeout": timedelta(seconds=30),
    "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1), "base": 2},
}


def client_options(environ: Mapping[str, str], allow_http_var: str) -> ClientConfig:
    """Timeouts of our own; `allow_http_var` (`AWS_ALLOW_HTTP`, `GOOGLE_ALLOW_HTTP`) carried over,
    since explicit options replace what obstore would have read from the environment."""
    options: ClientConfig = {"timeout": timedelta(seconds=30), "connect_timeout": timedelta(seconds=5)}
    if environ.get(allow_http_var, "").strip().lower() in _TRUE:
        options["allow_http"] = True  # plain-HTTP endpoints (MinIO, emulators, test servers)
    return options


async def bounded_read(result: GetResult, limit: int) -> bytes:
    """The body of `result`; `PayloadOversized` from its metadata size, or as soon as the stream passes
    `limit` (a server whose body outgrows its header)."""
    size = result.meta["size"]
    if size > limit:
        raise PayloadOversized(size, limit)
    parts: list[bytes] = []
    total = 0
    async for chunk in result.stream(min_chunk_size=max(size, 1)):
        total += len(chunk)
        if total > limit:
            raise PayloadOversized(total, limit)
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class ObstoreReader:
    """Reads keys under one `ObjectRoot` from one obstore store, mapping failures onto §13 reasons."""

    def __init__(self, root: ObjectRoot, store: S3Store | GCSStore | AzureStore) -> None:
        self.root = root
        self.bucket = root.bucket
        self.prefix = root.prefix
        self._store = store

    def object_path(self, ref: str) -> str:
        """The full object key for a plain key or a full URL under the configured prefix."""
        return self.root.object_path(ref)

    async def fetch(self, ref: str, limit: int) -> bytes:
        """The object's bytes; missing → invalid ref; any other store failure → `ObjectStoreError`."""
        path = self.object_path(ref)
        try:
            result = await obstore.get_async(self._store, path)
            return await bounded_read(result, limit)
        except PayloadError:
            raise
        except FileNotFoundError:
            raise InvalidPayloadRef("object not found") from None
        except InvalidPathError:
            raise InvalidPayloadRef("object key rejected by the store") from None
        except Exception as exc:  # transport, credentials, throttling, 5xx after retries
            raise ObjectStoreError(str(exc)[:_ERROR_TEXT_MAX]) from None

    def close(self) -> None:
        """Nothing to release: obstore's connection pool goes with the store object."""


__all__ = ["RETRY", "ObstoreReader", "bounded_read", "client_options"]
