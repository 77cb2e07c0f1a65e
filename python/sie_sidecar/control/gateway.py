# SPDX-License-Identifier: Apache-2.0
"""The pool admission poller (sidecar-behaviour §8): `GET {gateway}/v1/pools` every check interval,
the first poll at once, each answer turned into a decision for `pipeline.admission.Admission`.

Errors are short, typed details (`transport: ...`, `HTTP 503`, `json: ...`, `shape: ...`) that become
the `status_error:<detail>` reason; the URL and the bearer never appear in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final

from ..errors import PoolsPollError, PoolsResponseError
from ..logs import should_log
from ..pipeline.admission import Admission, decide
from .http import get_json

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

POLL_TIMEOUT_S: Final = 5.0
#: A `/v1/pools` body larger than this is refused (a gateway lists pools, not payloads).
MAX_BODY_BYTES: Final = 8 << 20


def pools_url(gateway_url: str) -> str:
    return gateway_url.rstrip("/") + "/v1/pools"


async def fetch_pools(
    session: aiohttp.ClientSession, url: str, api_key: str | None, *, timeout_s: float = POLL_TIMEOUT_S
) -> Any:
    """One `GET /v1/pools` (bounded by `timeout_s`, redirects not followed): the decoded JSON body,
    or `PoolsPollError`."""
    return await get_json(session, url, api_key, timeout_s=timeout_s, max_bytes=MAX_BODY_BYTES, error=PoolsPollError)


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
            try:
                await poll_once(
                    session, admission, url=url, api_key=api_key, worker=worker, machine_profile=machine_profile
                )
            except Exception as exc:  # a defect must not end admission polling silently (fail closed)
                log.error("gateway pools poll failed unexpectedly", exc_info=exc)
                admission.record_error("internal error")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)


__all__ = ["MAX_BODY_BYTES", "POLL_TIMEOUT_S", "fetch_pools", "poll_forever", "poll_once", "pools_url"]
