# SPDX-License-Identifier: Apache-2.0
"""When will the backend's device be free? The estimate behind just-in-time dispatch.

With two batches pipelined, v0.7.1 sends the next batch as soon as a pipeline slot opens or a
former's wait expires. It then sits in the backend's queue for most of the running batch's time,
and the items that arrive meanwhile miss it and wait for the batch after. Sending it just before the
device frees lets it carry those items, at no cost in device time: the GPU still never waits.

The estimate comes from what each finished batch reports, nothing else:

- service time `S(cost) = a + b x cost`, a least-squares line through the last `SERVICE_WINDOW`
  (total cost, backend `inference_ms`) pairs, with a and b kept non-negative;
- overhead: round trip minus `inference_ms` (IPC, decoding and framing on both sides) of batches
  sent while nothing else was in flight, the median of the last `OVERHEAD_WINDOW`. Until the first
  such batch `DEFAULT_OVERHEAD_S` stands in. Batches queued behind another teach nothing here: their
  round trip includes the queue, and timer noise on a busy host makes a queued batch look as if the
  device had waited for it (measured: taking those as samples ratcheted the estimate from 2 to 16
  ms in four seconds, releasing every batch far too early).

The in-flight chain is anchored on the last completion seen: a batch sent at `d` with nothing ahead
completes at `d + overhead + S`; one queued behind another at `previous completion + S`. The next
batch is released `overhead + margin` before the chain's end, so it reaches the device as it frees.
Until the service window holds enough samples, or when the backend reports no `inference_ms`, there
is no estimate and the scheduler behaves exactly as without it. Nor is there one while the batch ahead
takes less device time than the overhead: then the round trip is mostly IPC, there is nothing to
catch, and releasing on the estimate only cuts batches small (measured on the null backend at ~20k
items/s: the sidecar's CPU per 1,000 items rose from 32 to 38-40 ms).
"""

from __future__ import annotations

import operator
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Final

SERVICE_WINDOW: Final = 64
OVERHEAD_WINDOW: Final = 32
MIN_SERVICE_SAMPLES: Final = 8
MIN_OVERHEAD_SAMPLES: Final = 1
#: The overhead before any sample: a loopback Unix-socket round trip with msgpack on both sides.
DEFAULT_OVERHEAD_S: Final = 0.002
#: Released this much earlier than the estimate, plus `MARGIN_FRACTION` of the batch ahead's service
#: time: a late guess leaves the device idle, an early one only costs a few items their ride.
MARGIN_S: Final = 0.001
MARGIN_FRACTION: Final = 0.05


@dataclass(slots=True)
class _InFlight:
    sent_at: float
    cost: int


class DeviceClock:
    """Per-model service-time and overhead estimates, and the in-flight batches they apply to."""

    def __init__(self) -> None:
        self._service: deque[tuple[int, float]] = deque(maxlen=SERVICE_WINDOW)
        self._overhead: deque[float] = deque(maxlen=OVERHEAD_WINDOW)
        self._in_flight: dict[int, _InFlight] = {}
        self._last_done: float | None = None
        self._fit: tuple[float, float] | None = None
        self._overhead_s: float | None = None

    # -- what happens -------------------------------------------------------------------------------

    def sent(self, token: int, at: float, cost: int) -> None:
        """A batch went to the backend (tokens increase with sending order)."""
        self._in_flight[token] = _InFlight(at, cost)

    def done(self, token: int, at: float, inference_ms: float | None, *, alone: bool) -> None:
        """A batch came back; `alone` when nothing else was in flight while it was sent."""
        flight = self._in_flight.pop(token, None)
        self._last_done = at if self._last_done is None else max(self._last_done, at)
        if flight is None or inference_ms is None or not inference_ms >= 0.0:  # NaN and negatives too
            return
        service_s = inference_ms / 1000.0
        self._service.append((flight.cost, service_s))
        self._fit = None
        if alone:
            self._overhead.append(max(0.0, (at - flight.sent_at) - service_s))
            self._overhead_s = None

    # -- estimates ----------------------------------------------------------------------------------

    def service_s(self, cost: int) -> float | None:
        """Estimated device time of a batch of this total cost, or None before enough samples."""
        if len(self._service) < MIN_SERVICE_SAMPLES:
            return None
        if self._fit is None:
            self._fit = _line(self._service)
        a, b = self._fit
        return a + b * cost

    def overhead_s(self) -> float:
        if len(self._overhead) < MIN_OVERHEAD_SAMPLES:
            return DEFAULT_OVERHEAD_S
        if self._overhead_s is None:
            self._overhead_s = statistics.median(self._overhead)
        return self._overhead_s

    def release_at(self) -> float | None:
        """When the next batch should be sent so that it reaches the device as it frees; None when
        nothing is in flight or there is no estimate yet (send at once)."""
        if not self._in_flight:
            return None
        overhead = self.overhead_s()
        end: float | None = self._last_done
        service = 0.0
        for flight in self._in_flight.values():  # sending order (dicts keep insertion order)
            estimate = self.service_s(flight.cost)
            if estimate is None:
                return None
            service = estimate
            alone_end = flight.sent_at + overhead + service
            end = alone_end if end is None else max(alone_end, end + service)
        assert end is not None
        if service < overhead:  # a device faster than the IPC round trip: nothing to time
            return None
        return end - overhead - MARGIN_S - MARGIN_FRACTION * service


def _line(samples: deque[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (a, b) of service = a + b x cost, both clamped at 0 (a flat mean when the costs
    do not vary). Sums in C (`sum` over `map`), no Python loop over the window: it runs once per batch.
    The cost sums are exact integers, so a window of one cost gives no slope at all, as it must."""
    n = len(samples)
    costs, services = zip(*samples, strict=True)
    sx = sum(costs)
    sy = sum(services)
    sq = sum(map(operator.mul, costs, costs))
    sxx = n * sq - sx * sx  # n^2 x the variance of the costs, exact
    if sxx <= 0:
        return sy / n, 0.0
    sxy = sum(map(operator.mul, costs, services))
    b = (n * sxy - sx * sy) / sxx
    if b <= 0.0:
        return sy / n, 0.0
    a = (sy - b * sx) / n
    if a < 0.0:  # through the origin instead
        return 0.0, sxy / sq
    return a, b


__all__ = ["DeviceClock"]
