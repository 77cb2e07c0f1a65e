# SPDX-License-Identifier: Apache-2.0
"""The pieces of the drain (sidecar-behaviour §15.4) both ingest modes run, each in its own order,
their bounds (defined here once), and the worst case they add up to: a pod's termination grace
must cover `shutdown_bound_s`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from ..bus import ack_confirm
from ..bus import connect as connection
from ..config import Settings
from ..ipc.children import BackendChildren
from ..ipc.client import IpcClient
from ..pipeline.dispatcher import PARKED_JOIN_S, Dispatcher
from ..telemetry import SHUTDOWN_DRAIN_DURATION, Registry
from .telemetry_side import METRICS_FLUSH_S

#: How long the in-flight batches (and local calls) get to finish once pulling stopped (§15.4 step 1).
TASK_JOIN_S = 10.0
#: How long the health publisher gets to send its tombstone as it stops (§10).
HEALTH_TOMBSTONE_WAIT_S = 2.0
#: The backend Drain's deadline (§15.4 step 7).
BACKEND_DRAIN_MS = 15_000
#: How long the drain waits for the backend's Drain answer: its deadline and a second for the reply.
BACKEND_DRAIN_WAIT_S = BACKEND_DRAIN_MS / 1000.0 + 1
#: How long the generation tasks get before the unfinished ones are cancelled (§15.4 step 6).
GENERATION_JOIN_S = 15.0


async def end_tasks(tasks: list[asyncio.Task[Any]], *events: asyncio.Event) -> None:
    """Set the tasks' stop events, cancel them and wait for them; a no-op once they are done."""
    for event in events:
        event.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def stop_pulling(pull_stop: asyncio.Event, gate: asyncio.Task[None], loops: Sequence[asyncio.Task[None]]) -> None:
    """Stop taking work: the pull loops see the stop, the gate is cancelled, both are waited for."""
    pull_stop.set()
    gate.cancel()
    await asyncio.gather(*loops, gate, return_exceptions=True)


async def join_in_flight(tasks: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
    """Let the batches in flight finish and settle, for up to TASK_JOIN_S; the ones still running
    then are cancelled (their items come back) and returned."""
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=TASK_JOIN_S)
        for task in pending:
            task.cancel()
    return pending


async def drain_pipeline(dispatcher: Dispatcher, settings: Settings) -> None:
    """§15.4 steps 4-6, each bounded: parked groups hand their items back, the schedulers flush what
    is queued (the rest is NAKed to come back), generation tasks are joined (unfinished ones are
    cancelled and NAK their items)."""
    await dispatcher.join_parked()
    await dispatcher.close_schedulers(settings.scheduler_drain_deadline_ms / 1000.0)
    await dispatcher.generations.join(GENERATION_JOIN_S)


async def drain_backend(ipc: IpcClient | BackendChildren) -> None:
    """§15.4 step 7: ask the backend to drain, waiting BACKEND_DRAIN_WAIT_S at most; a failure is
    no reason to stop the shutdown."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ipc.drain(BACKEND_DRAIN_MS), BACKEND_DRAIN_WAIT_S)


def record_drain(telemetry: Registry, started: float, *, clean: bool) -> None:
    """`sie.worker.shutdown.drain.duration` (§13): how long the drain took, and whether in-flight work
    had to be cancelled at the join deadline."""
    outcome = "success" if clean else "deadline_exceeded"
    telemetry.record(SHUTDOWN_DRAIN_DURATION, time.monotonic() - started, (("outcome", outcome),))


def shutdown_bound_s(settings: Settings) -> float:
    """The longest a SIGTERM'd sidecar takes to exit when every bounded step of the NATS drain and the
    exit stack runs to its deadline: a pod's termination grace shorter than this lets the kubelet
    SIGKILL a drain that would have settled its batches (deploy/kubernetes is checked against it)."""
    pulls = settings.nats_pull_expires_s + 1.0  # the pull loops see the stop when their request ends
    drain = (
        TASK_JOIN_S
        + PARKED_JOIN_S
        + settings.scheduler_drain_deadline_ms / 1000.0
        + GENERATION_JOIN_S
        + HEALTH_TOMBSTONE_WAIT_S
        + BACKEND_DRAIN_WAIT_S
    )
    exporters = METRICS_FLUSH_S * 2  # the last OTLP metrics and traces pushes
    confirmations = ack_confirm.CLOSE_WAIT_S if settings.nats_ack_confirm_s > 0 else 0.0
    return pulls + drain + confirmations + connection.CLOSE_FLUSH_S + exporters


__all__ = [
    "BACKEND_DRAIN_MS",
    "BACKEND_DRAIN_WAIT_S",
    "GENERATION_JOIN_S",
    "HEALTH_TOMBSTONE_WAIT_S",
    "TASK_JOIN_S",
    "drain_backend",
    "drain_pipeline",
    "end_tasks",
    "join_in_flight",
    "record_drain",
    "shutdown_bound_s",
    "stop_pulling",
]
