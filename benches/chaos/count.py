# SPDX-License-Identifier: Apache-2.0
"""The end-of-scenario accounting: every item answered exactly once, more than once (attributed), still
in the stream, never accepted by the stream (the publisher gave up), or LOST (none of those); latency
and answer rate before, during and after the fault; recovery and settle times."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .load import Ledger

ACK_WAIT_S = 30.0  # the pool durable's ack_wait (bus/topology.POOL_ACK_WAIT_S)


@dataclass(frozen=True)
class Mark:
    t: float  # seconds since the gateway's t0
    label: str
    kind: str = "event"  # "fault" (a fault begins), "restored" (the faulted part is back), "event"


@dataclass
class Window:
    name: str
    start: float
    end: float
    published: int = 0
    answered: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    items_per_s: float | None = None  # first answers arriving in the window / its length


@dataclass
class Count:
    items: int
    exactly_once: int
    duplicated_items: int
    duplicate_answers: int
    duplicates_by_cause: dict[str, int]
    in_stream: int
    never_accepted: int
    lost: int
    lost_ids: list[str]
    #: The first duplicated items: work_item_id -> every answer as [t, success, worker_id].
    duplicate_samples: dict[str, list[tuple[float, bool, str]]]
    error_answers: int
    republished: int
    windows: list[Window] = field(default_factory=list)
    recovery_s: float | None = None
    settle_s: float | None = None
    recovery_threshold_ms: float | None = None
    max_latency_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.lost == 0


def _percentiles(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    arr = np.asarray(values)
    p50, p99 = (float(v) for v in np.percentile(arr, [50, 99]))
    return p50, p99, float(arr.max())


def _cause(marks: list[Mark], first: float, later: float, republished: bool) -> str:
    """A duplicate's cause: a publish retry (the gateway's own at-least-once); else a fault that was in
    progress when the item was first answered (from 1 s before it began, as a reply can leave just
    before a kill, to 1 s after its part was back); else the clean path (which must never happen)."""
    gap = later - first
    how = "after ack_wait" if gap >= ACK_WAIT_S - 1.0 else f"after {gap:.1f} s"
    if republished:
        return "publish retry (no PubAck: the stream may hold two copies)"
    restored = [m.t for m in marks if m.kind == "restored"]
    for m in reversed([m for m in marks if m.kind == "fault"]):
        back = max([t for t in restored if t >= m.t], default=m.t + 5.0)
        if m.t - 1.0 <= first <= back + 1.0:
            return f"{m.label} (redelivered {how})"
    return f"CLEAN PATH (redelivered {how})"


def count(
    ledger: Ledger,
    marks: list[Mark],
    in_stream_ids: set[str],
    gave_up: set[int],
    publish_end: float,
    *,
    drain_rate: bool = False,
) -> Count:
    dup_causes: Counter[str] = Counter()
    exactly = dup_items = dup_answers = in_stream = never_accepted = lost = errors = republished = 0
    lost_ids: list[str] = []
    dup_samples: dict[str, list[tuple[float, bool, str]]] = {}
    for i in range(ledger.count):
        answers = ledger.answers[i]
        if ledger.publishes[i] > 1:
            republished += 1
        if not answers:
            wid = ledger.work_item_id(i)
            if wid in in_stream_ids:
                in_stream += 1
            elif i in gave_up or not ledger.acked[i]:
                never_accepted += 1
            else:
                lost += 1
                if len(lost_ids) < 50:
                    lost_ids.append(wid)
            continue
        if not answers[0][1]:
            errors += 1
        if len(answers) == 1:
            exactly += 1
            continue
        dup_items += 1
        dup_answers += len(answers) - 1
        if len(dup_samples) < 20:
            dup_samples[ledger.work_item_id(i)] = [(round(t, 3), ok, w) for t, ok, w in answers]
        for t, _, _ in answers[1:]:
            dup_causes[_cause(marks, answers[0][0], t, ledger.publishes[i] > 1)] += 1
    result = Count(
        items=ledger.count,
        exactly_once=exactly,
        duplicated_items=dup_items,
        duplicate_answers=dup_answers,
        duplicates_by_cause=dict(dup_causes),
        in_stream=in_stream,
        never_accepted=never_accepted,
        lost=lost,
        lost_ids=lost_ids,
        duplicate_samples=dup_samples,
        error_answers=errors,
        republished=republished,
    )
    _timing(result, ledger, marks, publish_end, drain_rate=drain_rate)
    return result


def _latency_ms(ledger: Ledger, i: int) -> float | None:
    sent = ledger.publish_t[i]
    answers = ledger.answers[i]
    if sent is None or not answers:
        return None
    return (answers[0][0] - sent) * 1000.0


def _timing(result: Count, ledger: Ledger, marks: list[Mark], publish_end: float, *, drain_rate: bool) -> None:
    sent = [t for t in ledger.publish_t if t is not None]
    if not sent:
        return
    load_start = min(sent)
    faults = [m.t for m in marks if m.kind == "fault"]
    restored = [m.t for m in marks if m.kind == "restored"]
    bounds: list[tuple[str, float, float]] = [("all", load_start, publish_end)]
    fault = back = 0.0
    if faults:
        fault = faults[0]
        back = max(restored) + 1.0 if restored else fault + 5.0
        # Items published in the last second before the fault are caught by it: they count as "during".
        edge = max(load_start, fault - 1.0)
        bounds = [("before", load_start, edge), ("during", edge, back), ("after", back, max(publish_end, back))]
    firsts = [a[0][0] for a in ledger.answers if a]
    latencies = [(_latency_ms(ledger, i), ledger.publish_t[i]) for i in range(ledger.count)]
    last_answer = max(firsts, default=publish_end)
    for n, (name, start, end) in enumerate(bounds):
        in_window = [lat for lat, t in latencies if t is not None and start <= t < end]
        answered = [lat for lat in in_window if lat is not None]
        p50, p99, mx = _percentiles(answered)
        # With `drain_rate` the last window's rate runs on to the last answer (a tail load, whose
        # answers may all come after its last publish while a backlog drains).
        rate_end = max(end, last_answer) if drain_rate and n == len(bounds) - 1 else end
        length = rate_end - start
        rate = sum(1 for f in firsts if start <= f <= rate_end) / length if length > 0.2 else None
        result.windows.append(Window(name, start, end, len(in_window), len(answered), p50, p99, mx, rate))
    all_lat = [lat for lat, _ in latencies if lat is not None]
    result.max_latency_ms = max(all_lat) if all_lat else None
    if not faults:
        return
    # The healthy latency: items answered before the fault began (not those it caught in flight).
    healthy = [
        lat
        for i, (lat, t) in enumerate(latencies)
        if lat is not None and t is not None and ledger.answers[i][0][0] < fault
    ]
    base_p99 = _percentiles(healthy)[1] or 50.0
    threshold = max(3.0 * base_p99, base_p99 + 200.0)
    result.recovery_threshold_ms = threshold
    # Recovery: from the fault until the last item published after it that was answered slowly (or not at all).
    slow = [t for lat, t in latencies if t is not None and t >= fault and (lat is None or lat > threshold)]
    result.recovery_s = (max(slow) - fault) if slow else 0.0
    # Settle: from the fault until the last first answer of any item published before the faulted part was back.
    last = [
        ledger.answers[i][0][0] for i in range(ledger.count) if ledger.answers[i] and (ledger.publish_t[i] or 0) < back
    ]
    result.settle_s = max(0.0, max(last) - fault) if last else None


def to_json(c: Count) -> dict[str, Any]:
    return asdict(c)


__all__ = ["Count", "Mark", "Window", "count", "to_json"]
