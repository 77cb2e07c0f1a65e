# SPDX-License-Identifier: Apache-2.0
"""Twins of the native work-deadline functions (`pipeline.deadlines`, sidecar-behaviour §15.3):
`_native.deadline_split` and `deadline_lease_holders`, one Python loop over a batch each (the path with
`SIE_SIDECAR_NO_EXTENSIONS=1`, and the oracle of the parity tests), and `work_item_ages`, which the twin of
`run_batch_columns` records. The rules are stated in `pipeline.deadlines`."""

from __future__ import annotations

import math
from typing import Any

IMPLEMENTATION = "py"


def _fields(d: Any) -> tuple[bool, float, float] | None:
    item = d.item
    if item is None:
        return None
    deadline = item.deadline
    return item.operation == "generate", float(item.timestamp), math.nan if deadline is None else float(deadline)


def _usable(timestamp: float, deadline: float, max_budget_s: float) -> bool:
    return (
        math.isfinite(deadline) and deadline > 0.0 and timestamp > 0.0 and 0.0 <= deadline - timestamp <= max_budget_s
    )


def deadline_split(
    deliveries: list[Any], now: float, skew_s: float, max_budget_s: float
) -> tuple[list[Any], list[Any], int, int, int, float | None]:
    """`(live, expired, usable, ignored, ahead, latest)` at wall-clock `now`: `expired` are the non-generate
    deliveries whose usable deadline + `skew_s` is before `now`, `live` the others in order
    (`deliveries` itself when none expired); `usable` counts the live ones with a usable deadline,
    `ignored` those whose deadline is present but not usable, `ahead` those with a usable deadline
    whose timestamp is more than `skew_s` ahead of `now`; `latest` is the latest usable deadline of
    the live ones (None without one)."""
    live: list[Any] = []
    latest: float | None = None
    expired: list[Any] = []
    usable = ignored = ahead = 0
    for d in deliveries:
        found = _fields(d)
        if found is None or found[0] or math.isnan(found[2]):
            live.append(d)
            continue
        _, timestamp, deadline = found
        if not _usable(timestamp, deadline, max_budget_s):
            ignored += 1
            live.append(d)
            continue
        if timestamp > now + skew_s:
            ahead += 1
        if deadline + skew_s < now:
            expired.append(d)
        else:
            usable += 1
            latest = deadline if latest is None else max(latest, deadline)
            live.append(d)
    return (live if expired else deliveries), expired, usable, ignored, ahead, latest


def deadline_lease_holders(  # noqa: PLR0917  # the native function's signature
    deliveries: list[Any], now: float, skew_s: float, max_budget_s: float, enforce: bool, cap: float
) -> list[Any]:
    """The unsettled non-generate deliveries whose lease still runs at `now`: until deadline +
    `skew_s` (enforcing) or deadline + `skew_s` + `max_budget_s` (not), never past `cap`."""
    out = []
    for d in deliveries:
        if d.settled:
            continue
        found = _fields(d)
        if found is None or found[0] or not _usable(found[1], found[2], max_budget_s):
            continue
        end = found[2] + skew_s + (0.0 if enforce else max_budget_s)
        if now < min(end, cap):
            out.append(d)
    return out


def work_item_ages(deliveries: list[Any], now: float) -> list[float]:
    """Seconds from each item's timestamp to `now` (never negative), skipping timestamps <= 0 (§5.6)."""
    ages = []
    for d in deliveries:
        found = _fields(d)
        if found is not None and found[1] > 0.0:
            ages.append(max(0.0, now - found[1]))
    return ages


__all__ = ["IMPLEMENTATION", "deadline_lease_holders", "deadline_split", "work_item_ages"]
