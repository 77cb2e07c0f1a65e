# SPDX-License-Identifier: Apache-2.0
"""S3 payload reader (sidecar-behaviour §12) through obstore, the Rust `object_store` crate's binding.

obstore reads credentials, region and endpoint from the standard AWS environment (static keys,
session token, web identity / IRSA, ECS and EC2 instance metadata; `AWS_ENDPOINT_URL` for
S3-compatible servers), does its I/O on its own Tokio runtime, and hands bytes back without
passing them through Python-level buffers. The same package speaks GCS and Azure, which is why it
was chosen over aiobotocore: those stores are a constructor away when they are wanted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import InvalidPathError
from obstore.store import S3Store

from .errors import InvalidPayloadRef, ObjectStoreError, PayloadError, PayloadOversized, PayloadStoreConfigError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

SCHEME = "s3://"
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", re.ASCII)
_OTHER_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://", re.ASCII)
_ERROR_TEXT_MAX = 300

_TRUE = frozenset({"1", "true", "yes", "on"})

#: Bounded like the OSS reader of §12: three attempts, 30 s in all, short backoff.
RETRY: RetryConfig = {
    "max_retries": 2,
    "retry_timeout": timedelta(seconds=30),
    "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1), "base": 2},
}


def client_options(environ: Mapping[str, str]) -> ClientConfig:
    """Timeouts of our own; `AWS_ALLOW_HTTP` carried over, since explicit options replace the env's."""
    options: ClientConfig = {"timeout": timedelta(seconds=30), "connect_timeout": timedelta(seconds=5)}
    if environ.get("AWS_ALLOW_HTTP", "").strip().lower() in _TRUE:
        options["allow_http"] = True  # plain-HTTP S3-compatible endpoints (MinIO, test servers)
    return options


def validate_key(key: str) -> str:
    """§12 key rules: non-empty, no leading `/`, no backslash, no empty, `.` or `..` segment."""
    if not key:
        raise InvalidPayloadRef("empty object key")
    if key.startswith("/") or "\\" in key or "\0" in key:
        raise InvalidPayloadRef("object key has a leading '/', a backslash or a NUL byte")
    if any(seg in ("", ".", "..") for seg in key.split("/")):
        raise InvalidPayloadRef("object key has an empty, '.' or '..' segment")
    return key


def parse_store_url(url: str, scheme: str = SCHEME) -> tuple[str, str]:
    """`s3://bucket[/prefix]` → (bucket, prefix without surrounding slashes); config error otherwise."""
    if not url.startswith(scheme):
        raise PayloadStoreConfigError(f"payload store URL must start with {scheme}")
    bucket, _, prefix = url[len(scheme) :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise PayloadStoreConfigError("payload store URL has an invalid bucket name")
    prefix = prefix.strip("/")
    if prefix:
        try:
            validate_key(prefix)
        except InvalidPayloadRef:
            raise PayloadStoreConfigError("payload store URL has an invalid prefix") from None
    return bucket, prefix


class S3Reader:
    """Reads keys under `s3://bucket/prefix/`, bounded by size from metadata and while streaming."""

    def __init__(self, url: str) -> None:
        self.bucket, self.prefix = parse_store_url(url)
        self._root = f"{SCHEME}{self.bucket}/" + (f"{self.prefix}/" if self.prefix else "")
        try:
            self._store = S3Store(self.bucket, client_options=client_options(os.environ), retry_config=RETRY)
        except Exception as exc:  # obstore reports bad environment configuration at construction
            raise PayloadStoreConfigError(f"cannot configure the S3 payload store: {exc}") from None

    def object_path(self, ref: str) -> str:
        """The full object key for a plain key or a full `s3://` URL under the configured prefix."""
        if ref.startswith(SCHEME):
            if not ref.startswith(self._root):
                raise InvalidPayloadRef("payload URL outside the configured bucket and prefix")
            ref = ref[len(self._root) :]
        elif _OTHER_SCHEME_RE.match(ref):
            raise InvalidPayloadRef("payload ref names another object store")
        key = validate_key(ref)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def fetch(self, ref: str, limit: int) -> bytes:
        """The object's bytes; `PayloadOversized` as soon as the size or the stream passes `limit`."""
        path = self.object_path(ref)
        try:
            result = await obstore.get_async(self._store, path)
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
        except PayloadError:
            raise
        except FileNotFoundError:
            raise InvalidPayloadRef("object not found") from None
        except InvalidPathError:
            raise InvalidPayloadRef("object key rejected by the store") from None
        except Exception as exc:  # transport, credentials, throttling, 5xx after retries
            raise ObjectStoreError(str(exc)[:_ERROR_TEXT_MAX]) from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Nothing to release: obstore's connection pool goes with the store object."""


__all__ = ["SCHEME", "S3Reader", "client_options", "parse_store_url", "validate_key"]
