# SPDX-License-Identifier: Apache-2.0
"""Pool admission (sidecar-behaviour §8): whether the gateway lets this worker take its pool's work.

The gateway's `/v1/pools` says which workers each pool has assigned and how many GPUs of each
machine profile it may use. From it come two things: the *physical* decision for the worker's own
pool (the §8 table, row by row) and the *logical* pools (other pools that queue onto this one and
list this worker). The sidecar pulls while either admits it, and each item's `admission_pool` is
checked at intake (§4.1 row 11). Transport-free: `control/gateway.py` polls and records here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import PoolsResponseError

log = logging.getLogger(__name__)

DEFAULT_POOL: Final = "default"

#: Unicode White_Space, the set the upstream (Rust) sidecar trims: `str.strip()` alone would also
#: strip the information separators U+001C-U+001F, which Rust keeps, and the twins must agree.
_WHITE_SPACE: Final = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def pool_key(name: str) -> str:
    """How pool (and worker) names compare (§8): trimmed, lowercase."""
    return name.strip(_WHITE_SPACE).lower()


@dataclass(frozen=True, slots=True)
class PoolDecision:
    """One verdict of the gateway's view: the own pool's physical decision and its reason (the §8
    table's reason words, or `initial`, `status_error:<detail>`), and the logical pools (keys)."""

    admitted: bool
    reason: str
    logical: frozenset[str] = frozenset()

    @property
    def pull_allowed(self) -> bool:
        """§8: pull while physically admitted or assigned to any logical pool."""
        return self.admitted or bool(self.logical)


def decide(body: Any, *, pool: str, worker: str, machine_profile: str) -> PoolDecision:
    """The §8 decision for `pool` (this worker's) from a `/v1/pools` body: `{"pools": [...]}` or a bare
    array. Raises `PoolsResponseError` for a body of neither shape (the caller's error path)."""
    pools = body.get("pools") if isinstance(body, dict) else body
    if not isinstance(pools, list):
        raise PoolsResponseError('expected {"pools": [...]} or an array of pools')
    own, me = pool_key(pool), pool_key(worker)
    physical: PoolDecision | None = None
    logical: set[str] = set()
    for entry in pools:
        spec = entry.get("spec") if isinstance(entry, dict) else None
        name = spec.get("name") if isinstance(spec, dict) else None
        key = pool_key(name) if isinstance(name, str) else ""
        if key == own and physical is None:
            physical = _physical(entry, spec, machine_profile, me)
        elif key and _queue_pool(spec) == own and _lists(entry, me):
            logical.add(key)
    if physical is None:
        physical = PoolDecision(own == DEFAULT_POOL, "pool_missing")
    return PoolDecision(physical.admitted, physical.reason, frozenset(logical))


def _queue_pool(spec: Mapping[str, Any] | None) -> str:
    """The pool whose queue a pool's work goes to: `spec.queue_pool`, else its name, else `default`."""
    if spec is None:
        return DEFAULT_POOL
    for key in ("queue_pool", "name"):
        value = spec.get(key)
        if isinstance(value, str) and pool_key(value):
            return pool_key(value)
    return DEFAULT_POOL


def _assigned(entry: Mapping[str, Any]) -> list[Any] | None:
    status = entry.get("status")
    workers = status.get("assigned_workers") if isinstance(status, dict) else None
    return workers if isinstance(workers, list) else None


def _lists(entry: Mapping[str, Any], me: str) -> bool:
    workers = _assigned(entry) or []
    return any(isinstance(w, dict) and isinstance(w.get("name"), str) and pool_key(w["name"]) == me for w in workers)


def _cap(value: Any) -> int | None:
    """A GPU cap: an integer, or a string of one (§8: string ints allowed); None when malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if digits.isascii() and digits.isdigit():
            return int(text)
    return None


def _physical(entry: Mapping[str, Any], spec: Mapping[str, Any] | None, profile: str, me: str) -> PoolDecision:
    """The §8 table for the own pool, in its order."""
    caps = spec.get("gpu_caps") if spec is not None else None
    if not isinstance(caps, dict) or not caps:
        return PoolDecision(True, "uncapped")
    wanted = profile.lower()
    found = [v for k, v in caps.items() if isinstance(k, str) and k.lower() == wanted]
    if not found:
        return PoolDecision(True, "profile_uncapped")
    cap = _cap(found[0])
    if cap is None:
        return PoolDecision(False, "malformed_gpu_cap")
    if cap <= 0:
        return PoolDecision(False, "cap_exhausted")
    if _assigned(entry) is None:
        return PoolDecision(False, "malformed_assigned_workers")
    if _lists(entry, me):
        return PoolDecision(True, "assigned")
    return PoolDecision(False, "not_assigned")


class Admission:
    """The admission state the pull gate and intake read: the latest decision, kept through gateway
    errors for `stale_after_s` after the last success, then failing closed for a named pool (the
    `default` pool keeps pulling). Starts admitted only for `default`, with no poll made yet."""

    def __init__(
        self,
        pool: str,
        *,
        stale_after_s: float = 30.0,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.own = pool_key(pool)
        self.stale_after_s = stale_after_s
        self.on_change = on_change
        self._clock = clock
        self.decision = PoolDecision(self.own == DEFAULT_POOL, "initial")
        self.polled = False  # the first poll has been answered (or has failed)
        self.last_success: float | None = None
        self.errors = 0

    def record(self, decision: PoolDecision) -> None:
        """A successful poll's decision."""
        self.last_success = self._clock()
        self.errors = 0
        self._set(decision)

    def record_error(self, detail: str) -> None:
        """A failed poll (transport, status, JSON or shape): the last decision holds inside the stale
        window; past it the logical pools are cleared and only `default` stays admitted."""
        self.errors += 1
        last = self.last_success
        if last is not None and self._clock() - last <= self.stale_after_s:
            return  # a success came before, so the first poll is answered: nothing changes
        self._set(PoolDecision(self.own == DEFAULT_POOL, f"status_error:{detail}"))

    def _set(self, decision: PoolDecision) -> None:
        first, self.polled = not self.polled, True
        before, self.decision = self.decision, decision
        if before != decision:
            level = logging.INFO if decision.pull_allowed else logging.WARNING
            log.log(
                level,
                "pool admission: " + ("admitted" if decision.pull_allowed else "not admitted"),
                extra={"pool": self.pool, "reason": decision.reason, "logical_pools": sorted(decision.logical)},
            )
        if (first or before.pull_allowed != decision.pull_allowed) and self.on_change is not None:
            self.on_change()

    def pull_reason(self) -> str | None:
        """Why not to pull now (None: pull). Nothing is pulled before the first poll is answered."""
        if not self.polled:
            return "pool admission pending (the first gateway poll)"
        if self.decision.pull_allowed:
            return None
        return f"pool not admitted ({self.decision.reason})"

    def snapshot(self) -> dict[str, Any]:
        """For `/debug/state`."""
        d, last = self.decision, self.last_success
        return {
            "pool": self.pool,
            "pull_allowed": self.polled and d.pull_allowed,
            "admitted": d.admitted,
            "reason": d.reason if self.polled else "pending",
            "logical_pools": sorted(d.logical),
            "last_success_age_s": None if last is None else round(self._clock() - last, 3),
            "errors": self.errors,
        }

    def item_rule(self) -> tuple[bool, str, frozenset[str]]:
        """What intake checks each item's `admission_pool` against (§4.1 row 11): the physical
        decision, the own pool's key, the logical pools' keys (the native intake takes this tuple)."""
        d = self.decision
        return d.admitted, self.own, d.logical


def item_admitted(admission_pool: str, rule: tuple[bool, str, frozenset[str]]) -> bool:
    """§8 per item: an empty or own-pool `admission_pool` takes the physical decision; any other
    must be one of the logical pools. The twin of the native intake's check."""
    physical, own, logical = rule
    key = pool_key(admission_pool)
    if not key or key == own:
        return physical
    return key in logical


__all__ = ["DEFAULT_POOL", "Admission", "PoolDecision", "decide", "item_admitted", "pool_key"]
