# SPDX-License-Identifier: Apache-2.0
"""The OTLP push of batch spans: the span buffer drained every schedule delay (5 s,
`OTEL_BSP_SCHEDULE_DELAY`) or as soon as a full export batch waits, and once more at shutdown. The
transport is chosen by the §1.2 protocol: `http/protobuf` is a POST here (`TraceExporter`), `grpc`
(the OTLP default) is `grpc_export.GrpcTraceExporter`; both send the same serialized
`ExportTraceServiceRequest`.

Telemetry never affects serving: a failed export is logged (rate-limited) and its spans go back to
the front of the bounded buffer, which drops its oldest (counted) while the receiver stays away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

from ..logs import Throttled
from .export import HttpTransport
from .http_post import HttpPost
from .traces import encode_spans
from .tracing import SpanBuffer, SpanRecord

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: The §1.2 protocols spans are exported with; anything else leaves tracing off (config.py warns).
TRACE_PROTOCOLS: Final = ("grpc", "http/protobuf")

C = TypeVar("C")


class SpanExporter(ABC, Generic[C]):
    """Pushes one span buffer to one OTLP traces endpoint over a connection of type C, opened when
    the first span is to be sent and closed after the last. The transport's client library is
    imported here, at start-up, not at the first push (see PushExporter)."""

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
        self._load()

    def body(self, spans: Sequence[SpanRecord]) -> bytes:
        """The spans as a serialized `ExportTraceServiceRequest`: the same bytes for every transport."""
        return encode_spans(spans, resource=self._resource, version=self._version)

    @abstractmethod
    def _load(self) -> None:
        """Import the transport's client library (at construction, before the sidecar serves)."""

    @abstractmethod
    def _open(self) -> C:
        """The connection the pushes share (called in the running loop, at the first push)."""

    @abstractmethod
    async def _close(self, connection: C) -> None: ...

    @abstractmethod
    async def _send(self, connection: C, body: bytes) -> None:
        """One request; raises when the receiver did not take it."""

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        _warn.warning("OTLP traces export failed", key="otlp-traces", extra={"error": repr(exc)})

    async def export(self, connection: C, spans: Sequence[SpanRecord]) -> bool:
        """One request; False (logged) when the receiver did not take it."""
        try:
            await self._send(connection, self.body(spans))
        except Exception as exc:
            self._failed(exc)
            return False
        self.exports += 1
        return True

    async def flush(self, connection: C) -> None:
        """Export batches until the buffer is empty or an export fails (its spans go back)."""
        buffer = self._buffer
        while len(buffer):
            spans = buffer.take()
            if not await self.export(connection, spans):
                buffer.restore(spans)
                break
        self._report_dropped()

    def _report_dropped(self) -> None:
        buffer = self._buffer
        if buffer.dropped != self._dropped_seen:
            _warn.warning(
                "OTLP trace buffer full: oldest spans dropped",
                key="otlp-traces-dropped",
                extra={"dropped": buffer.dropped - self._dropped_seen, "capacity": buffer.capacity},
            )
            self._dropped_seen = buffer.dropped

    async def _push(self, connection: C | None) -> C | None:
        """A flush on `connection`, opened first if there is none yet. A connection that cannot be
        opened (an endpoint the transport refuses) counts as a failed export: the spans stay in the
        buffer, it is tried again at the next push, and serving goes on."""
        if connection is None:
            try:
                connection = self._open()
            except Exception as exc:
                self._failed(exc)
                self._report_dropped()
                return None
        await self.flush(connection)
        return connection

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every interval (or when a full batch waits) until `stop`, then once more. Nothing
        is opened before there is a span to send."""
        wake = asyncio.Event()
        self._buffer.wake = wake.set
        stopped = asyncio.ensure_future(stop.wait())
        connection: C | None = None
        try:
            while not stop.is_set():
                woken = asyncio.ensure_future(wake.wait())
                await asyncio.wait({stopped, woken}, timeout=self._interval_s, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                wake.clear()
                if not stop.is_set() and len(self._buffer):
                    connection = await self._push(connection)
            if len(self._buffer):
                connection = await self._push(connection)
        finally:
            self._buffer.wake = None
            stopped.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopped
            if connection is not None:
                await self._close(connection)


class TraceExporter(HttpTransport, SpanExporter[HttpPost]):
    """OTLP/HTTP: one protobuf POST per export batch to the traces endpoint (`.../v1/traces`)."""


def make_trace_exporter(
    buffer: SpanBuffer,
    endpoint: str,
    *,
    protocol: str,
    resource: Mapping[str, str],
    interval_s: float = 5.0,
    version: str = "",
) -> SpanExporter[Any]:
    """The span exporter for the resolved §1.2 traces protocol. The gRPC one's module is imported
    only here, and grpcio only at its first push."""
    exporter: type[SpanExporter[Any]]
    if protocol == "grpc":
        from .grpc_export import GrpcTraceExporter

        exporter = GrpcTraceExporter
    elif protocol == "http/protobuf":
        exporter = TraceExporter
    else:
        raise ValueError(f"OTLP traces protocol {protocol!r} is not one of {TRACE_PROTOCOLS}")
    return exporter(buffer, endpoint, resource=resource, interval_s=interval_s, version=version)


__all__ = ["TRACE_PROTOCOLS", "SpanExporter", "TraceExporter", "make_trace_exporter"]
