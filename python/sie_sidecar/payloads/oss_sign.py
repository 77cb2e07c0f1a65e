# SPDX-License-Identifier: Apache-2.0
"""Alibaba Cloud OSS Signature V4 (`OSS4-HMAC-SHA256`) for a header-signed request, with hashlib/hmac.

Pure functions, no I/O, so that the tests can hold every step against the official SDK's signer:

    canonical request = METHOD \\n URI \\n QUERY \\n HEADERS \\n ADDITIONAL \\n UNSIGNED-PAYLOAD
    string to sign    = OSS4-HMAC-SHA256 \\n yyyymmddThhmmssZ \\n scope \\n hex(sha256(canonical request))
    scope             = yyyymmdd/region/oss/aliyun_v4_request
    signing key       = HMAC chain over "aliyun_v4" + secret: date, region, "oss", "aliyun_v4_request"

Signed headers are every `x-oss-*` header, `content-type`, `content-md5` and the additional headers
named in the Authorization header; this client adds `host`, so a signature is bound to its endpoint.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from urllib.parse import quote

ALGORITHM = "OSS4-HMAC-SHA256"
PRODUCT = "oss"
TERMINATOR = "aliyun_v4_request"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
#: The extra headers this client signs (sorted, lowercase).
ADDITIONAL_HEADERS: tuple[str, ...] = ("host",)
_DEFAULT_SIGNED = frozenset({"content-type", "content-md5"})


@dataclass(frozen=True, slots=True)
class Signature:
    """The headers to send, and the intermediate strings (for tests and debugging; never logged)."""

    headers: dict[str, str]
    canonical_request: str
    string_to_sign: str


def _is_signed(name: str, additional: tuple[str, ...]) -> bool:
    return name.startswith("x-oss-") or name in _DEFAULT_SIGNED or name in additional


def canonical_uri(bucket: str, key: str) -> str:
    """`/bucket/key`, percent-encoded except `/` (the bucket is part of the URI even when it is the host)."""
    return quote(f"/{bucket}/{key}", safe="/")


def canonical_headers(headers: Mapping[str, str], additional: tuple[str, ...]) -> str:
    """`name:value\\n` for each signed header, lowercase names, sorted."""
    signed = sorted((k.lower(), v) for k, v in headers.items() if _is_signed(k.lower(), additional))
    return "".join(f"{k}:{v}\n" for k, v in signed)


def canonical_request(
    method: str, bucket: str, key: str, headers: Mapping[str, str], additional: tuple[str, ...]
) -> str:
    """The V4 canonical request of a query-less request with an unsigned payload."""
    payload_hash = headers.get("x-oss-content-sha256", UNSIGNED_PAYLOAD)
    return "\n".join(
        (
            method,
            canonical_uri(bucket, key),
            "",
            canonical_headers(headers, additional),
            ";".join(additional),
            payload_hash,
        )
    )


def scope(date: str, region: str) -> str:
    """`yyyymmdd/region/oss/aliyun_v4_request`."""
    return f"{date}/{region}/{PRODUCT}/{TERMINATOR}"


def string_to_sign(timestamp: str, region: str, canonical: str) -> str:
    """The algorithm, the request time, the scope and the canonical request's SHA-256."""
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return f"{ALGORITHM}\n{timestamp}\n{scope(timestamp[:8], region)}\n{digest}"


def signing_key(secret: str, date: str, region: str) -> bytes:
    """The day- and region-scoped key derived from the access key secret."""
    key = ("aliyun_v4" + secret).encode()
    for part in (date, region, PRODUCT, TERMINATOR):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    *,
    method: str,
    host: str,
    bucket: str,
    key: str,
    region: str,
    access_key_id: str,
    access_key_secret: str,
    security_token: str | None,
    now: datetime,
) -> Signature:
    """Every header the request needs (`Authorization` included) to be accepted by OSS at `now`."""
    now = now.astimezone(UTC)
    timestamp = now.strftime("%Y%m%dT%H%M%SZ")
    headers = {
        "host": host,
        "x-oss-date": timestamp,
        "x-oss-content-sha256": UNSIGNED_PAYLOAD,
    }
    if security_token:
        headers["x-oss-security-token"] = security_token
    canonical = canonical_request(method, bucket, key, headers, ADDITIONAL_HEADERS)
    to_sign = string_to_sign(timestamp, region, canonical)
    mac = hmac.new(signing_key(access_key_secret, timestamp[:8], region), to_sign.encode(), hashlib.sha256)
    credential = f"{access_key_id}/{scope(timestamp[:8], region)}"
    authorization = f"{ALGORITHM} Credential={credential},AdditionalHeaders={';'.join(ADDITIONAL_HEADERS)}"
    headers["authorization"] = f"{authorization},Signature={mac.hexdigest()}"
    headers["date"] = format_datetime(now, usegmt=True)  # informational; x-oss-date is the signed time
    return Signature(headers, canonical, to_sign)


__all__ = [
    "ADDITIONAL_HEADERS",
    "ALGORITHM",
    "UNSIGNED_PAYLOAD",
    "Signature",
    "canonical_headers",
    "canonical_request",
    "canonical_uri",
    "scope",
    "sign",
    "signing_key",
    "string_to_sign",
]
