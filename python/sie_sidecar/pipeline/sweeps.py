# SPDX-License-Identifier: Apache-2.0
"""The checkpoints every stage runs over the deliveries it holds (§4.2, §15.3): cancelled items and
(enforcing) expired ones are ACK-dropped, work run past its deadline is counted, deadline leases are
held, and what waits is progress-ACKed. One object because intake, readiness, parking, preparation
and execution each sweep at their own checkpoints, with the same rules and the same leases."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from ..telemetry import WORK_ITEM_DEADLINE_EXCEEDED, Registry
from .deadlines import DeadlineLeases, DeadlineRules, deadline_split, observe_clock
from .delivery import Delivery, Settler
from .intake import Intake, Verdicts
from .stages import warn


class Sweeper:
    """ACK-drops, deadline counts, leases and progress ACKs for the dispatcher's stages."""

    def __init__(
        self, rules: DeadlineRules, nak_delay_ms: int, settler: Settler, intake: Intake, telemetry: Registry
    ) -> None:
        self._rules = rules
        self._nak_delay_ms = nak_delay_ms
        self._settler = settler
        self._intake = intake
        self._telemetry = telemetry
        #: §15.3 deadline leases: held batches with a usable deadline, progress-ACKed every ~10 s.
        self.leases = DeadlineLeases(rules, self.keepalive)
        self._leases_task: asyncio.Task[None] | None = None

    async def intake(self, found: Verdicts) -> dict[str, list[Delivery]]:
        """The intake checkpoint of a pulled batch: its NAKs and drops settled, and its model groups
        past the deadline check (§4.1 rows 8, 10, 13); returns the groups with live items."""
        groups, naks = found.groups, found.naks
        if naks and self._rules.enforce:  # §4.1 row 10 comes before row 11 (pool admission)
            naks, _ = await self.drop_expired(naks)
        for d in naks:  # those with an item were decoded and refused by pool admission (row 11)
            await self._settler.nak(d, self._nak_delay_ms, "retry" if d.item is None else "pool_not_assigned")
        for d in found.drops:
            await self._settler.drop(d)
        for model in list(groups):
            live, _ = await self.drop_expired(groups[model], at_intake=True)
            if live:
                groups[model] = live
            else:
                del groups[model]
        return groups

    async def drop_expired(
        self, ds: list[Delivery], *, at_intake: bool = False, before_ipc: bool = False
    ) -> tuple[list[Delivery], float | None]:
        """§15.3 at one stage, for a whole batch in one native call: with enforcement on, items past
        their deadline are ACK-dropped (`deadline_exceeded`, action `dropped`). Off, they run, and
        at `before_ipc` they are counted (action `executed`). At intake the clock is observed (row 8)
        and the batch's deadline leases begin (row 13). Returns the live items and the latest
        usable deadline among them (the RunBatch wait's input)."""
        rules = self._rules
        if not rules.judge or not (at_intake or before_ipc or rules.enforce):
            return ds, None
        split = deadline_split(ds, time.time(), rules.skew_s, rules.max_budget_s)
        live, expired, usable, ignored, ahead, latest = split
        if at_intake:
            if expired or ignored or ahead:
                observe_clock(split, rules)
            if usable or (expired and not rules.enforce):
                self._hold_leases(ds if not rules.enforce else live)
        if not expired:
            return ds, latest
        if rules.enforce:
            self._count_expired(expired, "dropped")
            for d in expired:
                await self._settler.drop(d, "deadline_exceeded")
            return live, latest
        if before_ipc:
            self._count_expired(expired, "executed")
            warn.warning(
                "work past its deadline executed (SIE_WORK_DEADLINE_ENFORCE is off)",
                key="deadline:executed",
                extra={"items": len(expired)},
            )
        return ds, latest

    def _count_expired(self, expired: list[Delivery], action: str) -> None:
        """`sie.worker.work_item.deadline_exceeded` by operation (one add per operation present)."""
        by_op = Counter(d.item.operation if d.item is not None else "other" for d in expired)
        for op, n in by_op.items():
            self._telemetry.add(WORK_ITEM_DEADLINE_EXCEEDED, n, (("operation", op), ("action", action)))

    def _hold_leases(self, ds: list[Delivery]) -> None:
        self.leases.hold(ds)
        if self._leases_task is None or self._leases_task.done():
            self._leases_task = self.leases.start()

    async def stop_leases(self) -> None:
        """Shutdown: the lease ticker stops (what is still held is flushed or NAKed by the caller)."""
        await DeadlineLeases.stop(self._leases_task)
        self._leases_task = None

    async def drop_cancelled(self, ds: list[Delivery]) -> list[Delivery]:
        """Cancelled items ACK-dropped at a §4.2 stage, and (enforcing) those past their deadline."""
        if self._rules.enforce and self._rules.judge:
            ds, _ = await self.drop_expired(ds)
        return await self.drop_tombstoned(ds)

    async def drop_tombstoned(self, ds: list[Delivery]) -> list[Delivery]:
        if not self._intake.any_tombstones():
            return ds
        live = []
        cancelled = self._intake.cancelled
        for d in ds:
            if cancelled(d):
                await self._settler.drop(d)
            else:
                live.append(d)
        return live

    async def keepalive(self, ds: list[Delivery]) -> None:
        """Progress-ACK deliveries a scheduler has held for half the ack_wait (law 3)."""
        progress = self._settler.progress
        for d in ds:
            if not d.settled:
                await progress(d)
