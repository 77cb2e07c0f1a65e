# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar top`: a live view of a running sidecar for people (issues 14 and 32).

It reads `GET /debug/state` on the probe port once a second. The sidecar serves it by default, to
loopback peers only (`SIE_SIDECAR_DEBUG_ENDPOINT`: `loopback`, `all`, `off`), so `top` run in the
pod (`kubectl exec`) or on the host works with no setting; from elsewhere it gets a 403 naming the
setting. The document's `telemetry` key is the in-process registry's snapshot: cumulative counters,
gauges and explicit-bucket histograms. Rates and quantiles come from the difference of two reads, so
the sidecar keeps no windows for this view and two reads `--interval` apart are needed even for
`--once`.

The header: the worker, the sidecar's version, ready or the not-ready reason; the NATS server
connected to, the reconnects since start and the client's last error; the consumer lag
(`num_pending` of the pool and worker-direct consumers as JetStream reports it, fetched by the
sidecar in the background while someone reads, with its age).

Per model: items/s and batches/s (`sie.worker.batch.size`: count = batches, sum = items), the mean
batch size over the interval, the cost fill (`sie.worker.batch.fill_ratio`), queue depth
(`sie.worker.queue.depth`, else the dispatcher's own per-model count), NAKs and redeliveries when
their points carry a model. For the process: pending items and cost, batches in flight, p50/p99 of
the IPC round trip (`sie.worker.ipc.request.duration`, every method but the `ping` heartbeat), NAKs
(`sie.worker.nats.operations`, operation=nak) and redeliveries (`sie.worker.nats.delivery.attempts`
with redelivered=true). An instrument that is absent shows 0 when absence means nothing happened (a
counter appears on first use) and `-` when the value is unknown.

Latency: no instrument spans a work item's gateway timestamp to its reply, so the view shows the two
nearest. `sie.worker.work_item.age` is each executed item's age at its batch's commit to the backend
(gateway timestamp to dispatch); its buckets are powers of two seconds, so its quantiles show as the
bucket's upper bound (`<=1 s`), never interpolated. `sie.worker.scheduler.request_batch.total` is
per batch, its oldest item's enqueue to the backend's answer (the sidecar's part), interpolated.
Both over the interval.

Failures, counted since start: NAKs by reason, NATS operations that failed by operation, IPC
requests that did not succeed by outcome (the heartbeat's too: a dead backend shows there first),
replies not published by outcome, payload fetches failed by reason, items dropped past their
deadline. The registry has no count of error replies by error code.

Cost fill: a gauge holds the fill ratio of the last batch per flush reason; the view shows their
mean weighted by the batches each reason formed during the interval (the dispatcher's per-model
`flushes` counts in the same document), or their plain mean when no batch was formed.

Hook: `add_top_arguments` + `run_top` for the `sie-sidecar` CLI. Exit status 0, or 1 when the
endpoint cannot be read (`--once`), is off (404) or refuses this peer (403).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import select
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TextIO

from ..telemetry import (
    BATCH_FILL_RATIO,
    BATCH_SIZE,
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
    Kind,
    Point,
)

DEFAULT_PROBE_PORT: Final = 9095
DEFAULT_INTERVAL_S: Final = 1.0
FETCH_TIMEOUT_S: Final = 2.0
NO_ENDPOINT: Final = "the sidecar runs with SIE_SIDECAR_DEBUG_ENDPOINT=off; unset it (loopback peers) or set it to all"
#: IPC methods left out of the round trip: the heartbeat's ping is no work and would swamp the rest.
IPC_NOT_WORK: Final = frozenset({"ping"})
IPC_SUCCESS: Final = frozenset({"success", "success_after_retry"})
TOTAL: Final = "TOTAL"
_KINDS: Final[Mapping[str, Kind]] = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}
#: Terminal control: alternate screen on/off, cursor hidden/shown, home + clear.
_ENTER: Final = "\x1b[?1049h\x1b[?25l"
_LEAVE: Final = "\x1b[?25h\x1b[?1049l"
_CLEAR: Final = "\x1b[H\x1b[2J"


# -- reading --


class TopError(Exception):
    """The state could not be read; `fatal` when retrying cannot help (the endpoint is off)."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def state_url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/debug/state"


def fetch_state(url: str, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any]:
    """`GET /debug/state` as a dict; a 404 is fatal (the endpoint is off), anything else transient."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # an http:// URL built here
            body = response.read()
    except urllib.error.HTTPError as exc:
        line = _first_line(exc)  # and closed: it holds the response's socket
        if exc.code == 404:
            raise TopError(f"{url} answered 404: {NO_ENDPOINT}", fatal=True) from None
        if exc.code == 403:  # the sidecar's one line names the setting
            raise TopError(f"{url} answered 403: {line}", fatal=True) from None
        raise TopError(f"{url} answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise TopError(f"cannot reach {url}: {reason}") from None
    try:
        state = json.loads(body)
    except ValueError:
        raise TopError(f"{url} did not answer JSON") from None
    if not isinstance(state, dict):
        raise TopError(f"{url} did not answer a JSON object")
    return state


def _first_line(exc: urllib.error.HTTPError) -> str:
    """The first line of an error response's body (bounded), or its reason."""
    try:
        body: bytes = exc.read(512)
    except OSError:
        body = b""
    finally:
        exc.close()  # it holds the response's socket
    return body.decode("utf-8", "replace").strip().partition("\n")[0] or str(exc.reason)


@dataclass(frozen=True, slots=True)
class Sample:
    """One read of `/debug/state`: when it was taken and what of it the view uses."""

    at: float  # time.monotonic() when the answer arrived
    points: tuple[Point, ...]
    #: The dispatcher's per-model entries (queue depth, flush counts by reason).
    models: Mapping[str, Mapping[str, Any]]
    worker_id: str
    ready: bool | None
    #: Whether the document had a `telemetry` list at all (an older sidecar has none).
    has_telemetry: bool
    version: str | None = None
    not_ready_reason: str | None = None
    #: The NATS connection (`nats`: server, connected, reconnects, failures, last_error); None in
    #: local ingest or from an older sidecar.
    nats: Mapping[str, Any] | None = None
    #: Per consumer (`pool`, `worker`) what JetStream last reported (`lag.consumers`).
    lag: Mapping[str, Mapping[str, Any]] | None = None


def parse_points(raw: object) -> list[Point]:
    """Registry points from `/debug/state`'s `telemetry` list; malformed entries are skipped, so a
    newer sidecar's extra fields or kinds do not stop the view."""
    if not isinstance(raw, list):
        return []
    points: list[Point] = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        kind = _KINDS.get(str(entry.get("kind")))
        attrs = entry.get("attrs", {})
        if kind is None or not isinstance(attrs, dict):
            continue
        try:
            point = Point(
                entry["name"],
                kind,
                tuple((str(k), str(v)) for k, v in attrs.items()),
                float(entry.get("value") or 0),
                int(entry.get("count") or 0),
                tuple(int(b) for b in entry.get("buckets") or ()),
                tuple(float(b) for b in entry.get("bounds") or ()),
            )
        except (TypeError, ValueError):
            continue
        points.append(point)
    return points


def sample_of(state: Mapping[str, Any], at: float) -> Sample:
    """The parts of one `/debug/state` document the view reads."""
    models = state.get("models")
    ready = state.get("ready")
    version, reason, nats = state.get("version"), state.get("not_ready_reason"), state.get("nats")
    lag = state.get("lag")
    consumers = lag.get("consumers") if isinstance(lag, dict) else None
    return Sample(
        at=at,
        points=tuple(parse_points(state.get("telemetry"))),
        models={str(m): e for m, e in models.items() if isinstance(e, dict)} if isinstance(models, dict) else {},
        worker_id=str(state.get("worker_id") or "-"),
        ready=ready if isinstance(ready, bool) else None,
        has_telemetry=isinstance(state.get("telemetry"), list),
        version=version if isinstance(version, str) else None,
        not_ready_reason=reason if isinstance(reason, str) else None,
        nats=nats if isinstance(nats, dict) else None,
        lag=({str(k): v for k, v in consumers.items() if isinstance(v, dict)} if isinstance(consumers, dict) else None),
    )


# -- arithmetic over two samples --


def delta(current: Point, previous: Point | None) -> Point:
    """What a counter or histogram gained between two reads (a gauge is taken as it is now). A point
    that went backwards belongs to a restarted sidecar and counts from zero."""
    if previous is None or previous.kind != current.kind or current.kind == "gauge":
        return current
    if current.kind == "counter":
        gained = current.value - previous.value
        return current if gained < 0 else replace(current, value=gained)
    if current.bounds != previous.bounds or len(current.buckets) != len(previous.buckets):
        return current
    buckets = tuple(a - b for a, b in zip(current.buckets, previous.buckets, strict=True))
    if current.count < previous.count or any(b < 0 for b in buckets):
        return current
    return replace(current, value=current.value - previous.value, count=current.count - previous.count, buckets=buckets)


def quantile(buckets: Sequence[int], bounds: Sequence[float], q: float) -> float | None:
    """The q-quantile of an explicit-bucket histogram, interpolated linearly inside its bucket.

    Bucket i covers (bounds[i-1], bounds[i]], the first from 0 (or from its bound, if that is not
    positive); the last is the overflow (bounds[-1], inf), where only bounds[-1] is known. None when
    the histogram holds nothing."""
    total = sum(buckets)
    if total <= 0 or not bounds:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n <= 0:
            continue
        if seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1]
            upper = bounds[i]
            lower = bounds[i - 1] if i > 0 else min(0.0, upper)
            return lower + (upper - lower) * max(0.0, rank - seen) / n
        seen += n
    return bounds[-1]


def bucket_bound(buckets: Sequence[int], bounds: Sequence[float], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile (`inf` in the overflow bucket): what a
    coarse histogram can honestly say, where interpolating would invent a value. None when empty."""
    total = sum(buckets)
    if total <= 0 or not bounds:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(buckets):
        seen += n
        if n > 0 and seen >= rank:
            return bounds[i] if i < len(bounds) else math.inf
    return math.inf


def merge_buckets(points: Iterable[Point]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Bucket counts summed over histograms with the same bounds (the first one's; others skipped)."""
    bounds: tuple[float, ...] | None = None
    total: list[int] = []
    for p in points:
        if bounds is None:
            bounds, total = p.bounds, list(p.buckets)
        elif p.bounds == bounds and len(p.buckets) == len(total):
            total = [a + b for a, b in zip(total, p.buckets, strict=True)]
    return tuple(total), bounds or ()


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: one model, or the totals."""

    model: str
    items_per_s: float
    batches_per_s: float
    mean_batch_size: float | None  # items per batch over the interval; None: no batch formed
    cost_fill: float | None  # see the module docstring; None: not recorded
    queue_depth: float | None
    naks: float | None  # since the sidecar started; None: the points carry no model
    redeliveries: float | None
    items: float  # in batches since the sidecar started
    batches: float


@dataclass(frozen=True, slots=True)
class NatsLine:
    """The sidecar's NATS connection as its `nats` entry reports it."""

    server: str | None
    connected: bool | None
    reconnects: int | None  # since the sidecar started
    failures: int | None  # since the last good connection
    last_error: str | None
    disconnected_s: float | None


@dataclass(frozen=True, slots=True)
class Lag:
    """One consumer's backlog as JetStream last reported it to the sidecar."""

    consumer: str  # `pool` or `worker`
    num_pending: int | None  # not yet delivered to any worker
    num_ack_pending: int | None  # delivered, not yet ACKed
    age_s: float | None  # of the reading, when the sidecar served it
    error: str | None  # of the last refresh, when it failed


@dataclass(frozen=True, slots=True)
class Failures:
    """What went wrong since the sidecar started, from the registry's counters."""

    naks: Mapping[str, float]  # by reason
    nats_errors: Mapping[str, float]  # NATS operations that failed, by operation
    ipc: Mapping[str, float]  # IPC requests that did not succeed, by outcome
    publish: Mapping[str, float]  # replies not published, by outcome
    payload: Mapping[str, float]  # payload fetches that failed, by reason
    deadline_dropped: float  # items dropped past their deadline

    def any(self) -> bool:
        groups = (self.naks, self.nats_errors, self.ipc, self.publish, self.payload)
        return self.deadline_dropped > 0 or any(v > 0 for g in groups for v in g.values())


@dataclass(frozen=True, slots=True)
class View:
    """Everything one screen (or one `--json` document) shows, from two samples."""

    worker_id: str
    ready: bool | None
    interval_s: float
    rows: tuple[Row, ...]
    total: Row
    pending_items: float | None
    pending_cost: float | None
    inflight_batches: float | None
    ipc_requests_per_s: float
    ipc_p50_s: float | None
    ipc_p99_s: float | None
    naks: float
    naks_per_s: float
    redeliveries: float | None  # None: the sidecar records no delivery attempts
    redeliveries_per_s: float | None
    has_telemetry: bool
    version: str | None = None
    not_ready_reason: str | None = None
    nats: NatsLine | None = None
    lag: tuple[Lag, ...] = ()
    failures: Failures | None = None
    #: Upper bounds of the buckets holding p50 / p99 of `work_item.age` over the interval.
    item_age_p50_s: float | None = None
    item_age_p99_s: float | None = None
    #: p50 / p99 of `request_batch.total` over the interval (per batch, interpolated).
    batch_total_p50_s: float | None = None
    batch_total_p99_s: float | None = None


def _attr(point: Point, key: str) -> str | None:
    return next((v for k, v in point.attrs if k == key), None)


def _named(points: Iterable[Point], name: str) -> list[Point]:
    return [p for p in points if p.name == name]


def _of_model(points: Iterable[Point], *, model: str) -> list[Point]:
    return [p for p in points if _attr(p, "model") == model]


def _gauge(points: Sequence[Point], name: str) -> float | None:
    found = _named(points, name)
    return sum(p.value for p in found) if found else None


def _cost_fill(gauges: Sequence[Point], flushed: Mapping[tuple[str, str], float]) -> float | None:
    """The fill gauges' mean, weighted by the batches each (model, flush reason) formed in the
    interval; the plain mean when none did (or the reasons do not match the dispatcher's)."""
    if not gauges:
        return None
    weights = [flushed.get((_attr(g, "model") or "", _attr(g, "flush.reason") or ""), 0.0) for g in gauges]
    total = sum(weights)
    if total > 0:
        return sum(g.value * w for g, w in zip(gauges, weights, strict=True)) / total
    return sum(g.value for g in gauges) / len(gauges)


def _flushed(previous: Sample, current: Sample) -> dict[tuple[str, str], float]:
    """Batches formed per (model, flush reason) between the samples, from the dispatcher's counts."""
    out: dict[tuple[str, str], float] = {}
    for model, entry in current.models.items():
        now, before = entry.get("flushes"), previous.models.get(model, {}).get("flushes")
        if not isinstance(now, dict):
            continue
        before = before if isinstance(before, dict) else {}
        for reason, n in now.items():
            with contextlib.suppress(TypeError, ValueError):
                gained = float(n) - float(before.get(reason, 0))
                out[(model, str(reason))] = gained if gained >= 0 else float(n)
    return out


def _by(points: Iterable[Point], key: str, *, value: Callable[[Point], float] = lambda p: p.value) -> dict[str, float]:
    """Counts summed per value of attribute `key`, zeros left out."""
    out: dict[str, float] = {}
    for p in points:
        n = value(p)
        if n:
            name = _attr(p, key) or "-"
            out[name] = out.get(name, 0.0) + n
    return dict(sorted(out.items()))


def failures_of(points: Sequence[Point]) -> Failures:
    """The failure counts since start (see the module docstring)."""
    ops = _named(points, NATS_OPERATIONS)
    return Failures(
        naks=_by((p for p in ops if _attr(p, "operation") == "nak"), "reason"),
        nats_errors=_by((p for p in ops if _attr(p, "outcome") == "error"), "operation"),
        ipc=_by((p for p in _named(points, IPC_REQUESTS) if _attr(p, "outcome") not in IPC_SUCCESS), "outcome"),
        publish=_by(
            (p for p in _named(points, RESULT_TRANSPORT_ATTEMPTS) if _attr(p, "outcome") != "published"), "outcome"
        ),
        payload=_by((p for p in _named(points, PAYLOAD_FETCHES) if _attr(p, "outcome") != "success"), "reason"),
        deadline_dropped=sum(
            p.value for p in _named(points, WORK_ITEM_DEADLINE_EXCEEDED) if _attr(p, "action") == "dropped"
        ),
    )


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _float(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _str(x: object) -> str | None:
    return x if isinstance(x, str) else None


def nats_of(entry: Mapping[str, Any] | None) -> NatsLine | None:
    if entry is None:
        return None
    connected = entry.get("connected")
    return NatsLine(
        server=_str(entry.get("server")),
        connected=connected if isinstance(connected, bool) else None,
        reconnects=_int(entry.get("reconnects")),
        failures=_int(entry.get("failures")),
        last_error=_str(entry.get("last_error")),
        disconnected_s=_float(entry.get("disconnected_s")),
    )


def lag_of(consumers: Mapping[str, Mapping[str, Any]] | None) -> tuple[Lag, ...]:
    """The pool consumer first (the backlog an operator watches), then the rest by name."""
    if not consumers:
        return ()
    order = sorted(consumers, key=lambda k: (k != "pool", k))
    return tuple(
        Lag(
            consumer=k,
            num_pending=_int(consumers[k].get("num_pending")),
            num_ack_pending=_int(consumers[k].get("num_ack_pending")),
            age_s=_float(consumers[k].get("age_s")),
            error=_str(consumers[k].get("error")),
        )
        for k in order
    )


def _sum_or_none(points: Sequence[Point], attributed: bool, field: Callable[[Point], float]) -> float | None:
    """A per-model count: None when the instrument's points carry no model (only the total knows)."""
    return sum(field(p) for p in points) if attributed else None


def compute(previous: Sample, current: Sample) -> View:
    """The view between two samples: rates over their interval, gauges as of the later one."""
    interval = max(current.at - previous.at, 1e-9)
    before = {(p.name, p.attrs): p for p in previous.points}
    now = current.points
    gained = [delta(p, before.get((p.name, p.attrs))) for p in now]
    flushed = _flushed(previous, current)

    sizes, sizes_gained = _named(now, BATCH_SIZE), _named(gained, BATCH_SIZE)
    fills, depths = _named(now, BATCH_FILL_RATIO), _named(now, QUEUE_DEPTH)
    naks = [p for p in _named(now, NATS_OPERATIONS) if _attr(p, "operation") == "nak"]
    naks_gained = [p for p in _named(gained, NATS_OPERATIONS) if _attr(p, "operation") == "nak"]
    attempts = _named(now, NATS_DELIVERY_ATTEMPTS)
    redelivered = [p for p in attempts if _attr(p, "redelivered") == "true"]
    redelivered_gained = [p for p in _named(gained, NATS_DELIVERY_ATTEMPTS) if _attr(p, "redelivered") == "true"]
    naks_by_model = any(_attr(p, "model") is not None for p in naks)
    redeliveries_by_model = bool(attempts) and any(_attr(p, "model") is not None for p in attempts)

    def row(model: str, mine: Callable[[Sequence[Point]], list[Point]], queue: float | None) -> Row:
        batches = sum(p.count for p in mine(sizes_gained))
        items = sum(p.value for p in mine(sizes_gained))
        by_model = model != TOTAL
        return Row(
            model=model,
            items_per_s=items / interval,
            batches_per_s=batches / interval,
            mean_batch_size=items / batches if batches else None,
            cost_fill=_cost_fill(mine(fills), flushed),
            queue_depth=queue,
            naks=_sum_or_none(mine(naks), naks_by_model or not by_model, lambda p: p.value),
            redeliveries=_sum_or_none(
                mine(redelivered), (redeliveries_by_model or not by_model) and bool(attempts), lambda p: p.count
            ),
            items=sum(p.value for p in mine(sizes)),
            batches=sum(p.count for p in mine(sizes)),
        )

    names = set(current.models)
    names.update(m for p in (*sizes, *fills, *depths) if (m := _attr(p, "model")) is not None)
    rows = []
    for model in sorted(names):
        own_depths = _of_model(depths, model=model)
        fallback = current.models.get(model, {}).get("queue_depth")
        queue = (
            sum(p.value for p in own_depths)
            if own_depths
            else float(fallback)
            if isinstance(fallback, int | float) and not isinstance(fallback, bool)
            else None
        )
        rows.append(row(model, functools.partial(_of_model, model=model), queue))
    pending = _gauge(now, PENDING_ITEMS)
    if depths:
        total_queue: float | None = sum(p.value for p in depths)
    elif pending is not None:
        total_queue = pending
    else:
        known = [r.queue_depth for r in rows if r.queue_depth is not None]
        total_queue = sum(known) if known else None
    total = row(TOTAL, list, total_queue)

    ipc = [p for p in _named(gained, IPC_REQUEST_DURATION) if _attr(p, "method") not in IPC_NOT_WORK]
    buckets, bounds = merge_buckets(ipc)
    age_buckets, age_bounds = merge_buckets(_named(gained, WORK_ITEM_AGE))
    total_buckets, total_bounds = merge_buckets(_named(gained, REQUEST_BATCH_TOTAL))
    return View(
        worker_id=current.worker_id,
        ready=current.ready,
        interval_s=interval,
        rows=tuple(rows),
        total=total,
        pending_items=pending,
        pending_cost=_gauge(now, PENDING_COST),
        inflight_batches=_gauge(now, INFLIGHT_BATCHES),
        ipc_requests_per_s=sum(p.count for p in ipc) / interval,
        ipc_p50_s=quantile(buckets, bounds, 0.50),
        ipc_p99_s=quantile(buckets, bounds, 0.99),
        naks=sum(p.value for p in naks),
        naks_per_s=sum(p.value for p in naks_gained) / interval,
        redeliveries=float(sum(p.count for p in redelivered)) if attempts else None,
        redeliveries_per_s=sum(p.count for p in redelivered_gained) / interval if attempts else None,
        has_telemetry=current.has_telemetry,
        version=current.version,
        not_ready_reason=current.not_ready_reason,
        nats=nats_of(current.nats),
        lag=lag_of(current.lag),
        failures=failures_of(now) if current.has_telemetry else None,
        item_age_p50_s=bucket_bound(age_buckets, age_bounds, 0.50),
        item_age_p99_s=bucket_bound(age_buckets, age_bounds, 0.99),
        batch_total_p50_s=quantile(total_buckets, total_bounds, 0.50),
        batch_total_p99_s=quantile(total_buckets, total_bounds, 0.99),
    )


# -- output --


def _r(x: float | None) -> float | None:
    """Six significant digits: enough for any reading, and a tiny fill ratio keeps its value."""
    return None if x is None else float(f"{x:.6g}")


def row_json(row: Row) -> dict[str, Any]:
    return {
        "items_per_s": _r(row.items_per_s),
        "batches_per_s": _r(row.batches_per_s),
        "mean_batch_size": _r(row.mean_batch_size),
        "cost_fill": _r(row.cost_fill),
        "queue_depth": row.queue_depth,
        "naks": row.naks,
        "redeliveries": row.redeliveries,
        "items": row.items,
        "batches": row.batches,
    }


def view_json(view: View) -> dict[str, Any]:
    """The `--once --json` document: per model and totals, then the process-wide figures."""
    ms = 1000.0
    return {
        "worker_id": view.worker_id,
        "ready": view.ready,
        "interval_s": _r(view.interval_s),
        "telemetry": view.has_telemetry,
        "models": {r.model: row_json(r) for r in view.rows},
        "totals": row_json(view.total),
        "pending": {"items": view.pending_items, "cost": view.pending_cost, "inflight_batches": view.inflight_batches},
        "ipc": {
            "requests_per_s": _r(view.ipc_requests_per_s),
            "p50_ms": _r(None if view.ipc_p50_s is None else view.ipc_p50_s * ms),
            "p99_ms": _r(None if view.ipc_p99_s is None else view.ipc_p99_s * ms),
        },
        "naks": {"count": view.naks, "per_s": _r(view.naks_per_s)},
        "redeliveries": {"count": view.redeliveries, "per_s": _r(view.redeliveries_per_s)},
        "version": view.version,
        "not_ready_reason": view.not_ready_reason,
        "nats": None if view.nats is None else dataclasses.asdict(view.nats),
        "lag": {
            lag.consumer: {
                "num_pending": lag.num_pending,
                "num_ack_pending": lag.num_ack_pending,
                "age_s": lag.age_s,
                "error": lag.error,
            }
            for lag in view.lag
        },
        "latency": {
            "item_age_p50_le_s": _bound_json(view.item_age_p50_s),
            "item_age_p99_le_s": _bound_json(view.item_age_p99_s),
            "batch_total_p50_ms": _r(None if view.batch_total_p50_s is None else view.batch_total_p50_s * ms),
            "batch_total_p99_ms": _r(None if view.batch_total_p99_s is None else view.batch_total_p99_s * ms),
        },
        "failures": None if view.failures is None else dataclasses.asdict(view.failures),
    }


def _bound_json(x: float | None) -> float | str | None:
    """A bucket bound for JSON: `overflow` past the last one (JSON has no infinity)."""
    return None if x is None else x if math.isfinite(x) else "overflow"


def _n(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}" if x == 0 or abs(x) >= 0.01 else f"{x:.2%}"


COLUMNS: Final = ("ITEMS/S", "BATCHES/S", "MEAN BATCH", "COST FILL", "QUEUE", "NAKS", "REDELIVERED", "ITEMS")


def _cells(row: Row) -> tuple[str, ...]:
    return (
        _n(row.items_per_s, ",.1f"),
        _n(row.batches_per_s, ",.1f"),
        _n(row.mean_batch_size, ",.1f"),
        _percent(row.cost_fill),
        _n(row.queue_depth),
        _n(row.naks),
        _n(row.redeliveries),
        _n(row.items),
    )


def _le(seconds: float | None) -> str:
    """A bucket's upper bound: `<=2 s`; past the last bound, `overflow`."""
    if seconds is None:
        return "-"
    return f"<={seconds:g} s" if math.isfinite(seconds) else "overflow"


def _counts(label: str, counts: Mapping[str, float]) -> str | None:
    """`NAKs retry 3, not_ready 2`; None when all are zero."""
    shown = [f"{k} {v:,.0f}" for k, v in counts.items() if v]
    return f"{label} {', '.join(shown)}" if shown else None


def nats_line(nats: NatsLine) -> str:
    if nats.connected is False:
        down = "disconnected" if nats.disconnected_s is None else f"disconnected {nats.disconnected_s:,.1f} s"
        state = f"{down}, {_n(nats.failures)} failed attempts"
    else:
        state = "connected" if nats.connected else "-"
    return (
        f"NATS {nats.server or '-'}  {state}  reconnects {_n(nats.reconnects)}  last error: {nats.last_error or 'none'}"
    )


def lag_line(lags: Sequence[Lag]) -> str:
    """`lag (JetStream num_pending)  pool 1,234 (12 un-ACKed, 0.4 s ago)  worker 0 (...)`."""
    parts = []
    for lag in lags:
        if lag.num_pending is None:
            part = f"{lag.consumer} - (reading)" if lag.error is None else f"{lag.consumer} - ({lag.error})"
        else:
            part = (
                f"{lag.consumer} {lag.num_pending:,} ({_n(lag.num_ack_pending)} un-ACKed, {_n(lag.age_s, '.1f')} s ago"
            )
            part += f"; refresh failed: {lag.error})" if lag.error else ")"
        parts.append(part)
    return "lag (JetStream num_pending)  " + "  ".join(parts)


def failures_line(failures: Failures | None) -> str:
    if failures is None:
        return "failures -"
    groups = [
        _counts("NAKs", failures.naks),
        _counts("NATS errors", failures.nats_errors),
        _counts("IPC", failures.ipc),
        _counts("replies not published", failures.publish),
        _counts("payload fetches", failures.payload),
        f"deadline drops {failures.deadline_dropped:,.0f}" if failures.deadline_dropped else None,
    ]
    shown = [g for g in groups if g is not None]
    return "failures since start: " + ("; ".join(shown) if shown else "none")


def render(view: View, *, source: str, clock: str = "", width: int = 120, height: int | None = None) -> list[str]:
    """The screen as lines no wider than `width`; with `height`, model rows beyond it are elided."""
    if view.ready is None:
        state = "readiness unknown"
    elif view.ready:
        state = "ready"
    else:
        state = f"not ready: {view.not_ready_reason}" if view.not_ready_reason else "not ready"
    redelivered = (
        "-" if view.redeliveries is None else f"{view.redeliveries:,.0f} ({view.redeliveries_per_s or 0:,.1f}/s)"
    )
    version = f"version {view.version}" if view.version else "version -"
    every = f"every {view.interval_s:.1f} s"
    lines = [f"sie-sidecar top  {view.worker_id}  {version}  {source}  {state}  {every}  {clock}".rstrip()]
    if view.nats is not None:
        lines.append(nats_line(view.nats))
    if view.lag:
        lines.append(lag_line(view.lag))
    lines += [
        f"pending {_n(view.pending_items)} items, {_n(view.pending_cost)} cost; "
        f"{_n(view.inflight_batches)} batches in flight",
        f"IPC round trip p50 {_ms(view.ipc_p50_s)}  p99 {_ms(view.ipc_p99_s)}  ({view.ipc_requests_per_s:,.1f}/s)  "
        f"NAKs {view.naks:,.0f} ({view.naks_per_s:,.1f}/s)  redeliveries {redelivered}",
        f"item age at dispatch p50 {_le(view.item_age_p50_s)}  p99 {_le(view.item_age_p99_s)}  "
        f"batch in sidecar p50 {_ms(view.batch_total_p50_s)}  p99 {_ms(view.batch_total_p99_s)}",
        failures_line(view.failures),
        "",
    ]
    name_width = min(max([5, len(TOTAL), *(len(r.model) for r in view.rows)]), 48)
    widths = [max(len(c), 9) for c in COLUMNS]

    def line(name: str, cells: Sequence[str]) -> str:
        name = name if len(name) <= name_width else name[: name_width - 1] + "~"
        return f"{name:<{name_width}}" + "".join(f"  {c:>{w}}" for c, w in zip(cells, widths, strict=True))

    lines.append(line("MODEL", COLUMNS))
    rows = list(view.rows)
    if height is not None:
        room = max(1, height - len(lines) - 3)
        if len(rows) > room:
            hidden = len(rows) - (room - 1)
            rows = rows[: room - 1]
            lines += [line(r.model, _cells(r)) for r in rows]
            lines.append(f"... {hidden} more models")
            rows = []
    lines += [line(r.model, _cells(r)) for r in rows]
    lines.append(line(TOTAL, _cells(view.total)))
    if not view.has_telemetry:
        lines.append("this sidecar's /debug/state has no telemetry: rates need a newer sidecar")
    return [s[:width] for s in lines]


# -- the command --


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    port = os.environ.get("SIE_WORKER_PROBE_PORT", "").strip()
    parser.add_argument(
        "--probe-port",
        type=int,
        default=int(port) if port.isdigit() else DEFAULT_PROBE_PORT,
        help=f"the sidecar's probe port (default: SIE_WORKER_PROBE_PORT, else {DEFAULT_PROBE_PORT})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="the sidecar's address (default 127.0.0.1)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between reads (default 1)")
    parser.add_argument("--once", action="store_true", help="two reads --interval apart, one view, exit")
    parser.add_argument("--json", action="store_true", help="print the view as one JSON document (implies --once)")


def _read(url: str) -> Sample:
    state = fetch_state(url)
    return sample_of(state, time.monotonic())


def run_once(url: str, interval_s: float, *, as_json: bool, out: TextIO) -> int:
    first = _read(url)
    time.sleep(interval_s)
    view = compute(first, _read(url))
    if as_json:
        out.write(json.dumps(view_json(view), indent=2) + "\n")
    else:
        out.write("\n".join(render(view, source=url, width=shutil.get_terminal_size().columns)) + "\n")
    return 0


@contextlib.contextmanager
def _keys(stream: TextIO) -> Iterator[int | None]:
    """The terminal's input in cbreak mode (keys arrive one at a time, Ctrl-C still interrupts),
    restored on the way out; None when the input is no terminal."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        yield None
        return
    if not os.isatty(fd):
        yield None
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait(seconds: float, fd: int | None) -> bool:
    """Sleep `seconds`; True as soon as `q` is pressed."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if fd is None:
            time.sleep(left)
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 32).lower().startswith(b"q"):
            return True
    return False


def run_live(url: str, interval_s: float, *, out: TextIO, keys: TextIO) -> int:
    """Redraw every `interval_s` until `q` or Ctrl-C; an unreachable sidecar is shown and retried."""

    def draw(lines: Sequence[str]) -> None:
        out.write(_CLEAR + "\r\n".join(lines) + "\r\n")
        out.flush()

    previous: Sample | None = None
    out.write(_ENTER)
    try:
        with _keys(keys) as fd:
            while True:
                size = shutil.get_terminal_size()
                try:
                    current = _read(url)
                except TopError as exc:
                    if exc.fatal:
                        raise
                    previous = None
                    draw([f"sie-sidecar top  {url}", "", str(exc), "retrying every interval; q or Ctrl-C quits"])
                else:
                    if previous is None:
                        draw([f"sie-sidecar top  {url}", "", f"reading again in {interval_s:.1f} s for rates..."])
                    else:
                        clock = time.strftime("%H:%M:%S")
                        lines = render(
                            compute(previous, current),
                            source=url,
                            clock=clock,
                            width=size.columns,
                            height=size.lines - 1,
                        )
                        draw([*lines, "", "q or Ctrl-C quits"])
                    previous = current
                if _wait(interval_s, fd):
                    return 0
    except KeyboardInterrupt:
        return 0
    finally:
        out.write(_LEAVE)
        out.flush()


def run_top(args: argparse.Namespace) -> int:
    """`sie-sidecar top`: the live view, or with `--once` (and `--json`) one view of two reads."""
    if args.interval <= 0:
        print("sie-sidecar top: --interval must be positive", file=sys.stderr)
        return 2
    url = state_url(args.host, args.probe_port)
    try:
        if args.once or args.json:
            return run_once(url, args.interval, as_json=args.json, out=sys.stdout)
        return run_live(url, args.interval, out=sys.stdout, keys=sys.stdin)
    except TopError as exc:
        print(f"sie-sidecar top: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


__all__ = [
    "Failures",
    "Lag",
    "NatsLine",
    "Row",
    "Sample",
    "TopError",
    "View",
    "add_top_arguments",
    "bucket_bound",
    "compute",
    "delta",
    "fetch_state",
    "merge_buckets",
    "parse_points",
    "quantile",
    "render",
    "run_top",
    "sample_of",
    "state_url",
    "view_json",
]
