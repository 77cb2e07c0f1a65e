# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar top`'s arithmetic (issue 14): rates, means and quantiles from two snapshots of the
telemetry registry, grouped per model, with absent instruments shown as 0 or `-`; and the reading of
`/debug/state` from a real probe server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

import sie_sidecar
from sie_sidecar.cli import build_parser
from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.probes import ProbeServer, start_probes, telemetry_json
from sie_sidecar.telemetry import (
    BATCH_FILL_RATIO,
    BATCH_SIZE,
    DURATION_BOUNDS_S,
    INFLIGHT_BATCHES,
    IPC_REQUEST_DURATION,
    IPC_REQUESTS,
    NATS_DELIVERY_ATTEMPTS,
    NATS_OPERATIONS,
    PAYLOAD_FETCHES,
    PENDING_COST,
    PENDING_ITEMS,
    QUEUE_DEPTH,
    REQUEST_BATCH_TOTAL,
    RESULT_TRANSPORT_ATTEMPTS,
    WORK_ITEM_AGE,
    WORK_ITEM_DEADLINE_EXCEEDED,
    Point,
    Registry,
)
from sie_sidecar.tools import top
from sie_sidecar.tools.top import Sample, TopError, compute, delta, quantile, render, sample_of, view_json

from ..peers import non_loopback_address

A, B = "org/model-a", "org/model-b"


def lane(model: str, operation: str = "encode") -> tuple[tuple[str, str], ...]:
    return (("operation", operation), ("model", model), ("profile", "default"))


def sample(
    registry: Registry, at: float, models: Mapping[str, Mapping[str, Any]] | None = None, **extra: Any
) -> Sample:
    """What `top` reads from a sidecar with this registry: through JSON, as the endpoint serves it."""
    state = {"worker_id": "w-1", "ready": True, "models": dict(models or {}), **extra}
    state["telemetry"] = telemetry_json(registry)
    return sample_of(json.loads(json.dumps(state)), at)


def batches(registry: Registry, model: str, *sizes: int) -> None:
    for n in sizes:
        registry.histogram(BATCH_SIZE, lane(model)).record(n)


def test_rates_and_mean_batch_size_come_from_the_interval_only() -> None:
    r = Registry()
    batches(r, A, 100, 100)  # before the first read: in the totals, not in the rates
    first = sample(r, 10.0)
    batches(r, A, 4, 8, 12)
    view = compute(first, sample(r, 12.0))
    (row,) = view.rows
    assert row.model == A and view.interval_s == pytest.approx(2.0)
    assert row.items_per_s == pytest.approx(12.0) and row.batches_per_s == pytest.approx(1.5)
    assert row.mean_batch_size == pytest.approx(8.0)
    assert (row.items, row.batches) == (224, 5)
    assert view.total.items_per_s == pytest.approx(12.0) and view.total.items == 224


def test_rows_are_per_model_and_unattributed_points_count_in_the_totals_only() -> None:
    r = Registry()
    first = sample(r, 0.0, models={B: {"queue_depth": 0}})
    batches(r, A, 10)
    batches(r, B, 2, 2)
    r.histogram(BATCH_SIZE, (("operation", "encode"),)).record(5)  # an older sidecar: no model
    r.set(QUEUE_DEPTH, 7, lane(A))
    r.set(QUEUE_DEPTH, 1, lane(A, "score"))
    view = compute(first, sample(r, 1.0, models={B: {"queue_depth": 3}}))
    rows = {row.model: row for row in view.rows}
    assert list(rows) == [A, B]
    assert rows[A].items_per_s == 10 and rows[A].queue_depth == 8  # summed over operations
    assert rows[B].items_per_s == 4 and rows[B].mean_batch_size == 2
    assert rows[B].queue_depth == 3  # no gauge for B: the dispatcher's own count
    assert view.total.items_per_s == 19 and view.total.batches_per_s == 4
    assert view.total.queue_depth == 8  # the gauges, when there are any


def test_a_model_without_batches_shows_dashes_not_zero_division() -> None:
    r = Registry()
    view = compute(sample(r, 0.0, models={A: {}}), sample(r, 1.0, models={A: {}}))
    (row,) = view.rows
    assert (row.items_per_s, row.batches_per_s, row.mean_batch_size, row.cost_fill, row.queue_depth) == (
        0,
        0,
        None,
        None,
        None,
    )


def test_quantiles_interpolate_inside_the_bucket() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert quantile([0, 10, 0, 0], bounds, 0.5) == pytest.approx(1.5)  # (1, 2]: half-way
    assert quantile([0, 10, 0, 0], bounds, 0.99) == pytest.approx(1.99)
    assert quantile([4, 0, 0, 0], bounds, 0.5) == pytest.approx(0.5)  # the first bucket starts at 0
    assert quantile([5, 0, 5, 0], bounds, 0.5) == pytest.approx(1.0)  # the rank ends the first bucket
    assert quantile([5, 0, 5, 0], bounds, 0.6) == pytest.approx(2.4)  # (2, 4], one of five
    assert quantile([1, 0, 0, 9], bounds, 0.99) == 4.0  # overflow: only its lower edge is known
    assert quantile([0, 0, 0, 0], bounds, 0.5) is None
    assert quantile([], (), 0.5) is None


def test_ipc_round_trip_quantiles_from_bucket_deltas_without_the_heartbeat() -> None:
    r = Registry()
    ok = (("method", "run_batch"), ("outcome", "success"))
    slow = r.histogram(IPC_REQUEST_DURATION, ok, DURATION_BOUNDS_S)
    for _ in range(50):
        slow.record(10.0)  # before the interval: must not move the quantiles
    first = sample(r, 0.0)
    for _ in range(100):
        slow.record(0.0015)  # in (0.001, 0.002]
    timeout = r.histogram(IPC_REQUEST_DURATION, (("method", "run_batch"), ("outcome", "timeout")), DURATION_BOUNDS_S)
    timeout.record(0.0035)  # (0.002, 0.004]: the 101st
    ping = r.histogram(IPC_REQUEST_DURATION, (("method", "ping"), ("outcome", "success")), DURATION_BOUNDS_S)
    for _ in range(1000):
        ping.record(0.0001)
    view = compute(first, sample(r, 2.0))
    assert view.ipc_requests_per_s == pytest.approx(50.5)
    assert view.ipc_p50_s == pytest.approx(0.001 + 0.001 * 50.5 / 100)
    assert view.ipc_p99_s == pytest.approx(0.001 + 0.001 * 99.99 / 100)
    doc = view_json(view)["ipc"]
    assert doc["p50_ms"] == pytest.approx(1.505) and doc["requests_per_s"] == pytest.approx(50.5)


def test_naks_and_redeliveries() -> None:
    r = Registry()
    nak = (("operation", "nak"), ("outcome", "success"), ("reason", "backend_error"))
    r.add(NATS_OPERATIONS, 3, nak)
    r.add(NATS_OPERATIONS, 50, (("operation", "ack"), ("outcome", "success"), ("reason", "ok")))
    r.histogram(NATS_DELIVERY_ATTEMPTS, (("redelivered", "false"),)).record(1)
    first = sample(r, 0.0, models={A: {}})
    r.add(NATS_OPERATIONS, 4, nak)
    r.add(NATS_OPERATIONS, 1, (("operation", "nak"), ("outcome", "success"), ("reason", "draining")))
    for _ in range(2):
        r.histogram(NATS_DELIVERY_ATTEMPTS, (("redelivered", "true"),)).record(2)
    r.histogram(NATS_DELIVERY_ATTEMPTS, (("redelivered", "false"),)).record(1)
    view = compute(first, sample(r, 2.0, models={A: {}}))
    assert (view.naks, view.naks_per_s) == (8, 2.5)
    assert (view.redeliveries, view.redeliveries_per_s) == (2, 1.0)
    assert (view.total.naks, view.total.redeliveries) == (8, 2)
    (row,) = view.rows
    assert (row.naks, row.redeliveries) == (None, None)  # the points carry no model: totals only


def test_naks_per_model_when_the_points_carry_one() -> None:
    r = Registry()
    r.add(NATS_OPERATIONS, 2, (("operation", "nak"), ("model", A)))
    view = compute(sample(r, 0.0, models={A: {}, B: {}}), sample(r, 1.0, models={A: {}, B: {}}))
    assert [(row.model, row.naks) for row in view.rows] == [(A, 2), (B, 0)]


def test_missing_instruments_show_zero_or_dash() -> None:
    r = Registry()
    view = compute(sample(r, 0.0), sample(r, 1.0))
    assert view.rows == () and view.total.items_per_s == 0 and view.total.queue_depth is None
    assert (view.naks, view.naks_per_s) == (0, 0)  # a counter appears on first use: absent is none
    assert (view.redeliveries, view.redeliveries_per_s) == (None, None)  # not recorded at all: unknown
    assert (view.ipc_p50_s, view.ipc_p99_s, view.pending_items, view.inflight_batches) == (None, None, None, None)
    text = "\n".join(render(view, source="http://x"))
    assert "p50 -" in text and "redeliveries -" in text and "pending - items" in text
    older = sample_of({"worker_id": "w", "models": {A: {"queue_depth": 2}}}, 0.0)  # no telemetry key
    view = compute(older, older)
    assert not view.has_telemetry and view.rows[0].queue_depth == 2
    assert any("no telemetry" in line for line in render(view, source="http://x"))


def test_pending_gauges_and_the_total_queue_without_per_model_gauges() -> None:
    r = Registry()
    r.set(PENDING_ITEMS, 12)
    r.set(PENDING_COST, 340)
    r.set(INFLIGHT_BATCHES, 2)
    view = compute(sample(r, 0.0), sample(r, 1.0))
    assert (view.pending_items, view.pending_cost, view.inflight_batches, view.total.queue_depth) == (12, 340, 2, 12)


def test_cost_fill_is_weighted_by_the_batches_each_flush_reason_formed() -> None:
    r = Registry()
    r.set(BATCH_FILL_RATIO, 1.0, (*lane(A), ("flush.reason", "full")))
    r.set(BATCH_FILL_RATIO, 0.5, (*lane(A), ("flush.reason", "deadline")))
    before = {A: {"flushes": {"full": 10, "deadline": 10}}}
    after = {A: {"flushes": {"full": 11, "deadline": 13}}}
    (row,) = compute(sample(r, 0.0, before), sample(r, 1.0, after)).rows
    assert row.cost_fill == pytest.approx((1.0 * 1 + 0.5 * 3) / 4)
    (row,) = compute(sample(r, 0.0, after), sample(r, 1.0, after)).rows  # no batch formed: plain mean
    assert row.cost_fill == pytest.approx(0.75)


def test_a_restarted_sidecar_counts_from_zero() -> None:
    old, new = Registry(), Registry()
    batches(old, A, 50, 50)
    batches(new, A, 3)
    (row,) = compute(sample(old, 0.0), sample(new, 1.0)).rows
    assert (row.items_per_s, row.batches_per_s) == (3, 1)
    counter = Point("c", "counter", (), 5.0)
    assert delta(counter, Point("c", "counter", (), 9.0)) == counter
    assert delta(counter, Point("c", "counter", (), 2.0)).value == 3.0


def test_malformed_points_are_skipped() -> None:
    raw = [
        {"name": BATCH_SIZE, "kind": "histogram", "attrs": {"model": A}, "value": 4, "count": 1, "buckets": [1]},
        {"name": "x", "kind": "summary", "attrs": {}, "value": 1},
        {"kind": "counter"},
        {"name": "y", "kind": "counter", "attrs": [], "value": 1},
        {"name": "z", "kind": "counter", "attrs": {}, "value": "many"},
        "junk",
    ]
    points = top.parse_points(raw)
    assert [p.name for p in points] == [BATCH_SIZE] and points[0].attrs == (("model", A),)
    assert top.parse_points(None) == []


def test_render_shows_headers_models_and_fits_the_terminal() -> None:
    r = Registry()
    models = {f"org/model-{i:02}": {"queue_depth": i} for i in range(30)}
    first = sample(r, 0.0, models)
    batches(r, "org/model-00", 8)
    r.set(BATCH_FILL_RATIO, 0.93, (*lane("org/model-00"), ("flush.reason", "full")))
    view = compute(first, sample(r, 1.0, models))
    lines = render(view, source="http://127.0.0.1:9095/debug/state", clock="12:00:00", width=100)
    header = next(line for line in lines if line.startswith("MODEL"))
    for column in top.COLUMNS:
        assert column in header
    row = next(line for line in lines if line.startswith("org/model-00"))
    assert row.split()[1:5] == ["8.0", "1.0", "8.0", "93%"]
    assert lines[-1].startswith("TOTAL") and all(len(line) <= 100 for line in lines)
    assert "w-1" in lines[0] and "ready" in lines[0] and "12:00:00" in lines[0]
    short = render(view, source="x", height=15)
    assert len(short) <= 15 and any(line.startswith("... ") and "more models" in line for line in short)
    assert short[-1].startswith("TOTAL")


def test_the_json_document() -> None:
    r = Registry()
    first = sample(r, 0.0)
    batches(r, A, 3, 5)
    doc = view_json(compute(first, sample(r, 0.5)))
    assert json.loads(json.dumps(doc)) == doc
    assert doc["worker_id"] == "w-1" and doc["ready"] is True and doc["telemetry"] is True
    assert doc["models"][A] | {"cost_fill": None} == {
        "items_per_s": 16.0,
        "batches_per_s": 4.0,
        "mean_batch_size": 4.0,
        "cost_fill": None,
        "queue_depth": None,
        "naks": None,  # no NAK point names a model: the totals only
        "redeliveries": None,
        "items": 8.0,
        "batches": 2,
    }
    assert doc["totals"]["items"] == 8 and doc["naks"] == {"count": 0, "per_s": 0.0}


def test_the_cli_parses_top() -> None:
    args = build_parser("top").parse_args(["top", "--probe-port", "1234", "--once", "--json", "--interval", "0.2"])
    assert (args.command, args.probe_port, args.host, args.once, args.json, args.interval) == (
        "top",
        1234,
        "127.0.0.1",
        True,
        True,
        0.2,
    )
    assert top.state_url("::1", 80) == "http://[::1]:80/debug/state"


@pytest.fixture
async def probe_server() -> AsyncIterator[ProbeServer]:
    started = await start_probes(Readiness(), 0, host="127.0.0.1")
    assert started is not None
    try:
        yield started
    finally:
        await started.cleanup()


async def test_reading_a_real_probe_server(probe_server: ProbeServer) -> None:
    """A 404 (the endpoint is off) is fatal with the fix in the message; once served, the document
    carries the registry's points; a closed port is an error to retry."""
    url = top.state_url("127.0.0.1", probe_server.port)
    with pytest.raises(TopError, match="SIE_SIDECAR_DEBUG_ENDPOINT=off; unset it") as off:
        await asyncio.to_thread(top.fetch_state, url)
    assert off.value.fatal
    r = Registry()
    batches(r, A, 4)
    probe_server.serve_debug(lambda: {"worker_id": "w-9", "models": {A: {"queue_depth": 1}}}, r)
    state = await asyncio.to_thread(top.fetch_state, url)
    assert state["worker_id"] == "w-9" and state["ready"] is False and state["version"] == sie_sidecar.__version__
    (point,) = state["telemetry"]
    assert point["name"] == BATCH_SIZE and point["attrs"] == dict(lane(A))
    assert (point["value"], point["count"], sum(point["buckets"])) == (4.0, 1, 1)
    assert len(point["buckets"]) == len(point["bounds"]) + 1
    await probe_server.cleanup()
    with pytest.raises(TopError, match="cannot reach") as gone:
        await asyncio.to_thread(top.fetch_state, url)
    assert not gone.value.fatal


#: What a sidecar of issue 32 adds to `/debug/state` for the header.
OPERATOR: dict[str, Any] = {
    "version": "9.8.7",
    "ready": False,
    "not_ready_reason": "heartbeat stale (1.2 s)",
    "nats": {
        "server": "nats://nats-1:4222",
        "connected": True,
        "disconnected_s": None,
        "reconnects": 2,
        "failures": 0,
        "last_error": "UnexpectedEOF: nats: unexpected EOF",
    },
    "lag": {
        "consumers": {
            "worker": {"num_pending": 0, "num_ack_pending": 0, "age_s": 0.4, "error": None},
            "pool": {"num_pending": 1234, "num_ack_pending": 12, "age_s": 0.4, "error": None},
        },
        "refreshing": False,
    },
}


def failing(r: Registry) -> None:
    """Every kind of failure the registry counts, and some successes that must not show."""
    op = (("operation", "nak"), ("outcome", "success"))
    r.add(NATS_OPERATIONS, 3, (*op, ("reason", "retry")))
    r.add(NATS_OPERATIONS, 2, (*op, ("reason", "backend_not_ready")))
    r.add(NATS_OPERATIONS, 1, (("operation", "ack"), ("outcome", "error"), ("reason", "completed")))
    r.add(NATS_OPERATIONS, 50, (("operation", "ack"), ("outcome", "success"), ("reason", "completed")))
    r.add(IPC_REQUESTS, 40, (("method", "run_batch"), ("outcome", "success")))
    r.add(IPC_REQUESTS, 1, (("method", "run_batch"), ("outcome", "success_after_retry")))
    r.add(IPC_REQUESTS, 4, (("method", "ping"), ("outcome", "timeout")))
    r.add(IPC_REQUESTS, 1, (("method", "run_batch"), ("outcome", "transport_error")))
    r.add(RESULT_TRANSPORT_ATTEMPTS, 9, (("mode", "single"), ("outcome", "published")))
    r.add(RESULT_TRANSPORT_ATTEMPTS, 2, (("mode", "single"), ("outcome", "publish_error")))
    r.add(PAYLOAD_FETCHES, 1, (("outcome", "error"), ("reason", "not_found")))
    r.add(WORK_ITEM_DEADLINE_EXCEEDED, 5, (("operation", "encode"), ("action", "dropped")))
    r.add(WORK_ITEM_DEADLINE_EXCEEDED, 7, (("operation", "encode"), ("action", "executed")))


def test_the_operator_header_and_failures() -> None:
    """Version, the not-ready reason, the NATS server and reconnects, the lag (pool first) and the
    failures since start, by kind: on the screen and in the JSON."""
    r = Registry()
    failing(r)
    first = sample(r, 0.0, **OPERATOR)
    view = compute(first, sample(r, 1.0, **OPERATOR))
    lines = render(view, source="http://127.0.0.1:9095/debug/state", width=400)
    assert "version 9.8.7" in lines[0] and "not ready: heartbeat stale (1.2 s)" in lines[0]
    assert lines[1] == (
        "NATS nats://nats-1:4222  connected  reconnects 2  last error: UnexpectedEOF: nats: unexpected EOF"
    )
    assert lines[2] == (
        "lag (JetStream num_pending)  pool 1,234 (12 un-ACKed, 0.4 s ago)  worker 0 (0 un-ACKed, 0.4 s ago)"
    )
    failures = next(line for line in lines if line.startswith("failures"))
    assert failures == (
        "failures since start: NAKs backend_not_ready 2, retry 3; NATS errors ack 1; IPC timeout 4, "
        "transport_error 1; replies not published publish_error 2; payload fetches not_found 1; deadline drops 5"
    )
    doc = view_json(view)
    assert json.loads(json.dumps(doc)) == doc
    assert (doc["version"], doc["not_ready_reason"]) == ("9.8.7", "heartbeat stale (1.2 s)")
    assert doc["nats"]["reconnects"] == 2 and doc["nats"]["server"] == "nats://nats-1:4222"
    assert doc["lag"]["pool"] == {"num_pending": 1234, "num_ack_pending": 12, "age_s": 0.4, "error": None}
    assert doc["failures"] == {
        "naks": {"backend_not_ready": 2, "retry": 3},
        "nats_errors": {"ack": 1},
        "ipc": {"timeout": 4, "transport_error": 1},
        "publish": {"publish_error": 2},
        "payload": {"not_found": 1},
        "deadline_dropped": 5,
    }


def test_a_calm_sidecar_says_so_and_an_older_one_shows_nothing_new() -> None:
    r = Registry()
    view = compute(sample(r, 0.0), sample(r, 1.0))
    lines = render(view, source="x", width=200)
    assert "failures since start: none" in lines
    assert not any(line.startswith(("NATS", "lag")) for line in lines)  # an older sidecar: no such keys
    assert "version -" in lines[0]
    nats: Mapping[str, Any] = OPERATOR["nats"]
    down = {**nats, "connected": False, "disconnected_s": 3.25, "failures": 7}
    reading = {"consumers": {"pool": {"num_pending": None, "age_s": None, "error": "TimeoutError"}}}
    view = compute(sample(r, 0.0), sample(r, 1.0, nats=down, lag=reading))
    lines = render(view, source="x", width=200)
    assert lines[1].startswith("NATS nats://nats-1:4222  disconnected 3.2 s, 7 failed attempts  reconnects 2")
    assert lines[2] == "lag (JetStream num_pending)  pool - (TimeoutError)"


def test_latency_from_the_item_age_and_the_batch_total() -> None:
    """The age histogram's buckets are whole powers of two seconds: its quantiles show as bucket
    bounds; the batch total is interpolated. Both over the interval only."""
    r = Registry()
    age = r.histogram(WORK_ITEM_AGE, (("operation", "encode"),))
    total = r.histogram(REQUEST_BATCH_TOTAL, lane(A), DURATION_BOUNDS_S)
    age.record(100.0)  # before the first read: not in the interval
    first = sample(r, 0.0)
    for _ in range(98):
        age.record(0.004)
    age.record(1.5)
    age.record(3.0)
    for _ in range(10):
        total.record(0.003)
    view = compute(first, sample(r, 1.0))
    assert (view.item_age_p50_s, view.item_age_p99_s) == (1.0, 2.0)
    assert view.batch_total_p50_s is not None and 0.002 < view.batch_total_p50_s <= 0.004
    line = next(line for line in render(view, source="x", width=200) if line.startswith("item age"))
    assert line.startswith("item age at dispatch p50 <=1 s  p99 <=2 s  batch in sidecar p50 ")
    doc = view_json(view)["latency"]
    assert (doc["item_age_p50_le_s"], doc["item_age_p99_le_s"]) == (1.0, 2.0)
    idle = view_json(compute(sample(r, 1.0), sample(r, 2.0)))["latency"]
    assert idle == {k: None for k in idle}


def test_bucket_bounds() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert top.bucket_bound([0, 0, 0, 0], bounds, 0.5) is None
    assert top.bucket_bound([10, 0, 0, 0], bounds, 0.99) == 1.0
    assert top.bucket_bound([5, 5, 0, 0], bounds, 0.5) == 1.0 and top.bucket_bound([5, 5, 0, 0], bounds, 0.51) == 2.0
    assert top.bucket_bound([0, 0, 0, 3], bounds, 0.5) == float("inf")
    assert (
        view_json(replace(compute(sample(Registry(), 0.0), sample(Registry(), 1.0)), item_age_p99_s=float("inf")))[
            "latency"
        ]["item_age_p99_le_s"]
        == "overflow"
    )


async def test_a_refused_peer_is_fatal_and_names_the_setting() -> None:
    """A 403 from the sidecar (this peer is not loopback) ends `top` with the sidecar's own line."""
    source = non_loopback_address()
    if source is None:
        pytest.skip("this machine has no non-loopback address")
    server = await start_probes(Readiness(), 0, host="0.0.0.0")
    assert server is not None
    try:
        server.serve_debug(dict, Registry())
        with pytest.raises(TopError, match=r"answered 403: forbidden: .*SIE_SIDECAR_DEBUG_ENDPOINT=all") as refused:
            await asyncio.to_thread(top.fetch_state, top.state_url(source, server.port))
        assert refused.value.fatal
    finally:
        await server.cleanup()
