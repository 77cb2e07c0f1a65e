# SPDX-License-Identifier: Apache-2.0
"""What both ingest modes wire for telemetry (sidecar-behaviour §13): when recording starts, the
(model, profile) catalog, OTLP metrics and batch spans, and the resource both signals carry. The
exporters run until the exit stack closes, after the drain, so the last counts and spans go out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..ipc.children import BackendChildren
from ..ipc.client import IpcClient, observe_ipc
from ..otel.tracer import Tracer
from ..payloads import PayloadStore
from ..pipeline.dispatcher import ConfigState, Dispatcher
from ..telemetry import ModelCatalog, RecordingSwitch, Registry

if TYPE_CHECKING:
    from ..config import OtlpTransport
    from ..otel.target import Target

log = logging.getLogger(__name__)

#: How long an exporter gets for its last push once the exit stack closes.
METRICS_FLUSH_S = 5.0


def recording_switch(settings: Settings) -> RecordingSwitch:
    """Recording starts with the process when OTLP metrics are on; otherwise at the first read of
    `/debug/state` (telemetry/switch.py), or never."""
    return RecordingSwitch(now=settings.metrics_enabled)


def attach_catalog(settings: Settings, config: ConfigState, dispatcher: Dispatcher, recording: RecordingSwitch) -> None:
    """The §13 (model, profile) catalog, seeded from SIE_METRIC_MODEL_ALLOWLIST; live config extends
    and replaces it. The model lanes record with it once recording is on."""
    config.catalog = ModelCatalog(settings.otel.model_allowlist)

    def attach() -> None:
        assert config.catalog is not None
        dispatcher.record_with(config.catalog)
        dispatcher.generations.telemetry = dispatcher.telemetry

    recording.when_on(attach)


def otel_resource(settings: Settings) -> dict[str, str]:
    """The §13 resource both OTLP signals carry: the sidecar's attributes (`service.instance.id` is
    the worker id, so pods' series stay apart), `OTEL_RESOURCE_ATTRIBUTES` over them, then
    `service.name`, `deployment.environment` and `cloud.region` as config.py resolved them (their
    own variables first, then `OTEL_RESOURCE_ATTRIBUTES`, then the defaults)."""
    from .. import __version__

    otel = settings.otel
    attributes = {"service.version": __version__, "service.instance.id": settings.worker_id}
    attributes.update(otel.resource_attributes)
    attributes.update(
        {
            "service.name": otel.service_name,
            "deployment.environment": otel.deployment_environment,
            "cloud.region": otel.cloud_region,
        }
    )
    return attributes


def otlp_target(endpoint: str, protocol: str, transport: OtlpTransport) -> Target:
    """One signal's resolved OTLP settings, as otel/ takes them (it imports nothing of config)."""
    from ..otel.target import Target

    return Target(
        endpoint,
        protocol,
        headers=transport.headers.reveal(),
        compression=transport.compression,
        certificate=transport.certificate,
        client_key=transport.client_key,
        client_certificate=transport.client_certificate,
        timeout_s=transport.timeout_s,
        insecure=transport.insecure,
    )


def _flush_on_exit(
    resources: contextlib.AsyncExitStack, name: str, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]
) -> None:
    """Run `run(stop)` as a task; when the exit stack closes (after the drain) set `stop` and give the
    task METRICS_FLUSH_S for its last export."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop), name=name)

    async def flush() -> None:
        stop.set()
        _, pending = await asyncio.wait({task}, timeout=METRICS_FLUSH_S)
        for late in pending:
            late.cancel()

    resources.push_async_callback(flush)


def start_metrics(
    settings: Settings,
    telemetry: Registry,
    resources: contextlib.AsyncExitStack,
    ipc: IpcClient | BackendChildren,
    payloads: PayloadStore,
    *,
    recording: RecordingSwitch,
) -> None:
    """OTLP metrics (§13) when enabled: the OpenTelemetry SDK's exporter, fed the registry's snapshot
    every export interval, and a last one when the exit stack closes (after the drain, so the final
    counts go out). Only then (or with the debug endpoint, which `sie-sidecar top` reads) do the IPC
    clients record per request: disabled, that costs nothing."""
    otel = settings.otel
    endpoint = otel.metrics_endpoint

    def attach() -> None:
        clients = list(ipc.clients) if isinstance(ipc, BackendChildren) else [ipc]
        for client in clients:
            client.telemetry = telemetry
        payloads.telemetry = telemetry
        observe_ipc(telemetry, clients)

    recording.when_on(attach)
    if not settings.metrics_enabled or endpoint is None:
        return
    from .. import __version__
    from ..otel.export import MetricsPush, OtlpThread

    thread = OtlpThread("otlp-metrics")
    resources.callback(thread.close)  # after the last export (the exit stack unwinds in reverse)
    push = MetricsPush(
        telemetry,
        thread,
        otlp_target(endpoint, otel.metrics_protocol, otel.metrics_transport),
        resource=otel_resource(settings),
        lane=otel.lane,
        interval_s=otel.export_interval_s,
        version=__version__,
        temporality=otel.metrics_temporality,
    )
    _flush_on_exit(resources, "otlp-metrics", push.run)
    log.info(
        "OTLP metrics on",
        extra={"endpoint": endpoint, "protocol": otel.metrics_protocol, "interval_s": otel.export_interval_s},
    )


def start_tracing(settings: Settings, resources: contextlib.AsyncExitStack) -> Tracer | None:
    """Batch spans (`SIE_TRACING_ENABLED`) when enabled: sampled from OTEL_TRACES_SAMPLER, handed to
    the OpenTelemetry SDK's batch span processor (OTEL_BSP_*) as they end, and what it holds exported
    (bounded) when the exit stack closes, after the drain."""
    otel = settings.otel
    if not settings.tracing_enabled or otel.traces_endpoint is None:
        return None
    from .. import __version__
    from ..otel.export import OtlpThread, TracePush
    from ..otel.tracing import Sampler, SpanBuffer

    buffer = SpanBuffer(otel.traces_max_queue)
    tracer = Tracer(Sampler(otel.traces_sampler, otel.traces_sampler_ratio), buffer, lane=otel.lane)
    thread = OtlpThread("otlp-traces")
    resources.callback(thread.close)
    push = TracePush(
        buffer,
        thread,
        otlp_target(otel.traces_endpoint, otel.traces_protocol, otel.traces_transport),
        resource=otel_resource(settings),
        version=__version__,
        max_queue_size=otel.traces_max_queue,
        schedule_delay_s=otel.traces_schedule_delay_s,
        max_export_batch_size=otel.traces_max_export_batch,
        export_timeout_s=otel.traces_export_timeout_s,
    )
    _flush_on_exit(resources, "otlp-traces", push.run)
    log.info(
        "OTLP traces on",
        extra={"endpoint": otel.traces_endpoint, "protocol": otel.traces_protocol, "sampler": otel.traces_sampler},
    )
    return tracer


__all__ = [
    "METRICS_FLUSH_S",
    "attach_catalog",
    "otel_resource",
    "otlp_target",
    "recording_switch",
    "start_metrics",
    "start_tracing",
]
