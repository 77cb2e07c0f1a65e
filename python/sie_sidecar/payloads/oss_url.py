# SPDX-License-Identifier: Apache-2.0
"""`oss://bucket[/prefix]`, OSS object keys and the region-scoped endpoint (sidecar-behaviour §12).

OSS is stricter than the generic object-store rules (`object_keys`): a bucket is 3-63 characters of
`[a-z0-9-]` with a letter or digit at both ends; the URL carries no `%`, credentials, port, query or
fragment; prefix segments and keys are `[A-Za-z0-9_.-]` only, so a key has no `/` and no `..`. The
endpoint is `https://{bucket}.oss-{region}[-internal].aliyuncs.com`, with the region from
`SIE_OSS_REGION` and the VPC-internal host chosen by `SIE_OSS_USE_INTERNAL_ENDPOINT` (§1.2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidPayloadRef, PayloadStoreConfigError
from .object_keys import ObjectRoot

SCHEME = "oss://"
REGION_VAR = "SIE_OSS_REGION"
INTERNAL_VAR = "SIE_OSS_USE_INTERNAL_ENDPOINT"

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", re.ASCII)
_SEGMENT_RE = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
#: Region ids such as `cn-hangzhou`, `ap-southeast-1`, `cn-shanghai-finance-1`.
_REGION_RE = re.compile(r"[a-z]{2}(?:-[a-z0-9]+)+", re.ASCII)
_REGION_MAX = 64
_URL_FORBIDDEN = frozenset("%@:?#")
_INTERNAL_VALUES = {"true": True, "1": True, "false": False, "0": False}


def _valid_segment(segment: str) -> bool:
    return bool(_SEGMENT_RE.fullmatch(segment)) and ".." not in segment and segment != "."


def validate_oss_key(key: str) -> str:
    """An OSS key: non-empty `[A-Za-z0-9_.-]`, not `.`, no `..` (so no `/` and no traversal)."""
    if not _valid_segment(key):
        raise InvalidPayloadRef("OSS object key must be [A-Za-z0-9_.-] without '..'")
    return key


def parse_oss_url(url: str) -> tuple[str, str]:
    """`oss://bucket[/prefix]` → (bucket, prefix without surrounding slashes); config error otherwise."""
    if not url.startswith(SCHEME):
        raise PayloadStoreConfigError(f"payload store URL must start with {SCHEME}")
    rest = url[len(SCHEME) :]
    if any(c in _URL_FORBIDDEN for c in rest):
        raise PayloadStoreConfigError("oss:// URL must not carry '%', credentials, a port, a query or a fragment")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise PayloadStoreConfigError("oss:// bucket must be 3-63 characters of [a-z0-9-], alphanumeric at both ends")
    prefix = prefix.strip("/")
    if prefix and not all(_valid_segment(seg) for seg in prefix.split("/")):
        raise PayloadStoreConfigError("oss:// prefix segments must be [A-Za-z0-9_.-] without '..'")
    return bucket, prefix


@dataclass(frozen=True, slots=True)
class OssLocation:
    """Where the store lives: bucket and prefix (as an `ObjectRoot`), region, endpoint flavour."""

    root: ObjectRoot
    region: str
    internal: bool

    @property
    def host(self) -> str:
        """The virtual-hosted endpoint of the bucket in its region."""
        suffix = "-internal" if self.internal else ""
        return f"{self.root.bucket}.oss-{self.region}{suffix}.aliyuncs.com"

    def object_name(self, ref: str) -> str:
        """The full object name (prefix included) for a plain key or a full `oss://` URL under the root."""
        key = validate_oss_key(self.root.key(ref))
        return f"{self.root.prefix}/{key}" if self.root.prefix else key


def region_from_env(environ: Mapping[str, str]) -> str:
    """`SIE_OSS_REGION`: required, a region id (`cn-hangzhou`), not an endpoint name (`oss-cn-hangzhou`)."""
    region = environ.get(REGION_VAR, "").strip()
    if not region:
        raise PayloadStoreConfigError(f"{REGION_VAR} is required for oss:// payload stores")
    if region.startswith("oss-"):
        raise PayloadStoreConfigError(f"{REGION_VAR} takes a region id such as cn-hangzhou, without 'oss-'")
    if len(region) > _REGION_MAX or not _REGION_RE.fullmatch(region):
        raise PayloadStoreConfigError(f"{REGION_VAR} is not a region id such as cn-hangzhou")
    return region


def internal_from_env(environ: Mapping[str, str]) -> bool:
    """`SIE_OSS_USE_INTERNAL_ENDPOINT`: `true/false/1/0` only, unset (or empty) is false."""
    raw = environ.get(INTERNAL_VAR, "")
    if raw == "":
        return False
    if raw not in _INTERNAL_VALUES:
        raise PayloadStoreConfigError(f"{INTERNAL_VAR} must be true, false, 1 or 0")
    return _INTERNAL_VALUES[raw]


def location_from_env(url: str, environ: Mapping[str, str]) -> OssLocation:
    """The store URL plus the region settings of §1.2; `PayloadStoreConfigError` for any bad part."""
    bucket, prefix = parse_oss_url(url)
    return OssLocation(ObjectRoot(SCHEME, bucket, prefix), region_from_env(environ), internal_from_env(environ))


__all__ = [
    "INTERNAL_VAR",
    "REGION_VAR",
    "SCHEME",
    "OssLocation",
    "internal_from_env",
    "location_from_env",
    "parse_oss_url",
    "region_from_env",
    "validate_oss_key",
]
