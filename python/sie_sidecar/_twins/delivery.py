# SPDX-License-Identifier: Apache-2.0
"""Twin of `_native.finish_deliveries` (`pipeline.delivery.Settler`): mark a batch of deliveries
settled, once each, and count the capacity each source gets back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMPLEMENTATION = "py"


def finish_deliveries(deliveries: Sequence[Any]) -> tuple[list[Any], list[Any], list[tuple[Any, int]]]:
    """`(done, twice, releases)`: the deliveries settled now (each marked `settled`), in order; those
    already settled; and one `(release, count)` per run of consecutive deliveries of one source (its
    `release`, not None), for the ones settled now."""
    done: list[Any] = []
    twice: list[Any] = []
    releases: list[tuple[Any, int]] = []
    release = None
    count = 0
    for d in deliveries:
        if d.settled:
            twice.append(d)
            continue
        d.settled = True
        done.append(d)
        if d.release is not release and d.release != release:  # equal bound methods: one source
            if release is not None and count:
                releases.append((release, count))
            release, count = d.release, 0
        count += 1
    if release is not None and count:
        releases.append((release, count))
    return done, twice, releases


__all__ = ["IMPLEMENTATION", "finish_deliveries"]
