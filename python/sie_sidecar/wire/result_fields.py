# SPDX-License-Identifier: Apache-2.0
"""Two WorkResult fields derived from the WorkItem (sidecar-behaviour §6.1), in one place for the
per-item path (`results.py`) and both batch framers (the native one mirrors these rules).

Imports nothing at run time, so the wire twin can use it without an import cycle."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .workitem import WorkItem


def executed_hash(item: WorkItem, current_hash: str | None) -> str | None:
    """The item's hash when it is non-empty and equals the worker's current hash at publish time."""
    if item.bundle_config_hash and current_hash is not None and item.bundle_config_hash == current_hash:
        return item.bundle_config_hash
    return None


def queue_ms(item: WorkItem, now: float | None = None) -> float:
    """Wall time from the gateway's publish to now, in ms (≥ 0; 0 without a timestamp)."""
    if item.timestamp <= 0:
        return 0.0
    return max(0.0, ((time.time() if now is None else now) - item.timestamp) * 1000.0)


__all__ = ["executed_hash", "queue_ms"]
