# SPDX-License-Identifier: Apache-2.0
"""What the dispatcher reads across a whole batch of deliveries, in one native call per batch (issue 30):
the config gate's hashes, the RunBatch writer's columns, the lane's request latencies, the unsettled. No Python loop
over a batch's items runs on the common path; `_twins.columns` holds the twins (the path with
`SIE_SIDECAR_NO_EXTENSIONS=1`, and the oracle of the parity tests), chosen by `wire._switch`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..wire._switch import load

Columns = tuple[list[Any], list[float] | None, list[Any] | None, list[Any] | None]

_impl = load("columns")
config_hashes: Callable[[Iterable[Any]], list[Any]] = _impl.config_hashes
#: `(deliveries, op, ages, contexts)`: with `ages` (a work-item age histogram) each item's age is
#: recorded too; with `contexts` (a list) the items' distinct trace contexts are appended to it.
run_batch_columns: Callable[[list[Any], str, Any | None, list[str] | None], Columns] = _impl.run_batch_columns
request_latencies_ms: Callable[[list[str], Sequence[float], Iterable[Any], float], list[float]] = (
    _impl.request_latencies_ms
)
unsettled: Callable[[list[Any]], list[Any]] = _impl.unsettled

__all__ = ["Columns", "config_hashes", "request_latencies_ms", "run_batch_columns", "unsettled"]
