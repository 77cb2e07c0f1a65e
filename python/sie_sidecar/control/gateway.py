# SPDX-License-Identifier: Apache-2.0
"""The pool admission poller (sidecar-behaviour §8): `GET {gateway}/v1/pools` every check interval,
the first poll at once, each answer turned into a decision for `pipeline.admission.Admission`.

Errors are short, typed details (`transport: ...`, `HTTP 503`, `json: ...`, `shape: ...`) that become
the `status_error:<detail>` reason; the URL and the bearer never appear in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, Final

from ..errors import PoolsPollError, PoolsResponseError
from ..logs import should_log
from ..pipeline.admission import Admission, decide

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

POLL_TIMEOUT_S: Final = 5.0
#: A `/v1/pools` body larger than this is refused (a gateway lists pools, not payloads).
MAX_BODY_BYTES: Final = 8 << 20
_DETAIL_MAX: Final = 120


def pools_url(gateway_url: str) -> str:
    return gateway_url.rstrip("/") + "/v1/pools"


async def fetch_pools(
    session: aiohttp.ClientSession, url: str, api_key: str | None, *, timeout_s: float = POLL_TIMEOUT_S
) -> Any:
    """One `GET /v1/pools` (bounded by `timeout_s`, redirects not followed): the decoded JSON body,
    or `PoolsPollError`."""
    import aiohttp

    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
        ) as response:
            if not 200 <= response.status < 300:
                raise PoolsPollError(f"HTTP {response.status}")
            if (response.content_length or 0) > MAX_BODY_BYTES:
                raise PoolsPollError(f"body over {MAX_BODY_BYTES} bytes")
            body = await _read_bounded(response.content)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise PoolsPollError(_short(f"transport: {type(exc).__name__}")) from None
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PoolsPollError(_short(f"json: {exc}")) from None


async def _read_bounded(content: aiohttp.StreamReader) -> bytes:
    """The whole body, refused past `MAX_BODY_BYTES` (a chunked body has no length to check first)."""
    parts: list[bytes] = []
    size = 0
    while chunk := await content.read(1 << 16):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise PoolsPollError(f"body over {MAX_BODY_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _short(detail: str) -> str:
    return detail if len(detail) <= _DETAIL_MAX else detail[: _DETAIL_MAX - 1] + "…"


async def poll_once(
    session: aiohttp.ClientSession,
    admission: Admission,
    *,
    url: str,
    api_key: str | None,
    worker: str,
    machine_profile: str,
) -> None:
    """Poll and record the decision, or the error."""
    try:
        body = await fetch_pools(session, url, api_key)
        decision = decide(body, pool=admission.pool, worker=worker, machine_profile=machine_profile)
    except PoolsPollError as exc:
        detail = exc.detail
    except PoolsResponseError as exc:
        detail = f"shape: {exc}"
    else:
        admission.record(decision)
        return
    if should_log(admission.errors + 1):
        log.warning("gateway pools poll failed", extra={"error": detail, "failures": admission.errors + 1})
    admission.record_error(detail)


async def poll_forever(
    admission: Admission,
    stop: asyncio.Event,
    *,
    gateway_url: str,
    api_key: str | None,
    worker: str,
    machine_profile: str,
    interval_s: float,
) -> None:
    """The first poll at once, then one per `interval_s` until `stop`."""
    import aiohttp

    url = pools_url(gateway_url)
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            await poll_once(
                session, admission, url=url, api_key=api_key, worker=worker, machine_profile=machine_profile
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)


__all__ = ["MAX_BODY_BYTES", "POLL_TIMEOUT_S", "fetch_pools", "poll_forever", "poll_once", "pools_url"]
