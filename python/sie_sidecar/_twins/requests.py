# SPDX-License-Identifier: Apache-2.0
"""Twin of `_native.item_traceparents` (`ipc.requests`): what a sampled batch's span links to.

The native RunBatch writer's twin is its spec, `ipc.requests.run_batch_body_py`: it shares the per-op
item builders with the Process*Batch bodies, which the runtime writes with or without the extension."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMPLEMENTATION = "py"


def item_traceparents(items: Sequence[Any]) -> list[str | None]:
    """Each item's own `traceparent` (None unless a string); the native one also reads an undecoded
    `LazyDelivery` in place."""
    return [tp if isinstance(tp := item.traceparent, str) else None for item in items]


__all__ = ["IMPLEMENTATION", "item_traceparents"]
