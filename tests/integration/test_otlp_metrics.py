# SPDX-License-Identifier: Apache-2.0
"""OTLP metrics (sidecar-behaviour §13, issue 14 part 1) proven with a real receiver: the real
sidecar over a real nats-server and backend pushes its registry as OTLP/HTTP protobuf; what arrives
carries the §13 names, units and the fixed `lane`, the resource of §1.2, and counts equal to the
work done."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from .conftest import NatsServer
from .otlp_receiver import otlp_receiver
from .stack import running_stack, work_item

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
        assert receiver.resource() | {"service.version": ""} == {
            "service.name": "sidecar-under-test",
            "service.version": "",
            "deployment.environment": "ci",
            "cloud.region": "unknown",
        }
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
