# SPDX-License-Identifier: Apache-2.0
"""One in-process registry the pipeline's stages record into (sidecar-behaviour §13 instruments).

The health heartbeat reads it (§10: queue depth, pending cost, in-flight batches) and `otel/` pushes
its snapshots over OTLP, without the stages knowing of either. Recording has to stay
off the per-message path, so:

- stages record per batch (or per group of deliveries), never per message;
- an instrument is a small object with one number (a histogram: a few); a stage looks it up once
  (`Registry.gauge(...)` at construction) and then records with one attribute add;
- keyed lookups (`Registry.add`/`set`/`record`) cost one dict lookup, for stages that record rarely.

Instruments are keyed by name plus an attribute tuple of `(key, value)` pairs. The tuple is taken
as given (not sorted), so a stage passes its attributes in one fixed order. Everything runs on the
event loop's thread; there is no locking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from ..wire.histogram import Histogram
from .names import Kind

Attrs = tuple[tuple[str, str], ...]


#: Default histogram bucket bounds (upper, inclusive): powers of two up to 65,536, enough for items
#: per batch and batch costs; durations pass their own.
DEFAULT_BOUNDS: Final[tuple[float, ...]] = tuple(float(2**n) for n in range(17))
#: Duration bounds in seconds: 0.5 ms to ~4 min, doubling.
DURATION_BOUNDS_S: Final[tuple[float, ...]] = tuple(0.0005 * 2**n for n in range(20))
#: Size bounds in bytes: 1 KiB to 64 MiB, doubling.
SIZE_BOUNDS_BYTES: Final[tuple[float, ...]] = tuple(float(1024 * 2**n) for n in range(17))


class Counter:
    """A monotonically increasing sum."""

    __slots__ = ("attrs", "name", "observed", "value")
    kind: Final = "counter"

    def __init__(self, name: str, attrs: Attrs) -> None:
        self.name, self.attrs = name, attrs
        self.value: float = 0
        #: Moved by `catch_up` (an observed total, OpenTelemetry's asynchronous counter): the
        #: `lowmemory` temporality exports it cumulative, the recorded ones as deltas.
        self.observed = False

    def add(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name} cannot decrease (add {amount})")
        self.value += amount

    def catch_up(self, total: float) -> None:
        """An observed total (counted elsewhere): the counter moves up to it, never down."""
        self.observed = True
        self.value = max(self.value, total)


class Gauge:
    """A current value: set outright, or moved by deltas (an up-down counter)."""

    __slots__ = ("attrs", "name", "value")
    kind: Final = "gauge"

    def __init__(self, name: str, attrs: Attrs) -> None:
        self.name, self.attrs = name, attrs
        self.value: float = 0

    def set(self, value: float) -> None:
        self.value = value

    def add(self, delta: float) -> None:
        self.value += delta


Instrument = Counter | Gauge | Histogram


@dataclass(frozen=True, slots=True)
class Point:
    """One instrument's state at snapshot time (what an exporter would send)."""

    name: str
    kind: Kind
    attrs: Attrs
    value: float  # counter/gauge value; a histogram's sum
    count: int = 0  # histograms only
    buckets: tuple[int, ...] = ()
    bounds: tuple[float, ...] = ()
    #: Counters only: an observed total (`Counter.catch_up`), not recorded increments.
    observed: bool = False
    #: Histograms only: the smallest and largest value recorded (None when none was).
    min: float | None = None
    max: float | None = None


class Registry:
    """Instruments by (name, attributes); one registry per sidecar process (or per test stack)."""

    def __init__(self) -> None:
        self._instruments: dict[tuple[str, Attrs], Instrument] = {}
        self._kinds: dict[str, Kind] = {}
        self._observers: list[Callable[[Registry], None]] = []

    def _claim(self, name: str, kind: Kind) -> None:
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise ValueError(f"{name} is a {known}, not a {kind}")

    def counter(self, name: str, attrs: Attrs = ()) -> Counter:
        found = self._instruments.get((name, attrs))
        if found is None:
            self._claim(name, "counter")
            found = self._instruments[(name, attrs)] = Counter(name, attrs)
        if not isinstance(found, Counter):
            raise ValueError(f"{name} is a {found.kind}, not a counter")
        return found

    def gauge(self, name: str, attrs: Attrs = ()) -> Gauge:
        found = self._instruments.get((name, attrs))
        if found is None:
            self._claim(name, "gauge")
            found = self._instruments[(name, attrs)] = Gauge(name, attrs)
        if not isinstance(found, Gauge):
            raise ValueError(f"{name} is a {found.kind}, not a gauge")
        return found

    def histogram(self, name: str, attrs: Attrs = (), bounds: Sequence[float] = DEFAULT_BOUNDS) -> Histogram:
        found = self._instruments.get((name, attrs))
        if found is None:
            self._claim(name, "histogram")
            found = self._instruments[(name, attrs)] = Histogram(name, attrs, bounds)
        if not isinstance(found, Histogram):
            raise ValueError(f"{name} is a {found.kind}, not a histogram")
        return found

    # -- keyed recording (one dict lookup; for stages that record rarely) --

    def add(self, name: str, amount: float = 1, attrs: Attrs = ()) -> None:
        """Add to a counter."""
        self.counter(name, attrs).add(amount)

    def set(self, name: str, value: float, attrs: Attrs = ()) -> None:
        """Set a gauge."""
        self.gauge(name, attrs).set(value)

    def record(self, name: str, value: float, attrs: Attrs = ()) -> None:
        """Record into a histogram (default bounds unless it already exists)."""
        self.histogram(name, attrs).record(value)

    # -- reading --

    def value(self, name: str, attrs: Attrs = ()) -> float:
        """A counter's or gauge's current value (0 when never recorded); a histogram's sum."""
        found = self._instruments.get((name, attrs))
        if found is None:
            return 0
        return found.sum if isinstance(found, Histogram) else found.value

    def total(self, name: str) -> float:
        """A counter's or gauge's value summed over every attribute set."""
        return sum(
            (i.sum if isinstance(i, Histogram) else i.value) for (n, _), i in self._instruments.items() if n == name
        )

    def __iter__(self) -> Iterator[Instrument]:
        return iter(list(self._instruments.values()))

    def observe(self, observer: Callable[[Registry], None]) -> None:
        """Run `observer` before each snapshot: for values some other part already counts (the
        native response budget's totals, a pool's idle connections), read when exported instead of
        recorded twice. It sets gauges, and counters through `Counter.catch_up`."""
        self._observers.append(observer)

    def snapshot(self) -> list[Point]:
        """Every instrument's current state (observers run first), in registration order."""
        for observer in self._observers:
            observer(self)
        points = []
        for i in self._instruments.values():
            if isinstance(i, Histogram):
                low, high = (i.min, i.max) if i.count else (None, None)
                points.append(
                    Point(i.name, "histogram", i.attrs, i.sum, i.count, tuple(i.buckets), i.bounds, min=low, max=high)
                )
            elif isinstance(i, Counter):
                points.append(Point(i.name, "counter", i.attrs, i.value, observed=i.observed))
            else:
                points.append(Point(i.name, i.kind, i.attrs, i.value))
        return points


__all__ = [
    "DEFAULT_BOUNDS",
    "DURATION_BOUNDS_S",
    "SIZE_BOUNDS_BYTES",
    "Attrs",
    "Counter",
    "Gauge",
    "Histogram",
    "Point",
    "Registry",
]
