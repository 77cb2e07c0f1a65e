# SPDX-License-Identifier: Apache-2.0
"""The OTLP push (sidecar-behaviour §13): every export interval (5 s, `OTEL_METRIC_EXPORT_INTERVAL`)
one request carrying the registry's snapshot, and a last one at shutdown so the final counts are not
lost. The transport is chosen by the §1.2 protocol: `http/protobuf` is a POST here, `grpc` (the
OTLP default) is `grpc_export`.

Telemetry never affects serving: a failed export is logged (rate-limited) and the next one carries
the cumulative values anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

from ..logs import Throttled
from ..telemetry import Registry
from .http_post import HttpPost
from .metrics import encode_metrics

log = logging.getLogger(__name__)
_warn = Throttled(log)

EXPORT_TIMEOUT_S: Final = 10.0
CONTENT_TYPE: Final = "application/x-protobuf"
#: The §1.2 protocols this build exports; anything else leaves metrics off (config.py warns).
PROTOCOLS: Final = ("grpc", "http/protobuf")

C = TypeVar("C")


class PushExporter(ABC, Generic[C]):
    """One registry pushed to one OTLP endpoint over a connection of type C, opened at the first push
    and closed after the last. Whatever the pushes import (the transport's client library: grpcio
    for gRPC; nothing for HTTP) is imported here, at start-up, not in the first push, where
    aiohttp's client (used then) stalled the serving event loop ~130 ms (docs/benchmarks.md)."""

    def __init__(
        self,
        registry: Registry,
        endpoint: str,
        *,
        resource: Mapping[str, str],
        lane: str,
        interval_s: float = 5.0,
        version: str = "",
    ) -> None:
        self._registry = registry
        self._endpoint = endpoint
        self._resource = dict(resource)
        self._lane = lane
        self._interval_s = interval_s
        self._version = version
        self._start_ns = time.time_ns()
        self.exports = 0
        self.failures = 0
        self._load()

    def body(self) -> bytes:
        """The snapshot as a serialized `ExportMetricsServiceRequest`: the same bytes for every transport."""
        return encode_metrics(
            self._registry.snapshot(),
            resource=self._resource,
            lane=self._lane,
            start_ns=self._start_ns,
            now_ns=time.time_ns(),
            version=self._version,
        )

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

    async def export(self, connection: C) -> bool:
        """One push; False (logged) when the receiver did not take it."""
        try:
            await self._send(connection, self.body())
        except Exception as exc:
            self.failures += 1
            _warn.warning("OTLP metrics export failed", key="otlp-metrics", extra={"error": repr(exc)})
            return False
        self.exports += 1
        return True

    async def _push(self, connection: C | None) -> C | None:
        """One export on `connection`, opened first if there is none yet. A connection that cannot be
        opened (an endpoint the transport refuses) counts as a failed export: it is tried again at the
        next push, and serving goes on."""
        if connection is None:
            try:
                connection = self._open()
            except Exception as exc:
                self.failures += 1
                _warn.warning("OTLP metrics export failed", key="otlp-metrics", extra={"error": repr(exc)})
                return None
        await self.export(connection)
        return connection

    async def run(self, stop: asyncio.Event) -> None:
        """Export every interval until `stop`, then once more."""
        connection: C | None = None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._interval_s):
                        await stop.wait()
                if not stop.is_set():
                    connection = await self._push(connection)
            connection = await self._push(connection)
        finally:
            if connection is not None:
                await self._close(connection)


class HttpTransport:
    """OTLP/HTTP for any signal's exporter (a mixin: the exporter sets `_endpoint`): one kept-alive
    connection (`http_post`, not aiohttp: see there), one protobuf POST per push; anything but a
    2xx is a failed push."""

    _endpoint: str

    def _load(self) -> None:
        """Nothing to import: `http_post` is asyncio streams."""

    def _open(self) -> HttpPost:
        return HttpPost(self._endpoint)

    async def _close(self, connection: HttpPost) -> None:
        await connection.close()

    async def _send(self, connection: HttpPost, body: bytes) -> None:
        status, _ = await connection.post(body, {"Content-Type": CONTENT_TYPE}, EXPORT_TIMEOUT_S)
        if status // 100 != 2:
            raise RuntimeError(f"HTTP {status}")


class MetricsExporter(HttpTransport, PushExporter[HttpPost]):
    """OTLP/HTTP: one protobuf POST per push to the metrics endpoint (`.../v1/metrics`)."""


def make_exporter(
    registry: Registry,
    endpoint: str,
    *,
    protocol: str,
    resource: Mapping[str, str],
    lane: str,
    interval_s: float = 5.0,
    version: str = "",
) -> PushExporter[Any]:
    """The exporter for the resolved §1.2 protocol. The gRPC one's module is imported only here, and
    grpcio only at its first push."""
    exporter: type[PushExporter[Any]]
    if protocol == "grpc":
        from .grpc_export import GrpcMetricsExporter

        exporter = GrpcMetricsExporter
    elif protocol == "http/protobuf":
        exporter = MetricsExporter
    else:
        raise ValueError(f"OTLP metrics protocol {protocol!r} is not one of {PROTOCOLS}")
    return exporter(registry, endpoint, resource=resource, lane=lane, interval_s=interval_s, version=version)


__all__ = ["PROTOCOLS", "MetricsExporter", "PushExporter", "make_exporter"]
