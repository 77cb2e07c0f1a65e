# SPDX-License-Identifier: Apache-2.0
"""Object-store URLs and keys (sidecar-behaviour §12), shared by every `scheme://bucket[/prefix]` store.

A store URL names a bucket and an optional prefix; a ref is a plain key under that prefix or the
full URL of one. The rules here are the scheme-generic ones; a store with stricter ones (OSS) checks
the key again after `ObjectRoot.key`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidPayloadRef, PayloadStoreConfigError

#: Any URL scheme: a ref that starts with one names another store (or the web), never a key.
OTHER_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://", re.ASCII)


def validate_key(key: str) -> str:
    """§12 key rules: non-empty, no leading `/`, no backslash, no empty, `.` or `..` segment."""
    if not key:
        raise InvalidPayloadRef("empty object key")
    if key.startswith("/") or "\\" in key or "\0" in key:
        raise InvalidPayloadRef("object key has a leading '/', a backslash or a NUL byte")
    if any(seg in ("", ".", "..") for seg in key.split("/")):
        raise InvalidPayloadRef("object key has an empty, '.' or '..' segment")
    return key


def parse_store_url(url: str, scheme: str, bucket_re: re.Pattern[str]) -> tuple[str, str]:
    """`<scheme>bucket[/prefix]` → (bucket, prefix without surrounding slashes); config error otherwise."""
    if not url.startswith(scheme):
        raise PayloadStoreConfigError(f"payload store URL must start with {scheme}")
    bucket, _, prefix = url[len(scheme) :].partition("/")
    if not bucket_re.fullmatch(bucket):
        raise PayloadStoreConfigError("payload store URL has an invalid bucket name")
    prefix = prefix.strip("/")
    if prefix:
        try:
            validate_key(prefix)
        except InvalidPayloadRef:
            raise PayloadStoreConfigError("payload store URL has an invalid prefix") from None
    return bucket, prefix


@dataclass(frozen=True, slots=True)
class ObjectRoot:
    """`<scheme><bucket>/<prefix>/`: turns refs into object keys, refusing anything outside it."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """The full-URL form a ref may take, up to and including the prefix's trailing `/`."""
        return f"{self.scheme}{self.bucket}/" + (f"{self.prefix}/" if self.prefix else "")

    def key(self, ref: str) -> str:
        """The validated key relative to the prefix, for a plain key or a full URL under the root."""
        if ref.startswith(self.scheme):
            root = self.url
            if not ref.startswith(root):
                raise InvalidPayloadRef("payload URL outside the configured bucket and prefix")
            ref = ref[len(root) :]
        elif OTHER_SCHEME_RE.match(ref):
            raise InvalidPayloadRef("payload ref names another object store")
        return validate_key(ref)

    def object_path(self, ref: str) -> str:
        """The object's full key in the bucket (prefix included)."""
        key = self.key(ref)
        return f"{self.prefix}/{key}" if self.prefix else key


__all__ = ["OTHER_SCHEME_RE", "ObjectRoot", "parse_store_url", "validate_key"]
