# SPDX-License-Identifier: Apache-2.0
"""Shutdown steps that run into their bounds (sidecar-behaviour §15.1, §15.4): the real sidecar over a
real nats-server and the reference backend on its Unix socket. A readiness probe never answered
(a proxy in front of the backend swallows it) holds the pull-loop task join for its 10 s; a
`Drain` never answered holds the backend drain for its 15 s (plus the second `_drain` gives the
answer); a generation that streams a token a minute holds the generation join for its 15 s. Each
time the sidecar still exits, within that bound and the few seconds of the other steps, and the
unfinished work stays in the stream for redelivery. The bounds are the real ones: nothing here
shortens them. A frozen nats-server runs both health tombstones into their 2 s bounds."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.runtime.drain import BACKEND_DRAIN_WAIT_S, GENERATION_JOIN_S, HEALTH_TOMBSTONE_WAIT_S, TASK_JOIN_S

from ..pipeline.test_hostile_backend import hostile_proxy
from .conftest import NatsServer
from .otlp_receiver import otlp_receiver
from .stack import MODEL, Stack, running_stack, start_stack, work_item
from .test_generation import adapter as streaming_adapter
from .test_generation import chunks_for, generate_item

pytestmark = pytest.mark.timeout(90)

#: What the other shutdown steps may add to a bound that ran out: the pull loops' last request
#: (SIE_NATS_PULL_EXPIRES_S is 1 s here), the scheduler drain, the last OTLP push, closing NATS.
OTHER_STEPS_S = 5.0
FAST_PULLS = {"SIE_NATS_PULL_EXPIRES_S": "1"}


async def _stop_timed(stack: Stack) -> tuple[int, float]:
    """SIGTERM's event, then the sidecar's exit code and how long it took to exit."""
    started = time.monotonic()
    stack.stop.set()
    code = await asyncio.wait_for(
        stack.task, TASK_JOIN_S + GENERATION_JOIN_S + BACKEND_DRAIN_WAIT_S + 2 * OTHER_STEPS_S
    )
    return code, time.monotonic() - started


def _attrs(point: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


async def test_a_group_stuck_in_readiness_holds_the_task_join_for_its_bound_then_the_sidecar_exits(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """§15.4 step 1: the pull loop waits at most 10 s for its in-flight batch tasks. A proxy in front
    of the reference backend swallows `EnsureModelReady`, so the task handling the pulled batch
    waits in the readiness probe (its own timeout is 900 s): the join runs out, the task is
    cancelled, the drain is recorded as `deadline_exceeded` (§13), and the item is neither answered
    nor settled: it is still un-ACKed on the consumer, for redelivery after ack_wait."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    backend = BackendServer(adapter, str(tmp_path / "backend.sock"), worker_id="backend-0")
    await backend.start()
    try:
        async with otlp_receiver() as receiver, hostile_proxy(tmp_path) as (proxy, proxy_sock):
            proxy.intercepted, proxy.mode = "EnsureModelReady", "silent"
            env = FAST_PULLS | {
                "SIE_METRICS_ENABLED": "true",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
                "OTEL_METRIC_EXPORT_INTERVAL": "200",
            }
            stack = await start_stack(nats_server, tmp_path, adapter=adapter, env=env, external_backend=proxy_sock)
            try:
                wid = await stack.publish(work_item(text="never ready"))
                await stack.wait_for(lambda: proxy.hostile_answers == 1)  # the probe is unanswered
                code, took = await _stop_timed(stack)
                assert code == 0
                assert TASK_JOIN_S <= took < TASK_JOIN_S + OTHER_STEPS_S, took
                assert stack.results_for(wid) == [] and adapter.batches == 0
                consumer = await stack.pool_consumer()
                assert (consumer.num_ack_pending, consumer.num_redelivered) == (1, 0)  # left to ack_wait
            finally:
                stack.stop.set()
                await stack.nc.close()
            (drain,) = receiver.last_metrics()["sie.worker.shutdown.drain.duration"].histogram.data_points
            assert _attrs(drain)["outcome"] == "deadline_exceeded" and drain.count == 1
            assert TASK_JOIN_S <= drain.sum < took
    finally:
        await backend.close()


async def test_a_backend_that_never_answers_drain_holds_the_drain_for_its_bound(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """§15.4 step 7: the backend drain is bounded (15 s, and a second for the answer). A proxy in
    front of the reference backend forwards everything but `Drain`, which it swallows: the sidecar
    waits out the bound and exits; the work it had answered before stays answered."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    backend = BackendServer(adapter, str(tmp_path / "backend.sock"), worker_id="backend-0")
    await backend.start()
    try:
        async with hostile_proxy(tmp_path) as (proxy, proxy_sock):
            proxy.intercepted, proxy.mode = "Drain", "silent"
            stack = await start_stack(
                nats_server, tmp_path, adapter=adapter, env=FAST_PULLS, external_backend=proxy_sock
            )
            try:
                wid = await stack.publish(work_item(text="served before the stop"))
                await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
                await stack.settled_pool()
                code, took = await _stop_timed(stack)
            finally:
                stack.stop.set()
                await stack.nc.close()
            assert code == 0
            assert proxy.hostile_answers == 1  # the one Drain, never answered
            assert BACKEND_DRAIN_WAIT_S <= took < BACKEND_DRAIN_WAIT_S + OTHER_STEPS_S, took
            assert backend.draining is False  # the backend itself never heard of the drain
            assert len(stack.results_for(wid)) == 1
    finally:
        await backend.close()


async def test_a_generation_that_never_ends_holds_the_generation_join_for_its_bound(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """§15.4 step 6: generation tasks are joined for at most 15 s. The reference backend streams one
    token a minute: the join runs out, the generation task is cancelled and its item goes back
    to the stream unanswered (no terminal chunk), and the sidecar exits."""
    async with running_stack(
        nats_server, tmp_path, adapter=streaming_adapter(token_delay_s=60.0), env=FAST_PULLS
    ) as stack:
        item = generate_item(max_new_tokens=5)
        await stack.publish(item)
        rid = item["request_id"]
        await stack.wait_for(lambda: stack.adapter.generator.streams == 1)  # the stream is at the backend
        code, took = await _stop_timed(stack)
        assert code == 0
        assert GENERATION_JOIN_S <= took < GENERATION_JOIN_S + OTHER_STEPS_S, took
        assert not any(c.get("done") for c in chunks_for(stack, rid))
        consumer = await stack.pool_consumer()
        assert consumer.num_pending + consumer.num_ack_pending == 1  # still in the stream


async def test_a_frozen_nats_server_bounds_the_health_tombstones_and_the_sidecar_exits(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """§15.4 step 3: the publisher's tombstone is waited for at most 2 s, then main sends its own,
    flushed for at most 2 s. With the server frozen (SIGSTOP: the socket open, nothing answered)
    neither tombstone can be flushed: both are given up at their bounds, 2 s apart, and the sidecar
    still exits. (The publisher cannot outlast the 2 s wait: its own flush is bounded at 2 s.)"""
    stack = await start_stack(nats_server, tmp_path, env=FAST_PULLS)
    try:
        wid = await stack.publish(work_item(text="served before the freeze"))
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        await stack.settled_pool()
        caplog.set_level(logging.WARNING, logger="sie_sidecar.bus.health")
        await nats_server.freeze()
        try:
            code, took = await _stop_timed(stack)
        finally:
            nats_server.thaw()
    finally:
        await stack.close()  # the sidecar has exited; this closes the backend and the test's client
    assert code == 0
    given_up = [r.created for r in caplog.records if r.getMessage() == "health tombstone not published"]
    assert len(given_up) == 2, [r.getMessage() for r in caplog.records]
    assert 1.5 <= given_up[1] - given_up[0] <= 2 * HEALTH_TOMBSTONE_WAIT_S + 0.5, given_up
    assert took < TASK_JOIN_S + 2 * HEALTH_TOMBSTONE_WAIT_S + OTHER_STEPS_S, took
