# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar top`: a live view of a running sidecar for people (issue 14).

It reads `GET /debug/state` on the probe port (served when the sidecar runs with
`SIE_SIDECAR_DEBUG_ENDPOINT=1`) once a second. The document's `telemetry` key is the in-process
registry's snapshot: cumulative counters, gauges and explicit-bucket histograms. Rates and quantiles
come from the difference of two reads, so the sidecar keeps no windows for this view and two reads
`--interval` apart are needed even for `--once`.

Per model: items/s and batches/s (`sie.worker.batch.size`: count = batches, sum = items), the mean
batch size over the interval, the cost fill (`sie.worker.batch.fill_ratio`), queue depth
(`sie.worker.queue.depth`, else the dispatcher's own per-model count), NAKs and redeliveries when
their points carry a model. For the process: pending items and cost, batches in flight, p50/p99 of
the IPC round trip (`sie.worker.ipc.request.duration`, every method but the `ping` heartbeat), NAKs
(`sie.worker.nats.operations`, operation=nak) and redeliveries (`sie.worker.nats.delivery.attempts`
with redelivered=true). An instrument that is absent shows 0 when absence means nothing happened (a
counter appears on first use) and `-` when the value is unknown.

Cost fill: a gauge holds the fill ratio of the last batch per flush reason; the view shows their
mean weighted by the batches each reason formed during the interval (the dispatcher's per-model
`flushes` counts in the same document), or their plain mean when no batch was formed.

Hook: `add_top_arguments` + `run_top` for the `sie-sidecar` CLI. Exit status 0, or 1 when the
endpoint cannot be read (`--once`) or is absent (404: the sidecar runs without the debug endpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
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
    NATS_DELIVERY_ATTEMPTS,
    NATS_OPERATIONS,
    PENDING_COST,
    PENDING_ITEMS,
    QUEUE_DEPTH,
    Kind,
    Point,
)

DEFAULT_PROBE_PORT: Final = 9095
DEFAULT_INTERVAL_S: Final = 1.0
FETCH_TIMEOUT_S: Final = 2.0
NO_ENDPOINT: Final = "start the sidecar with SIE_SIDECAR_DEBUG_ENDPOINT=1"
#: IPC methods left out of the round trip: the heartbeat's ping is no work and would swamp the rest.
IPC_NOT_WORK: Final = frozenset({"ping"})
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
        exc.close()  # it holds the response's socket
        if exc.code == 404:
            raise TopError(f"{url} answered 404: {NO_ENDPOINT}", fatal=True) from None
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
    return Sample(
        at=at,
        points=tuple(parse_points(state.get("telemetry"))),
        models={str(m): e for m, e in models.items() if isinstance(e, dict)} if isinstance(models, dict) else {},
        worker_id=str(state.get("worker_id") or "-"),
        ready=ready if isinstance(ready, bool) else None,
        has_telemetry=isinstance(state.get("telemetry"), list),
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
    }


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


def render(view: View, *, source: str, clock: str = "", width: int = 120, height: int | None = None) -> list[str]:
    """The screen as lines no wider than `width`; with `height`, model rows beyond it are elided."""
    state = "ready" if view.ready else "not ready" if view.ready is not None else "readiness unknown"
    redelivered = (
        "-" if view.redeliveries is None else f"{view.redeliveries:,.0f} ({view.redeliveries_per_s or 0:,.1f}/s)"
    )
    lines = [
        f"sie-sidecar top  {view.worker_id}  {source}  {state}  every {view.interval_s:.1f} s  {clock}".rstrip(),
        f"pending {_n(view.pending_items)} items, {_n(view.pending_cost)} cost; "
        f"{_n(view.inflight_batches)} batches in flight",
        f"IPC round trip p50 {_ms(view.ipc_p50_s)}  p99 {_ms(view.ipc_p99_s)}  ({view.ipc_requests_per_s:,.1f}/s)  "
        f"NAKs {view.naks:,.0f} ({view.naks_per_s:,.1f}/s)  redeliveries {redelivered}",
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
    "Row",
    "Sample",
    "TopError",
    "View",
    "add_top_arguments",
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
