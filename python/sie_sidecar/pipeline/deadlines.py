# SPDX-License-Identifier: Apache-2.0
"""Work deadlines (sidecar-behaviour §15.3, newer than v0.7.1): which items nobody waits for any more,
the leases that keep held items with a deadline from being redelivered, and the work-item ages.

Python touches a batch here, not an item (law 1): `deadline_split` and `deadline_lease_holders` are
one native call per batch; `_twins.deadlines` holds their twins (the path with
`SIE_SIDECAR_NO_EXTENSIONS=1`, and the oracle of the parity tests), chosen by `wire._switch`. The
work-item ages are recorded by `pipeline.columns.run_batch_columns`, in its one pass over a batch.

The rules, in one place:

- A deadline is *usable* only if finite, > 0, the item's timestamp > 0, and
  0 <= deadline - timestamp <= the max budget. Anything else present is *ignored* (a warning), and a
  deadline that is not a number decoded as absent. `generate` items are never judged.
- An item is *expired* when deadline + skew tolerance is before the local wall clock.
- Expired items are ACK-dropped (reason `deadline_exceeded`) at intake and at every later stage
  only when `SIE_WORK_DEADLINE_ENFORCE` is on. Off, they run; at `before_ipc` each is counted
  (`sie.worker.work_item.deadline_exceeded`, action `executed`) with a rate-limited warning.
- A held item with a usable deadline holds a *lease*: a 5 s ticker progress-ACKs it when it was not
  progressed for 5 s, so it is progressed about every 10 s at most. The lease ends when the item is
  settled or at its horizon: deadline + skew when enforcing, deadline + skew + max budget when not,
  and never later than the tombstone horizon after it began.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from ..config.groups import DeadlineRules
from ..logs import Throttled
from ..wire._switch import load
from .columns import unsettled

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: The lease ticker's period, and how long a lease goes without a progress ACK (§15.3).
LEASE_TICK_S: Final = 5.0
#: The lease count at which `DeadlineLeases.hold` first sweeps out every settled lease.
PRUNE_AT: Final = 256

#: `(live, expired, usable, ignored, ahead, latest)`, see `deadline_split`.
Split = tuple[list[Any], list[Any], int, int, int, float | None]


_impl = load("deadlines")
#: `Split` at wall-clock `now` (`deliveries`, now, skew_s, max_budget_s); see `_twins.deadlines`.
deadline_split: Callable[[list[Any], float, float, float], Split] = _impl.deadline_split
#: The deliveries whose lease still runs (`deliveries`, now, skew_s, max_budget_s, enforce, cap).
deadline_lease_holders: Callable[[list[Any], float, float, float, bool, float], list[Any]] = (
    _impl.deadline_lease_holders
)


def first_delivery(d: Any) -> bool:
    """Whether a delivery is its message's first (JetStream metadata); unknown counts as first."""
    try:
        return int(d.msg.metadata.num_delivered) <= 1
    except Exception:  # no JetStream metadata (local ingest, a test message)
        return True


def observe_clock(split: Split, rules: DeadlineRules) -> None:
    """§4.1 row 8: rate-limited warnings only (deadlines ignored for their budget, timestamps ahead
    of the local clock, work already expired at its first delivery)."""
    _, expired, _, ignored, ahead, _ = split
    if ignored:
        _warn.warning(
            "work deadline ignored: not within the max budget of its timestamp",
            key="deadline:ignored",
            extra={"items": ignored, "max_budget_s": rules.max_budget_s},
        )
    if ahead:
        _warn.warning(
            "work item timestamp is ahead of the local clock by more than the skew tolerance",
            key="deadline:ahead",
            extra={"items": ahead, "skew_s": rules.skew_s},
        )
    if expired:
        first = sum(1 for d in expired if first_delivery(d))
        if first:
            _warn.warning(
                "work item already past its deadline at its first delivery",
                key="deadline:first",
                extra={"items": first, "enforce": rules.enforce},
            )


@dataclass(slots=True)
class _Lease:
    deliveries: list[Any]
    #: Wall clock when the lease began (its horizon is this plus the tombstone horizon).
    began: float
    #: Monotonic time of its last progress ACK (or of its start).
    progressed: float

    def keep_unsettled(self) -> bool:
        """Keep only the deliveries not yet settled; False when none is left (the lease ends)."""
        live = unsettled(self.deliveries)
        self.deliveries = live
        return bool(live)


class DeadlineLeases:
    """§15.3 leases: the batches held with a usable deadline, progress-ACKed by a 5 s ticker.

    One entry per intake batch (not per item). Settled entries are dropped from the front each time
    one is added and on every tick, so what is kept is what is held (plus whatever was settled
    behind a batch still held, until the next tick)."""

    def __init__(
        self,
        rules: DeadlineRules,
        progress: Callable[[list[Any]], Awaitable[None]],
        *,
        paused: Callable[[], str | None] = lambda: None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = LEASE_TICK_S,
    ) -> None:
        """`progress` progress-ACKs a list of deliveries; `paused` names why leases must not be
        renewed now (draining, a stale backend heartbeat), else None. `tick_s`: the ticker's period
        and the longest a lease goes without progress (5 s; tests shorten it)."""
        self.rules = rules
        self.tick_s = tick_s
        self._progress = progress
        #: Names why leases must not be renewed now (the runtime sets `Readiness.lease_pause_reason`).
        self.paused = paused
        self._wall = wall
        self._clock = clock
        self._held: deque[_Lease] = deque()
        #: When the book reaches this many leases, `hold` drops every settled one (not only those
        #: at the front), so settled deliveries are not kept until the next tick; it then doubles
        #: over what is really held, so the sweep stays amortised O(1) per batch.
        self._prune_at = PRUNE_AT
        self._pause_logged: str | None = None
        #: Progress ACKs sent for leases, and ticks skipped while paused.
        self.progressed = 0
        self.paused_ticks = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, deliveries: list[Any]) -> None:
        """Start a lease for a batch's deliveries (some of which have a usable deadline)."""
        held = self._held
        while held and not held[0].keep_unsettled():
            held.popleft()
        if len(held) >= self._prune_at:
            self._held = held = deque(lease for lease in held if lease.keep_unsettled())
            self._prune_at = max(PRUNE_AT, 2 * len(held))
        held.append(_Lease(deliveries, self._wall(), self._clock()))

    async def tick(self) -> int:
        """Progress-ACK every held delivery whose lease runs and that was not progressed for
        `tick_s`; drop settled entries and those whose leases all ended. Returns how many."""
        reason = self.paused()
        if reason is not None:
            self.paused_ticks += 1
            if reason != self._pause_logged:
                log.warning("deadline leases paused", extra={"reason": reason, "held": len(self._held)})
                self._pause_logged = reason
            return 0
        if self._pause_logged is not None:
            log.info("deadline leases resumed")
            self._pause_logged = None
        now, mono = self._wall(), self._clock()
        rules = self.rules
        kept: deque[_Lease] = deque()
        due: list[Any] = []
        for lease in self._held:
            if mono - lease.progressed < self.tick_s:
                if lease.keep_unsettled():
                    kept.append(lease)
                continue
            holders = deadline_lease_holders(
                lease.deliveries, now, rules.skew_s, rules.max_budget_s, rules.enforce, lease.began + rules.horizon_s
            )
            if holders:
                due.extend(holders)
                lease.deliveries = holders
                lease.progressed = mono
                kept.append(lease)
        self._held = kept
        if due:
            self.progressed += len(due)
            await self._progress(due)
        return len(due)

    async def run(self) -> None:
        """The ticker (a background task until cancelled)."""
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.tick()
            except Exception:  # a failed sweep costs only this tick; settlement is elsewhere
                log.exception("deadline lease sweep failed")

    def start(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.run(), name="deadline-leases")

    @staticmethod
    async def stop(task: asyncio.Task[None] | None) -> None:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = [
    "LEASE_TICK_S",
    "DeadlineLeases",
    "DeadlineRules",
    "deadline_lease_holders",
    "deadline_split",
    "first_delivery",
    "observe_clock",
]
