# SPDX-License-Identifier: Apache-2.0
"""Alibaba Cloud OSS payload reader (sidecar-behaviour §12, §15): a native, region-scoped client.

One GET per fetch, signed locally with OSS Signature V4 (`oss_sign`, hashlib/hmac: no SDK at run
time: the official SDK's async client adds 143-186 ms of import, measured, and has no OIDC/RRSA
credentials provider, so the STS code would stay anyway; the SDK is the tests' signature oracle),
over one aiohttp session. At most 3 attempts, each bounded by 30 s; 429, 5xx and transport
failures are retried after 50 ms x attempt. 404 is an invalid ref. The size cap is checked from
`Content-Length` and again while the body streams. Errors carry only the HTTP status and a
sanitised provider code (`NoSuchKey`, `SignatureDoesNotMatch`): never the key, the URL, the
credentials or the body, which for OSS can echo the string to sign.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

import aiohttp

from .errors import InvalidPayloadRef, ObjectStoreError, PayloadOversized
from .oss_credentials import CredentialSource, StsError, credentials_from_env, sanitised_code
from .oss_sign import sign
from .oss_url import OssLocation, location_from_env

ATTEMPTS = 3
REQUEST_TIMEOUT_S = 30.0
BACKOFF_S = 0.05  # x attempt number: 50 ms, then 100 ms
_TIMEOUT = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
_ERROR_BODY_MAX = 16 * 1024
_CODE_IN_XML = re.compile(rb"<Code>([^<]{1,128})</Code>")


class _Retryable(Exception):
    """One attempt failed in a way worth another (throttled, server error, transport); `args[0]` is safe
    to show."""


def provider_code(body: bytes) -> str:
    """The `<Code>` of an OSS XML error body, if it looks like a code; `unknown` otherwise."""
    match = _CODE_IN_XML.search(body)
    return sanitised_code(match.group(1).decode("ascii", "replace")) if match else "unknown"


async def _read_body(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The response body; `PayloadOversized` from `Content-Length`, or once the stream passes `limit`."""
    length = resp.content_length
    if length is not None and length > limit:
        raise PayloadOversized(length, limit)
    parts: list[bytes] = []
    total = 0
    async for chunk in resp.content.iter_any():
        total += len(chunk)
        if total > limit:
            raise PayloadOversized(total, limit)
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class OssReader:
    """Reads keys under `oss://bucket/prefix/` from `https://{bucket}.oss-{region}[-internal].aliyuncs.com`.

    `endpoint` and `sts_endpoint` are test hooks (loopback servers, plain HTTP allowed); production
    builds the reader from the URL and the environment only, and no variable sets them."""

    def __init__(
        self,
        url: str,
        environ: Mapping[str, str] | None = None,
        *,
        endpoint: str | None = None,
        sts_endpoint: str | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.location: OssLocation = location_from_env(url, env)
        self._credentials: CredentialSource = credentials_from_env(
            env, self.location.region, self.location.internal, sts_endpoint=sts_endpoint
        )
        if endpoint is None:
            self._base = f"https://{self.location.host}"
            self._host = self.location.host
        else:
            self._base = endpoint.rstrip("/")
            self._host = urlsplit(endpoint).netloc
        self._session: aiohttp.ClientSession | None = None
        self._closing: asyncio.Task[None] | None = None

    @property
    def bucket(self) -> str:
        return self.location.root.bucket

    @property
    def prefix(self) -> str:
        return self.location.root.prefix

    def object_name(self, ref: str) -> str:
        """The full object name for a plain key or a full `oss://` URL under the prefix (§12 OSS rules)."""
        return self.location.object_name(ref)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Bytes exactly as stored: no transparent gzip, so the size cap applies to what is read.
            self._session = aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("Accept-Encoding",))
        return self._session

    async def fetch(self, ref: str, limit: int) -> bytes:
        """The object's bytes; `InvalidPayloadRef` (bad key, 404), `PayloadOversized`, `ObjectStoreError`."""
        name = self.object_name(ref)
        url = f"{self._base}/{quote(name, safe='/')}"
        session = self._client()
        failure = "no attempt"
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return await self._get(session, name, url, limit)
            except _Retryable as exc:
                failure = str(exc.args[0])
            if attempt < ATTEMPTS:
                await asyncio.sleep(BACKOFF_S * attempt)
        raise ObjectStoreError(f"OSS GET failed after {ATTEMPTS} attempts ({failure})")

    async def _get(self, session: aiohttp.ClientSession, name: str, url: str, limit: int) -> bytes:
        try:
            creds = await self._credentials.get(session)
        except StsError as exc:
            if exc.retryable:
                raise _Retryable(str(exc)) from None
            raise
        signature = sign(
            method="GET",
            host=self._host,
            bucket=self.bucket,
            key=name,
            region=self.location.region,
            access_key_id=creds.access_key_id,
            access_key_secret=creds.access_key_secret,
            security_token=creds.security_token,
            now=datetime.now(UTC),
        )
        try:
            async with session.get(url, headers=signature.headers, timeout=_TIMEOUT, allow_redirects=False) as resp:
                if resp.status == 200:
                    return await _read_body(resp, limit)
                status = resp.status
                code = provider_code(await resp.content.read(_ERROR_BODY_MAX))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _Retryable(f"transport error, {type(exc).__name__}") from None
        if status == 404:
            raise InvalidPayloadRef(f"OSS object not found (HTTP 404, {code})")
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}, {code}")
        raise ObjectStoreError(f"OSS GET failed (HTTP {status}, {code})")

    async def aclose(self) -> None:
        """Close the HTTP session and its connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def close(self) -> None:
        """Close the session at shutdown; the store protocol's close is synchronous, so it is scheduled."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            session.detach()  # no loop left to close on: its transports went with it
            return
        self._closing = loop.create_task(session.close())


__all__ = ["ATTEMPTS", "BACKOFF_S", "REQUEST_TIMEOUT_S", "OssReader", "provider_code"]
