# SPDX-License-Identifier: Apache-2.0
"""The OTLP export (sidecar-behaviour §13), run by the OpenTelemetry SDK off the event loop.

`OtlpThread` is one daemon thread where the SDK lives: it imports the SDK, its OTLP exporters and
protobuf (~0.1 s of CPU, which the serving event loop never pays: docs/benchmarks.md), builds the
exporters, and runs each metrics export (the SDK's exporters block on their HTTP or gRPC call). The
event loop only takes the registry's snapshot, which is not thread-safe and is cheap, and hands it
over (`MetricsPush`); spans reach the SDK's `BatchSpanProcessor`, which has its own thread, as they
end (`TracePush`, through the tracer's `SpanBuffer`, which keeps them until the SDK is loaded).

Telemetry never affects serving: an export the receiver refuses is logged (rate-limited; the SDK
logs its reason) and the next one carries the cumulative values anyway; exporters that cannot be
built leave the signal off with one warning. A daemon thread, so an export still retrying at exit
does not hold the process.

Nothing here imports the SDK: this module is imported at start-up, the SDK in the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..logs import Throttled
from ..telemetry import Registry
from .target import Target
from .tracing import SpanBuffer

if TYPE_CHECKING:
    from .metrics import MetricsSender
    from .traces import SpanPipeline

log = logging.getLogger(__name__)
_warn = Throttled(log)
T = TypeVar("T")

_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the waiter gave up (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class OtlpThread:
    """One daemon thread running the SDK side of the export, one job at a time, in order: the first
    job (building an exporter) imports the SDK, so an export can never wait on an import made on
    the event loop. `call` returns an asyncio future of the job's result."""

    def __init__(self, name: str = "otlp-export") -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((lambda: fn(*args), loop, future))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, loop, future = job
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, result, error)

    def close(self) -> None:
        """Stop after the jobs already queued (a stuck export does not hold the process: daemon)."""
        self._jobs.put(None)


def freeze_when_built(built: asyncio.Future[Any]) -> None:
    """Freeze the heap again once the OTLP thread has imported the SDK and built its exporter.

    Why: start-up freezes its heap (`runtime.gc.tune_gc_for_steady_state`), but the SDK, its exporters
    and protobuf (some 19,000 tracked objects) are imported in the OTLP thread after that, so they
    stayed in the collected generations: with metrics on, steady CPU per item was 4% higher than
    with them frozen (docs/benchmarks.md, "Telemetry on"). Objects alive at that moment are frozen
    too; like start-up's, they are still freed by reference counting, only a cycle among them would
    outlive its use."""
    built.add_done_callback(lambda _: gc.freeze())


def _build_metrics(
    target: Target, *, resource: Mapping[str, str], lane: str, version: str, temporality: str, start_ns: int
) -> MetricsSender:
    from .metrics import MetricsBridge, MetricsSender
    from .sdk import make_resource, metric_exporter

    bridge = MetricsBridge(
        make_resource(resource), lane=lane, version=version, temporality=temporality, start_ns=start_ns
    )
    return MetricsSender(bridge, metric_exporter(target))


class MetricsPush:
    """The registry pushed to one OTLP endpoint by the SDK's exporter: every `interval_s`
    (`OTEL_METRIC_EXPORT_INTERVAL`) and once more at `stop`, so the final counts are not lost."""

    def __init__(
        self,
        registry: Registry,
        thread: OtlpThread,
        target: Target,
        *,
        resource: Mapping[str, str],
        lane: str,
        interval_s: float = 5.0,
        version: str = "",
        temporality: str = "cumulative",
    ) -> None:
        self._registry = registry
        self._thread = thread
        self._interval_s = interval_s
        self.exports = 0
        self.failures = 0
        build = functools.partial(
            _build_metrics,
            target,
            resource=dict(resource),
            lane=lane,
            version=version,
            temporality=temporality,
            start_ns=time.time_ns(),
        )
        self._sender = thread.call(build)
        freeze_when_built(self._sender)

    async def export(self) -> bool:
        """One export of the registry as it is now; False (logged) when it did not go out."""
        try:
            sender = await asyncio.shield(self._sender)
        except Exception as exc:
            _warn.warning(
                "OTLP metrics exporter not built: metrics are not exported",
                key="otlp-build",
                extra={"error": repr(exc)},
            )
            return False
        points = self._registry.snapshot()  # here, on the loop: the registry is the loop's
        try:
            sent = await self._thread.call(sender.send, points, time.time_ns())
        except Exception as exc:
            sent = False
            _warn.warning("OTLP metrics export failed", key="otlp-metrics", extra={"error": repr(exc)})
        else:
            if not sent:
                _warn.warning("OTLP metrics export failed", key="otlp-metrics")
        if sent:
            self.exports += 1
        else:
            self.failures += 1
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        """Export every interval until `stop`, then once more, then shut the exporter down."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await stop.wait()
            if not stop.is_set():
                await self.export()
        await self.export()
        if self._sender.done() and self._sender.exception() is None:
            with contextlib.suppress(Exception):
                await self._thread.call(self._sender.result().shutdown)


def _build_spans(
    target: Target,
    *,
    resource: Mapping[str, str],
    version: str,
    max_queue_size: int,
    schedule_delay_s: float,
    max_export_batch_size: int,
    export_timeout_s: float,
) -> SpanPipeline:
    from .sdk import make_resource, span_exporter
    from .traces import SpanPipeline

    return SpanPipeline(
        span_exporter(target),
        make_resource(resource),
        version=version,
        max_queue_size=max_queue_size,
        schedule_delay_s=schedule_delay_s,
        max_export_batch_size=max_export_batch_size,
        export_timeout_s=export_timeout_s,
    )


class TracePush:
    """Batch spans to one OTLP endpoint through the SDK's `BatchSpanProcessor` (`OTEL_BSP_*`): once
    the SDK is loaded in the OTLP thread, the tracer's buffer forwards each span to the processor as
    it ends (the spans kept until then first); at `stop` the processor exports what it holds."""

    def __init__(
        self,
        buffer: SpanBuffer,
        thread: OtlpThread,
        target: Target,
        *,
        resource: Mapping[str, str],
        version: str = "",
        max_queue_size: int = 2048,
        schedule_delay_s: float = 5.0,
        max_export_batch_size: int = 512,
        export_timeout_s: float = 30.0,
    ) -> None:
        self._buffer = buffer
        self._thread = thread
        build = functools.partial(
            _build_spans,
            target,
            resource=dict(resource),
            version=version,
            max_queue_size=max_queue_size,
            schedule_delay_s=schedule_delay_s,
            max_export_batch_size=max_export_batch_size,
            export_timeout_s=export_timeout_s,
        )
        self._pipeline = thread.call(build)
        freeze_when_built(self._pipeline)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            pipeline = await asyncio.shield(self._pipeline)
        except Exception as exc:
            log.warning("OTLP span exporter not built: spans are not exported", extra={"error": repr(exc)})
            return
        self._buffer.attach(pipeline.forward)
        try:
            await stop.wait()
        finally:
            self._buffer.detach()
            dropped = self._buffer.dropped
            if dropped:
                log.warning("OTLP spans dropped before the exporter was ready", extra={"dropped": dropped})
            await self._thread.call(pipeline.shutdown)


__all__ = ["MetricsPush", "OtlpThread", "TracePush", "freeze_when_built"]
