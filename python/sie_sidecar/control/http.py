# SPDX-License-Identifier: Apache-2.0
"""Bounded JSON GETs for the control-plane pollers (gateway pools, config service).

One request: bearer when given, a total timeout, redirects not followed (a redirect would carry the
bearer elsewhere), non-2xx refused, the body bounded while it is read (a chunked body has no length
to check first). Failures raise the caller's error type with a short detail that names neither the
URL nor the bearer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import aiohttp

_DETAIL_MAX: Final = 120


def short(detail: str) -> str:
    """A detail cut to a log-friendly length."""
    return detail if len(detail) <= _DETAIL_MAX else detail[: _DETAIL_MAX - 1] + "…"


async def get_json(
    session: aiohttp.ClientSession,
    url: str,
    bearer: str | None,
    *,
    timeout_s: float,
    max_bytes: int,
    error: Callable[[str], Exception],
) -> Any:
    """The decoded JSON body of `GET url`, or `error(detail)` raised."""
    import aiohttp

    headers = {"Accept": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    try:
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
        ) as response:
            if not 200 <= response.status < 300:
                raise error(f"HTTP {response.status}")
            if (response.content_length or 0) > max_bytes:
                raise error(f"body over {max_bytes} bytes")
            body = await _read_bounded(response.content, max_bytes, error)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise error(short(f"transport: {type(exc).__name__}")) from None
    except ValueError:  # aiohttp refuses, e.g., userinfo in the URL together with a bearer
        raise error("request: the URL cannot be used (credentials in the URL and a bearer?)") from None
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(short(f"json: {exc}")) from None


async def _read_bounded(content: aiohttp.StreamReader, max_bytes: int, error: Callable[[str], Exception]) -> bytes:
    parts: list[bytes] = []
    size = 0
    while chunk := await content.read(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise error(f"body over {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


__all__ = ["get_json", "short"]
