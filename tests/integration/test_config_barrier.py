# SPDX-License-Identifier: Apache-2.0
"""The execution barrier refuses a model the committed config marks unsupported (sidecar-behaviour
§4.2 "Config barrier refuses", §5.4 per-batch reason labels, §5.5, all newer than v0.7.1): the real
sidecar over a real nats-server, the reference backend on its Unix socket, and an OTLP receiver.

A config write holds the barrier while the backend applies it; the reference backend's `sleep` is
given a gate here, so the write stays in the backend until the test lets it go. Meanwhile an item
passes the group pre-check (its model is still supported), is scheduled, and its batch waits at
the barrier. The write commits `unsupported: true` for that model; the batch then enters the
barrier, finds the model unsupported and is NAKed with the base delay and the NATS metric reason
`model_unsupported`, never reaching the backend."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from sie_sidecar.backend.null import NullAdapter

from .conftest import NatsServer
from .otlp_receiver import otlp_receiver
from .stack import MODEL, running_stack, work_item
from .test_live_config import DEBUG_ENV, SUBJECT, debug, doc, hash_of, unsupported_naks

pytestmark = pytest.mark.timeout(60)


class WriteGate:
    """The reference backend's `sleep`: only its config writes sleep here (no cost model is set),
    and each waits until `release` is set; `entered` tells that a write reached the backend."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.entered.set()
        await self.release.wait()


def _attrs(point: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


async def _lane(stack: Any) -> dict[str, Any]:
    state: dict[str, Any] = (await debug(stack))["models"].get(MODEL, {})
    return state


async def test_a_batch_held_at_the_barrier_is_naked_when_its_model_became_unsupported(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    gate = WriteGate()
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], config_apply_delay_s=1.0, sleep=gate.sleep)
    async with otlp_receiver() as receiver:
        env = DEBUG_ENV | {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
        }
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
            warm = await stack.publish(work_item(text="warm"))
            await stack.wait_for(lambda: len(stack.results_for(warm)) == 1)
            await stack.settled_pool()
            executed = adapter.items

            config = f"sie_id: {MODEL}\nunsupported: true"
            note = doc(model_id=MODEL, model_config=config, bundle_config_hash=hash_of({MODEL: config}))
            await stack.nc.publish(SUBJECT, note)
            await asyncio.wait_for(gate.entered.wait(), 10)  # the write holds the barrier exclusively
            state = await debug(stack)
            assert state["config"]["config_writer_waiting"] is True
            assert state["config"]["unsupported_models"] == []  # not committed yet

            held = await stack.publish(work_item(text="held at the barrier"))
            deadline = time.monotonic() + 10
            while (await _lane(stack)).get("in_flight_batches") != 1:  # past the pre-check, at the barrier
                assert time.monotonic() < deadline, "the batch never reached the barrier"
                await asyncio.sleep(0.02)
            assert (await debug(stack))["config"]["executions"] == 0  # waiting, not executing
            assert await unsupported_naks(stack) == 0
            assert (await stack.pool_consumer()).num_redelivered == 0

            gate.release.set()  # the write commits, then the held batch enters the barrier
            deadline = time.monotonic() + 10
            while await unsupported_naks(stack) < 1:
                assert time.monotonic() < deadline, "the held batch was not NAKed"
                await asyncio.sleep(0.02)
            assert (await debug(stack))["config"]["unsupported_models"] == [MODEL]
            assert adapter.items == executed and not stack.results_for(held)  # never executed
            assert adapter.batches_during_config_write == 0
            # NAKed with the base delay: it comes back, and is refused again, now at the pre-check.
            deadline = time.monotonic() + 10
            while await unsupported_naks(stack) < 2:
                assert time.monotonic() < deadline, "the held item was not redelivered and refused again"
                await asyncio.sleep(0.02)
            assert (await stack.pool_consumer()).num_redelivered >= 1
            assert adapter.items == executed and not stack.results_for(held)
        # §13 / §5.4: the NAKs arrive in the metrics with the reason label `model_unsupported`.
        metrics = receiver.last_metrics()
        naks = {
            (_attrs(p)["reason"], _attrs(p)["outcome"]): p.as_double
            for p in metrics["sie.worker.nats.operations"].sum.data_points
            if _attrs(p)["operation"] == "nak"
        }
        assert naks[("model_unsupported", "success")] >= 2  # the barrier's, then the pre-check's
