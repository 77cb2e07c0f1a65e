# SPDX-License-Identifier: Apache-2.0
"""OTLP traces (`SIE_TRACING_ENABLED`, issue 14) proven with a real receiver: the real sidecar over a
real nats-server and backend sends, through the OpenTelemetry SDK's batch span processor and OTLP
exporter, one span per batch the backend ran, linked to the work items' own `traceparent`s, and the
backend receives that span's context in every RunBatchItem. Sampled off, no span leaves and the
items' own contexts reach the backend as before."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.otel.export import OtlpThread, TracePush
from sie_sidecar.otel.target import Target
from sie_sidecar.otel.tracer import Tracer
from sie_sidecar.otel.tracing import Sampler, SpanBuffer, parse_traceparent

from .conftest import NatsServer
from .otlp_receiver import otlp_receiver
from .stack import MODEL, running_stack, work_item

pytestmark = pytest.mark.timeout(60)

Seen = tuple[str, str | None, str | None]  # work_item_id, traceparent, tracestate
RUN_BATCH_OK = {"method": "run_batch", "outcome": "success"}


class RecordingBackend(BackendServer):
    """The reference backend, keeping what each RunBatch's items carried as trace context."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_batches: list[list[Seen]] = []

    async def _run_batch(self, body: dict[str, Any]) -> dict[str, Any]:
        items = body.get("items") or []
        self.run_batches.append([(i["work_item_id"], i.get("traceparent"), i.get("tracestate")) for i in items])
        return await super()._run_batch(body)


def _traceparent() -> str:
    return f"00-{random.getrandbits(128) | 1:032x}-{random.getrandbits(64) | 1:016x}-01"


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        out[kv.key] = kv.value.int_value if kv.value.HasField("int_value") else kv.value.string_value
    return out


def _context(span: Any) -> str:
    return f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01"


def _ids(traceparent: str | None) -> tuple[str, str]:
    ctx = parse_traceparent(traceparent)
    assert ctx is not None
    return ctx.trace_id, ctx.span_id


async def _serve(tmp_path: Path, nats_server: NatsServer, env: dict[str, str], n: int) -> tuple[Any, dict[str, Any]]:
    """Run `n` items carrying their own traceparent (plus one without, one malformed) through the
    stack; the backend and what each item carried when it was published."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    sock = str(tmp_path / "backend.sock")
    backend = RecordingBackend(adapter, sock, worker_id="backend-0")
    await backend.start()
    sent: dict[str, Any] = {}
    try:
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env, external_backend=sock) as stack:
            contexts: list[str | None] = [_traceparent() for _ in range(n)]
            contexts += [None, "00-not-a-context-01"]
            for i, tp in enumerate(contexts):
                item = work_item(text=f"t{i}")
                if tp is not None:
                    item["traceparent"] = tp
                sent[await stack.publish(item)] = tp
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in sent))
    finally:
        await backend.close()
    return backend, sent


async def test_one_span_per_batch_linked_to_its_items_and_passed_to_the_backend(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "SIE_TRACING_ENABLED": "true",
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url.removesuffix("/v1/metrics"),
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "sidecar-under-test",
            "SIE_OTEL_LANE": "default|cpu|default",
        }
        backend, sent = await _serve(tmp_path, nats_server, env, 40)
        # The stack is closed: the last push (after the drain) carried every span.
        spans = receiver.spans()
        assert receiver.trace_resource()["service.name"] == "sidecar-under-test"
        # Batches of work, not the readiness gate's empty drain probes (no span: they are not batches).
        work = [b for b in backend.run_batches if b]
        probes = len(backend.run_batches) - len(work)
        assert len(spans) == len(work) > 0 and len(backend.run_batches) == backend.method_calls["RunBatch"]
        ipc = receiver.last_metrics()["sie.worker.ipc.requests"].sum.data_points
        run_batches = [p.as_double for p in ipc if _attrs(p) | {"lane": ""} == {**RUN_BATCH_OK, "lane": ""}]
        assert run_batches == [len(spans) + probes]  # one span per RunBatch of work the metrics count
        by_context = {_context(s): s for s in spans}
        assert len(by_context) == len(spans)
        linked: list[tuple[str, str]] = []
        for batch in work:
            contexts = {(tp, state) for _, tp, state in batch}
            assert len(contexts) == 1  # every item of a batch carries the batch span's context ...
            ((tp, state),) = contexts
            assert state is None and tp in by_context  # ... which is a span the receiver got
            span = by_context.pop(tp)
            assert span.name == "sidecar.dispatch"
            attrs = _attrs(span)
            assert attrs["sie.batch.size"] == len(batch) and attrs["operation"] == "encode"
            assert attrs["model"] == MODEL and attrs["lane"] == "default|cpu|default"
            assert span.status.code == 0  # unset: the batch ran
            assert [e.name for e in span.events] == ["ipc.request", "ipc.response", "published"]
            assert all(lk.flags == 0x300 for lk in span.links)  # each link a remote context
            links = [(lk.trace_id.hex(), lk.span_id.hex()) for lk in span.links]
            valid = list(dict.fromkeys(sent[w] for w, _, _ in batch if parse_traceparent(sent[w]) is not None))
            if valid:  # §5.4: parented on the first valid inbound context, the others are links
                parent = parse_traceparent(valid[0])
                assert parent is not None
                assert (span.trace_id.hex(), span.parent_span_id.hex()) == (parent.trace_id, parent.span_id)
                assert span.flags & 0x300 == 0x300  # the parent is remote
                linked.append(_ids(valid[0]))
            else:
                assert span.parent_span_id == b""
            assert sorted(links) == sorted(map(_ids, valid[1:]))  # valid incoming contexts only
            linked += links
        assert not by_context
        assert sorted(linked) == sorted(_ids(tp) for tp in sent.values() if parse_traceparent(tp) is not None)


async def test_sampled_off_no_span_leaves_and_the_items_own_contexts_reach_the_backend(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "SIE_TRACING_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "always_off",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        backend, sent = await _serve(tmp_path, nats_server, env, 12)
        assert receiver.trace_requests == []
        seen = {w: (tp, state) for batch in backend.run_batches for w, tp, state in batch}
        assert seen == {w: (tp, None) for w, tp in sent.items()}  # untouched, the malformed one too


async def test_a_refused_export_is_retried_by_the_sdk() -> None:
    """The receiver answers 503 to the first export: the SDK's HTTP exporter retries it (with
    back-off) and the spans arrive; the processor's stop sends what the schedule delay did not."""
    buffer = SpanBuffer(8)
    tracer = Tracer(Sampler("always_on"), buffer)
    async with otlp_receiver(refuse=1) as receiver:
        thread = OtlpThread()
        target = Target(receiver.traces_url, "http/protobuf")
        push = TracePush(buffer, thread, target, resource={"service.name": "s"}, schedule_delay_s=60)
        for _ in range(3):
            span = tracer.start_batch("m", "encode", 1, 1)
            assert span is not None
            span.end()
        stop = asyncio.Event()
        stop.set()  # at once: the run loads the SDK, hands the kept spans over, then stops the processor
        try:
            await asyncio.wait_for(push.run(stop), 30)
        finally:
            thread.close()
        assert receiver.refused == 1 and len(receiver.spans()) == 3 and len(buffer) == 0
