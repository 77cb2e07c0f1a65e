# SPDX-License-Identifier: Apache-2.0
"""Batch spans in local-ingest mode (`SIE_SIDECAR_INGEST=local`, sidecar-behaviour §11): the local
runtime builds its dispatcher with the same tracer as NATS mode, so with `SIE_TRACING_ENABLED` a
local `publish_work` gives one span per batch the backend ran at the OTLP/HTTP receiver, and none
leaves with tracing off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .local_stack import LANE, MODEL, LocalStack, encode_body, running_local
from .otlp_receiver import otlp_receiver

pytestmark = pytest.mark.timeout(60)


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        out[kv.key] = kv.value.int_value if kv.value.HasField("int_value") else kv.value.string_value
    return out


async def _publish(stack: LocalStack, requests: int, per_request: int) -> None:
    client = await stack.client()
    try:
        await client.ping()
        await stack.wait_for(lambda: stack.backend.method_calls["Ping"] > 0)  # the gate opened
        for r in range(requests):
            results = await client.publish_work(encode_body([f"r{r}-t{i}" for i in range(per_request)]))
            assert len(results) == per_request and all(x["success"] for x in results)
    finally:
        await client.close()


async def test_a_local_publish_work_is_traced(tmp_path: Path) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "SIE_TRACING_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "local-sidecar-under-test",
            "SIE_OTEL_LANE": LANE,
        }
        async with running_local(tmp_path, env=env) as stack:
            assert stack.settings.tracing_enabled and stack.settings.ingest == "local"
            await _publish(stack, 3, 4)
            await stack.wait_for(lambda: len(receiver.spans()) >= 1)  # periodic, while serving
            batches = stack.adapter.batches
        # The sidecar has stopped: the last push (after the drain) carried every span.
        spans = receiver.spans()
        assert receiver.trace_resource()["service.name"] == "local-sidecar-under-test"
        assert len(spans) == batches > 0  # one span per batch the backend ran
        assert sum(_attrs(s)["sie.batch.size"] for s in spans) == 12
        for span in spans:
            attrs = _attrs(span)
            assert span.name == "sidecar.dispatch" and span.parent_span_id == b""
            assert attrs["model"] == MODEL and attrs["lane"] == LANE and attrs["operation"] == "encode"
            assert span.status.code == 0


async def test_tracing_off_sends_no_span_in_local_mode(tmp_path: Path) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        async with running_local(tmp_path, env=env) as stack:
            assert not stack.settings.tracing_enabled
            await _publish(stack, 1, 3)
        assert receiver.trace_requests == []
