# SPDX-License-Identifier: Apache-2.0
"""A known amount of extra sidecar work, to calibrate what the e2e CPU-per-item figure does with it.

Put this directory on the sidecar's PYTHONPATH and set `PAD_LOOPS`: each pulled batch then runs a
pure-Python loop of `PAD_LOOPS` iterations per 64 messages after it is pulled (300 iterations are
~120,000 instructions under callgrind, +2.6% of the sidecar's work at 64-item batches). An ABBA of
0 against N shows how much the shared machine magnifies a change of that size:

    python benches/env_ab.py --items 100000 --rounds 6 --warm-fraction 0.5 \\
        --sidecar-env PYTHONPATH=benches/profilers/padding --b PAD_LOOPS=300
"""

from __future__ import annotations

import os
from typing import Any

_LOOPS = int(os.environ.get("PAD_LOOPS", "0") or 0)

if _LOOPS:
    from sie_sidecar.bus import pull

    _next_batch = pull.PullConsumer.next_batch

    async def _padded(self: pull.PullConsumer, *args: Any, **kwargs: Any) -> list[Any]:
        batch = await _next_batch(self, *args, **kwargs)
        total = 0
        for i in range(_LOOPS * len(batch) // 64):
            total += i
        return batch

    pull.PullConsumer.next_batch = _padded  # type: ignore[method-assign]
