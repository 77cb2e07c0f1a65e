# SPDX-License-Identifier: Apache-2.0
"""Where the OSS reader's credentials come from (sidecar-behaviour §12): exactly one of

* the Alibaba Cloud static pair `ALIBABA_CLOUD_ACCESS_KEY_ID` / `ALIBABA_CLOUD_ACCESS_KEY_SECRET`
  (optional `ALIBABA_CLOUD_SECURITY_TOKEN`),
* the OSS static pair `OSS_ACCESS_KEY_ID` / `OSS_ACCESS_KEY_SECRET` (optional `OSS_SESSION_TOKEN`),
* RRSA (ACK's OIDC role for service accounts): `ALIBABA_CLOUD_ROLE_ARN`,
  `ALIBABA_CLOUD_OIDC_PROVIDER_ARN`, `ALIBABA_CLOUD_OIDC_TOKEN_FILE`, exchanged with STS
  `AssumeRoleWithOIDC` at the region's endpoint (optional `ALIBABA_CLOUD_ROLE_SESSION_NAME`).

Two sources at once, a half pair, a token without its pair, a partial triple, or a custom STS
endpoint (`ALIBABA_CLOUD_STS_ENDPOINT`) is a start-up error: guessing which one was meant could
sign with the wrong identity. Failures name variables, never values.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import aiohttp

from .errors import PayloadStoreConfigError, StsError

ALIBABA_PAIR = ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "ALIBABA_CLOUD_SECURITY_TOKEN")
OSS_PAIR = ("OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET", "OSS_SESSION_TOKEN")
RRSA_TRIPLE = ("ALIBABA_CLOUD_ROLE_ARN", "ALIBABA_CLOUD_OIDC_PROVIDER_ARN", "ALIBABA_CLOUD_OIDC_TOKEN_FILE")
SESSION_NAME_VAR = "ALIBABA_CLOUD_ROLE_SESSION_NAME"
STS_ENDPOINT_VAR = "ALIBABA_CLOUD_STS_ENDPOINT"

STS_TIMEOUT_S = 30.0
STS_DURATION_S = 3600
#: Refresh temporary credentials this long before they expire.
REFRESH_MARGIN_S = 300.0
_DEFAULT_SESSION_NAME = "sie-sidecar"
_SESSION_NAME_RE = re.compile(r"[A-Za-z0-9._@-]{2,64}", re.ASCII)
_ARN_RE = re.compile(r"acs:ram::[0-9]+:(role|oidc-provider)/[A-Za-z0-9._@/-]+", re.ASCII)
_CODE_RE = re.compile(r"[A-Za-z][A-Za-z0-9.]{0,63}", re.ASCII)
_BODY_MAX = 64 * 1024


@dataclass(frozen=True, slots=True)
class OssCredentials:
    """One access key (and session token); `expires_at` is a `time.time()` value, None for static keys."""

    access_key_id: str = field(repr=False)
    access_key_secret: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)
    expires_at: float | None = None


class CredentialSource(Protocol):
    """Hands out credentials valid for the next request."""

    async def get(self, session: aiohttp.ClientSession) -> OssCredentials: ...


@dataclass(frozen=True, slots=True)
class StaticCredentials:
    """A pair from the environment (`source`: `alibaba` or `oss`), used as is for the life of the process."""

    credentials: OssCredentials
    source: str

    async def get(self, session: aiohttp.ClientSession) -> OssCredentials:
        """The same credentials every time."""
        return self.credentials


def sanitised_code(value: object) -> str:
    """A provider error code if it looks like one (`NoSuchKey`, `InvalidParameter.OIDCToken`), else `unknown`."""
    return value if isinstance(value, str) and _CODE_RE.fullmatch(value) else "unknown"


class RrsaCredentials:
    """Temporary credentials from STS `AssumeRoleWithOIDC`, cached until shortly before they expire.

    The OIDC token file is read at each exchange (the kubelet rotates it). One exchange at a time:
    concurrent fetches wait for it rather than each asking STS."""

    def __init__(self, role_arn: str, provider_arn: str, token_file: str, session_name: str, sts_endpoint: str) -> None:
        self.role_arn = role_arn
        self.provider_arn = provider_arn
        self.token_file = token_file
        self.session_name = session_name
        self.sts_endpoint = sts_endpoint
        self._cached: OssCredentials | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"RrsaCredentials(role_arn={self.role_arn!r}, sts_endpoint={self.sts_endpoint!r})"

    def _fresh(self) -> OssCredentials | None:
        cached = self._cached
        if cached is None or cached.expires_at is None or cached.expires_at - REFRESH_MARGIN_S <= time.time():
            return None
        return cached

    async def get(self, session: aiohttp.ClientSession) -> OssCredentials:
        """Cached credentials, or a new exchange when none are left or they are about to expire."""
        cached = self._fresh()
        if cached is not None:
            return cached
        async with self._lock:
            cached = self._fresh()
            if cached is None:
                cached = self._cached = await self._exchange(session)
            return cached

    async def _exchange(self, session: aiohttp.ClientSession) -> OssCredentials:
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError:
            raise StsError(None, "OIDCTokenFileUnreadable", retryable=False) from None
        timestamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        query = {"Action": "AssumeRoleWithOIDC", "Format": "JSON", "Version": "2015-04-01", "Timestamp": timestamp}
        form = {
            "RoleArn": self.role_arn,
            "OIDCProviderArn": self.provider_arn,
            "OIDCToken": token,  # in the body, never in a URL that a proxy might log
            "RoleSessionName": self.session_name,
            "DurationSeconds": str(STS_DURATION_S),
        }
        try:
            timeout = aiohttp.ClientTimeout(total=STS_TIMEOUT_S)
            async with session.post(
                self.sts_endpoint, params=query, data=form, timeout=timeout, allow_redirects=False
            ) as resp:
                body = await resp.content.read(_BODY_MAX)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise StsError(None, type(exc).__name__, retryable=True) from None
        return _parse_sts_reply(status, body)


def _parse_sts_reply(status: int, body: bytes) -> OssCredentials:
    """The `Credentials` of a 200 reply; `StsError` (status and code only) for anything else."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = {}
    if status != 200:
        raise StsError(status, sanitised_code(doc.get("Code")), retryable=status == 429 or status >= 500)
    creds = doc.get("Credentials")
    if not isinstance(creds, dict):
        raise StsError(status, "MalformedReply", retryable=False)
    key_id, secret, token = creds.get("AccessKeyId"), creds.get("AccessKeySecret"), creds.get("SecurityToken")
    if not (isinstance(key_id, str) and key_id and isinstance(secret, str) and secret and isinstance(token, str)):
        raise StsError(status, "MalformedReply", retryable=False)
    return OssCredentials(key_id, secret, token or None, _expiration(creds.get("Expiration")))


def _expiration(value: object) -> float:
    """`2026-12-02T08:30:00Z` as a `time.time()` value; a missing or odd one counts as expiring now."""
    if isinstance(value, str):
        try:
            return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            pass
    return time.time()


def sts_endpoint_for(region: str, internal: bool) -> str:
    """The region's STS endpoint; its VPC endpoint alongside the internal OSS endpoint."""
    host = f"sts-vpc.{region}.aliyuncs.com" if internal else f"sts.{region}.aliyuncs.com"
    return f"https://{host}/"


def _set(environ: Mapping[str, str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if environ.get(name, "").strip()]


def _static(environ: Mapping[str, str], names: tuple[str, ...], source: str) -> StaticCredentials:
    key_id, secret, token = (environ.get(name, "").strip() for name in names)
    if not (key_id and secret):
        raise PayloadStoreConfigError(
            f"OSS credentials: {names[0]} and {names[1]} must be set together ({names[2]} only with both)"
        )
    return StaticCredentials(OssCredentials(key_id, secret, token or None), source)


def _rrsa(environ: Mapping[str, str], sts_endpoint: str) -> RrsaCredentials:
    missing = [name for name in RRSA_TRIPLE if not environ.get(name, "").strip()]
    if missing:
        raise PayloadStoreConfigError(f"OSS credentials: RRSA needs {', '.join(RRSA_TRIPLE)}; missing {missing[0]}")
    role_arn, provider_arn, token_file = (environ[name].strip() for name in RRSA_TRIPLE)
    if not _ARN_RE.fullmatch(role_arn) or ":role/" not in role_arn:
        raise PayloadStoreConfigError("OSS credentials: ALIBABA_CLOUD_ROLE_ARN is not a RAM role ARN")
    if not _ARN_RE.fullmatch(provider_arn) or ":oidc-provider/" not in provider_arn:
        raise PayloadStoreConfigError("OSS credentials: ALIBABA_CLOUD_OIDC_PROVIDER_ARN is not an OIDC provider ARN")
    if not os.path.isfile(token_file):
        raise PayloadStoreConfigError("OSS credentials: ALIBABA_CLOUD_OIDC_TOKEN_FILE is not a readable file")
    session_name = environ.get(SESSION_NAME_VAR, "").strip() or _DEFAULT_SESSION_NAME
    if not _SESSION_NAME_RE.fullmatch(session_name):
        raise PayloadStoreConfigError(f"OSS credentials: {SESSION_NAME_VAR} must be 2-64 of [A-Za-z0-9._@-]")
    return RrsaCredentials(role_arn, provider_arn, token_file, session_name, sts_endpoint)


def credentials_from_env(
    environ: Mapping[str, str], region: str, internal: bool, *, sts_endpoint: str | None = None
) -> CredentialSource:
    """The one credential source the environment names; `PayloadStoreConfigError` if it names none,
    several, or one incompletely. `sts_endpoint` is a test hook (a loopback STS), not configuration."""
    if environ.get(STS_ENDPOINT_VAR, "").strip():
        raise PayloadStoreConfigError(f"OSS credentials: a custom STS endpoint ({STS_ENDPOINT_VAR}) is not supported")
    present = {
        "alibaba": _set(environ, ALIBABA_PAIR),
        "oss": _set(environ, OSS_PAIR),
        "rrsa": _set(environ, RRSA_TRIPLE),
    }
    sources = [name for name, found in present.items() if found]
    if not sources:
        raise PayloadStoreConfigError(
            "OSS credentials: set ALIBABA_CLOUD_ACCESS_KEY_ID/SECRET, OSS_ACCESS_KEY_ID/SECRET, or the RRSA triple"
        )
    if len(sources) > 1:
        named = "; ".join(", ".join(present[name]) for name in sources)
        raise PayloadStoreConfigError(f"OSS credentials are ambiguous: more than one source is set ({named})")
    if sources[0] == "alibaba":
        return _static(environ, ALIBABA_PAIR, "alibaba")
    if sources[0] == "oss":
        return _static(environ, OSS_PAIR, "oss")
    return _rrsa(environ, sts_endpoint or sts_endpoint_for(region, internal))


__all__ = [
    "ALIBABA_PAIR",
    "OSS_PAIR",
    "RRSA_TRIPLE",
    "CredentialSource",
    "OssCredentials",
    "RrsaCredentials",
    "StaticCredentials",
    "StsError",
    "credentials_from_env",
    "sanitised_code",
    "sts_endpoint_for",
]
