# SPDX-License-Identifier: Apache-2.0
"""OTLP metrics (sidecar-behaviour §13, issue 14 part 1) proven with a real receiver: the real
sidecar over a real nats-server and backend pushes its registry as OTLP/HTTP protobuf through the
OpenTelemetry SDK's exporter; what arrives carries the §13 names, units and the fixed `lane`, the
resource of §1.2 (with `service.instance.id`, the worker id), and counts equal to the work done."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar.backend import NullAdapter
from sie_sidecar.telemetry import (
    ADAPTIVE_WAIT,
    BATCH_COST,
    BATCH_FILL_RATIO,
    BATCH_SIZE,
    DISPATCH_WAIT,
    INSTRUMENTS,
    IPC_ACQUIRE_DURATION,
    IPC_CAPACITY,
    IPC_REQUESTS,
    IPC_RESPONSE_CHUNKS,
    NATS_DELIVERY_ATTEMPTS,
    NATS_OPERATIONS,
    QUEUE_DEPTH,
    QUEUE_DURATION,
    REQUEST_BATCH_TOTAL,
)
from sie_sidecar.telemetry.catalog import FLUSH_REASONS

from .conftest import NatsServer
from .otlp_receiver import otlp_receiver
from .stack import MODEL, running_stack, work_item

pytestmark = pytest.mark.timeout(60)


def _attrs(point: object) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}  # type: ignore[attr-defined]


async def test_the_batches_the_backend_saw_arrive_as_otlp_metrics(nats_server: NatsServer, tmp_path: Path) -> None:
    store = tmp_path / "payloads"
    store.mkdir()
    (store / "item.msgpack").write_bytes(msgpack.packb({"text": "from the store"}))
    async with otlp_receiver() as receiver:
        env = {
            "SIE_PAYLOAD_STORE_URL": f"file://{store}",
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_SERVICE_NAME": "sidecar-under-test",
            "SIE_OTEL_LANE": "default|cpu|default",
            "SIE_OTEL_DEPLOYMENT_ENVIRONMENT": "ci",
        }
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(40)]
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
            offloaded = [
                await stack.publish(work_item(item=None, payload_ref=ref))
                for ref in ("item.msgpack", "missing.msgpack")
            ]
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in offloaded))
            await stack.wait_for(lambda: len(receiver.requests) >= 2)  # periodic pushes, not only the last
            backend_batches = stack.adapter.batches
            run_batch_calls = stack.backend.method_calls["RunBatch"] if stack.backend is not None else -1
        # The stack is closed: the last push (after the drain) carries the final counts.
        assert set(receiver.content_types) == {"application/x-protobuf"}
        assert set(receiver.encodings) == {"identity"}  # OTEL_EXPORTER_OTLP_COMPRESSION's default: none
        assert receiver.sidecar_resource() | {"service.version": ""} == {
            "service.name": "sidecar-under-test",
            "service.version": "",
            "service.instance.id": stack.settings.worker_id,
            "deployment.environment": "ci",
            "cloud.region": "unknown",
        }
        assert receiver.resource()["telemetry.sdk.name"] == "opentelemetry"
        metrics = receiver.last_metrics()
        size = metrics["sie.worker.batch.size"]
        assert size.unit == "{item}" and metrics["sie.worker.batch.cost"].unit == "{cost}"
        points = list(size.histogram.data_points)
        assert sum(p.count for p in points) == backend_batches  # one record per batch the backend ran
        assert sum(p.sum for p in points) == 41  # ... of the 40 items and the fetched one
        for p in points:
            attrs = _attrs(p)
            assert next(iter(attrs)) == "lane" and attrs["lane"] == "default|cpu|default"
            assert attrs["operation"] == "encode" and sum(p.bucket_counts) == p.count
            assert 1 <= p.min <= p.max <= 41
        assert metrics["sie.worker.pending.items"].unit == "{item}"  # the health gauges go out too
        requests = {
            (_attrs(p)["method"], _attrs(p)["outcome"]): p.as_double
            for p in metrics["sie.worker.ipc.requests"].sum.data_points
        }
        assert requests[("run_batch", "success")] == run_batch_calls  # every RunBatch the backend answered
        assert requests[("ping", "success")] > 0 and requests[("ensure_model_ready", "success")] >= 1
        assert metrics["sie.worker.ipc.request.duration"].unit == "s"
        durations = metrics["sie.worker.ipc.request.duration"].histogram.data_points
        assert sum(p.count for p in durations) == sum(requests.values())
        operations = {
            (_attrs(p)["operation"], _attrs(p)["reason"]): p.as_double
            for p in metrics["sie.worker.nats.operations"].sum.data_points
        }
        assert operations[("ack", "completed")] == 42  # one ACK per answered item, counted per batch
        attempts = {
            (_attrs(p)["mode"], _attrs(p)["outcome"]): p.as_double
            for p in metrics["sie.worker.result.transport.attempts"].sum.data_points
        }
        assert attempts == {("single", "published"): 42}  # every reply fitted one message
        fetches = {
            (_attrs(p)["outcome"], _attrs(p)["reason"]): p.as_double
            for p in metrics["sie.worker.payload.fetches"].sum.data_points
        }
        assert fetches == {("success", "none"): 1, ("error", "not_found"): 1}
        assert metrics["sie.worker.payload.size"].unit == "By"
        (drain,) = metrics["sie.worker.shutdown.drain.duration"].histogram.data_points
        assert _attrs(drain)["outcome"] == "success" and drain.count == 1


async def test_without_an_endpoint_metrics_stay_off_with_one_warning(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path, env={"SIE_METRICS_ENABLED": "1"}) as stack:
        assert stack.settings.metrics_enabled is False
        assert any("no OTLP metrics endpoint" in w for w in stack.settings.warnings)


async def test_every_exercised_instrument_arrives_with_its_attributes_and_exact_counts(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two models: MODEL is one of the 256 allowlisted pairs, `org/model-b` the 257th, which records
    as (other, other) with one warning. Every point carries exactly its §13 attributes, in order."""
    other_model = "org/model-b"
    allow = [MODEL, *(f"m{i}" for i in range(1, 256)), other_model]
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL, other_model])
    async with otlp_receiver() as receiver:
        env = {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "SIE_METRIC_MODEL_ALLOWLIST": ",".join(allow),
        }
        with caplog.at_level(logging.WARNING, logger="sie_sidecar.telemetry.catalog"):
            async with running_stack(nats_server, tmp_path, env=env, adapter=adapter) as stack:
                ids = [await stack.publish(work_item(text=f"a{i}")) for i in range(30)]
                ids += [await stack.publish(work_item(model=other_model, text=f"b{i}")) for i in range(5)]
                await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
                batches = adapter.batches
    metrics = receiver.last_metrics()
    for name, metric in metrics.items():  # the schema: known names, lane first, then §13's keys in order
        kind, unit, keys = INSTRUMENTS[name]
        assert metric.unit == unit, name
        data = {"counter": metric.sum, "gauge": metric.gauge, "histogram": metric.histogram}[kind]
        for p in data.data_points:
            assert tuple(_attrs(p)) == ("lane", *keys), (name, _attrs(p))

    def by(name: str, *keys: str) -> dict[tuple[str, ...], Any]:
        metric = metrics[name]
        points = getattr(metric, metric.WhichOneof("data")).data_points
        return {tuple(_attrs(p)[k] for k in keys): p for p in points}

    a, other = ("encode", MODEL, "default"), ("encode", "other", "other")
    sizes = by(BATCH_SIZE, "operation", "model", "profile")
    assert set(sizes) == {a, other}
    assert (sizes[a].sum, sizes[other].sum) == (30, 5)
    assert sizes[a].count + sizes[other].count == batches  # one record per batch the backend ran
    for name in (BATCH_COST, DISPATCH_WAIT, REQUEST_BATCH_TOTAL):
        assert sum(p.count for p in by(name, "model").values()) == batches, name
    queued = by(QUEUE_DURATION, "operation", "model", "profile")
    assert (queued[a].count, queued[other].count) == (30, 5)  # each item's wait, recorded per batch
    depth = by(QUEUE_DEPTH, "operation", "model", "profile")
    assert set(depth) == {a, other} and all(p.as_double == 0 for p in depth.values())
    assert {r for (r,) in by(BATCH_FILL_RATIO, "flush.reason")} <= FLUSH_REASONS
    assert ("org/model-a", "default") in by(ADAPTIVE_WAIT, "model", "profile")
    attempts = by(NATS_DELIVERY_ATTEMPTS, "redelivered")
    assert set(attempts) == {("false",)} and attempts[("false",)].count == 35
    received = by(NATS_OPERATIONS, "operation", "reason")
    assert received[("receive", "first_delivery")].as_double == 35
    assert received[("ack", "completed")].as_double == 35
    assert received[("fetch", "none")].as_double >= 1  # the pull requests the consumers sent
    requests = sum(p.as_double for p in by(IPC_REQUESTS, "method", "outcome").values())
    acquired = by(IPC_ACQUIRE_DURATION, "transport", "outcome")
    assert set(acquired) == {("pool", "success")} and acquired[("pool", "success")].count == requests
    assert by(IPC_CAPACITY, "transport")[("pool",)].as_double == stack.settings.ipc_pool_size
    assert ("completed",) in by(IPC_RESPONSE_CHUNKS, "outcome")
    assert [r.getMessage() for r in caplog.records if "(other, other)" in r.getMessage()] == [
        "telemetry: over 256 (model, profile) pairs at 'org/model-b'/'default'; "
        "recorded as (other, other) (this warning is logged once)"
    ]


@pytest.mark.parametrize("enforce", [True, False])
async def test_work_deadlines_arrive_as_otlp_metrics(nats_server: NatsServer, tmp_path: Path, enforce: bool) -> None:
    """§13 (newer than v0.7.1): `work_item.deadline_exceeded` by operation and action, the ACK-drops
    under reason `deadline_exceeded`, and one `work_item.age` per executed item with a timestamp."""
    async with otlp_receiver() as receiver:
        env = {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "SIE_WORK_DEADLINE_ENFORCE": "true" if enforce else "false",
        }
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            now = time.time()
            late = [
                await stack.publish(work_item(text=f"late {i}", timestamp=now - 100, deadline=now - 50))
                for i in range(3)
            ]
            fresh = [
                await stack.publish(work_item(text=f"new {i}", timestamp=now - 2, deadline=now + 60)) for i in range(5)
            ]
            answered = fresh + ([] if enforce else late)
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in answered))
            await stack.settled_pool()
        metrics = receiver.last_metrics()
        exceeded = {
            (_attrs(p)["operation"], _attrs(p)["action"]): p.as_double
            for p in metrics["sie.worker.work_item.deadline_exceeded"].sum.data_points
        }
        assert exceeded == {("encode", "dropped" if enforce else "executed"): 3}
        ages = metrics["sie.worker.work_item.age"]
        assert ages.unit == "s"
        (point,) = ages.histogram.data_points
        assert _attrs(point)["operation"] == "encode" and point.count == len(answered)
        # Each age counts from the item's gateway timestamp: 2 s for the fresh ones, 100 s for the late.
        assert point.sum >= 2.0 * len(fresh) + (0.0 if enforce else 100.0 * len(late))
        assert point.sum < 2.0 * len(fresh) + 30.0 + (0.0 if enforce else 100.0 * len(late))
        operations = {
            (_attrs(p)["operation"], _attrs(p)["reason"]): p.as_double
            for p in metrics["sie.worker.nats.operations"].sum.data_points
        }
        assert operations.get(("ack", "deadline_exceeded"), 0) == (3 if enforce else 0)
