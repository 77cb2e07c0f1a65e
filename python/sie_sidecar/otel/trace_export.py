# SPDX-License-Identifier: Apache-2.0
"""The OTLP/HTTP push of batch spans: the span buffer drained every schedule delay (5 s,
`OTEL_BSP_SCHEDULE_DELAY`) or as soon as a full export batch waits, and once more at shutdown.

Telemetry never affects serving: a failed export is logged (rate-limited) and its spans go back to
the bounded buffer, which drops its oldest (counted) while the receiver stays away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..logs import Throttled
from .export import CONTENT_TYPE, EXPORT_TIMEOUT_S
from .tracing import SpanBuffer, SpanRecord

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)
_warn = Throttled(log)


def _open_session() -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession()


class TraceExporter:
    """Pushes one span buffer to one OTLP/HTTP traces endpoint."""

    def __init__(
        self,
        buffer: SpanBuffer,
        endpoint: str,
        *,
        resource: Mapping[str, str],
        interval_s: float = 5.0,
        version: str = "",
    ) -> None:
        self._buffer = buffer
        self._endpoint = endpoint
        self._resource = dict(resource)
        self._interval_s = interval_s
        self._version = version
        self._dropped_seen = 0
        self.exports = 0
        self.failures = 0

    def body(self, spans: Sequence[SpanRecord]) -> bytes:
        from .traces import encode_spans  # protobuf loads at the first push, not at start-up

        return encode_spans(spans, resource=self._resource, version=self._version)

    async def export(self, session: aiohttp.ClientSession, spans: Sequence[SpanRecord]) -> bool:
        """One POST; False (logged) when the receiver did not take it."""
        import aiohttp

        try:
            async with session.post(
                self._endpoint,
                data=self.body(spans),
                headers={"Content-Type": CONTENT_TYPE},
                timeout=aiohttp.ClientTimeout(total=EXPORT_TIMEOUT_S),
                allow_redirects=False,
            ) as response:
                await response.read()
                if response.status // 100 != 2:
                    raise RuntimeError(f"HTTP {response.status}")
        except Exception as exc:
            self.failures += 1
            _warn.warning("OTLP traces export failed", key="otlp-traces", extra={"error": repr(exc)})
            return False
        self.exports += 1
        return True

    async def flush(self, session: aiohttp.ClientSession) -> None:
        """Export batches until the buffer is empty or an export fails (its spans go back)."""
        buffer = self._buffer
        while len(buffer):
            spans = buffer.take()
            if not await self.export(session, spans):
                buffer.restore(spans)
                break
        if buffer.dropped != self._dropped_seen:
            _warn.warning(
                "OTLP trace buffer full: oldest spans dropped",
                key="otlp-traces-dropped",
                extra={"dropped": buffer.dropped - self._dropped_seen, "capacity": buffer.capacity},
            )
            self._dropped_seen = buffer.dropped

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every interval (or when a full batch waits) until `stop`, then once more. Nothing
        is imported or opened before there is a span to send."""
        wake = asyncio.Event()
        self._buffer.wake = wake.set
        stopped = asyncio.ensure_future(stop.wait())
        session: aiohttp.ClientSession | None = None
        try:
            while not stop.is_set():
                woken = asyncio.ensure_future(wake.wait())
                await asyncio.wait({stopped, woken}, timeout=self._interval_s, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                wake.clear()
                if not stop.is_set() and len(self._buffer):
                    session = session or _open_session()
                    await self.flush(session)
            if len(self._buffer):
                session = session or _open_session()
                await self.flush(session)
        finally:
            self._buffer.wake = None
            stopped.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopped
            if session is not None:
                await session.close()


__all__ = ["TraceExporter"]
