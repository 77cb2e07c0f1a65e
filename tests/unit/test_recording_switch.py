# SPDX-License-Identifier: Apache-2.0
"""Recording starts with OTLP metrics, else at the first read of `/debug/state` (telemetry/switch.py):
held attachments run once, in order; a lane that already holds work gets its metrics with that work
counted in, so the queue depth (moved by deltas) reads true and never goes below zero."""

from __future__ import annotations

import asyncio
from typing import Any

from sie_sidecar.config import Settings
from sie_sidecar.sched.scheduler import ModelScheduler, SchedulerConfig
from sie_sidecar.telemetry import QUEUE_DEPTH, ModelCatalog, QueueDepth, RecordingSwitch, Registry
from sie_sidecar.telemetry.lane_metrics import LaneMetrics


def test_held_attachments_run_once_in_order_at_turn_on() -> None:
    ran: list[str] = []
    switch = RecordingSwitch(now=False)
    switch.when_on(lambda: ran.append("a"))
    switch.when_on(lambda: ran.append("b"))
    assert ran == [] and switch.on is False
    switch.turn_on()
    switch.turn_on()
    assert ran == ["a", "b"] and switch.on is True
    switch.when_on(lambda: ran.append("c"))  # once on, an attachment runs at once
    assert ran == ["a", "b", "c"]


def test_metrics_on_records_from_the_start() -> None:
    ran: list[str] = []
    RecordingSwitch(now=True).when_on(lambda: ran.append("now"))
    assert ran == ["now"]


def _depth(registry: Registry) -> dict[tuple[tuple[str, str], ...], float]:
    return {p.attrs: p.value for p in registry.snapshot() if p.name == QUEUE_DEPTH}


async def test_a_lane_attached_mid_run_counts_what_it_already_holds() -> None:
    registry = Registry()
    catalog = ModelCatalog(("m",))
    ran: list[Any] = []

    async def execute(*args: Any) -> None:
        ran.append(args)

    config = SchedulerConfig(
        max_batch_cost=10_000,
        max_batch_requests=100,
        max_batch_wait_ms=60_000.0,
        coalesce_ms=60_000.0,
        idle_bypass=False,
        jit_dispatch=False,
    )
    scheduler: ModelScheduler[int] = ModelScheduler("m", execute, config, telemetry=registry)
    scheduler.submit("encode", "", [1, 2, 3], [1, 1, 1])
    await asyncio.sleep(0)
    metrics = LaneMetrics(registry, catalog, QueueDepth(registry, catalog, QUEUE_DEPTH), "m")
    scheduler.attach_metrics(metrics)
    assert sum(_depth(registry).values()) == 3
    await scheduler.close(0.0)  # the three leave unsent: the depth comes back to zero, not -3
    assert sum(_depth(registry).values()) == 0


def test_the_settings_decide_when_recording_starts() -> None:
    from sie_sidecar.runtime.telemetry_side import recording_switch

    base = {"SIE_NATS_URL": "nats://127.0.0.1:4222", "SIE_POOL": "p", "SIE_BUNDLE": "b", "SIE_MACHINE_PROFILE": "m"}
    assert recording_switch(Settings.from_env(base)).on is False  # the state endpoint: at its first read
    with_metrics = base | {"SIE_METRICS_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert recording_switch(Settings.from_env(with_metrics)).on is True
