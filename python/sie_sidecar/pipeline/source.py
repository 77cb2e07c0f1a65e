# SPDX-License-Identifier: Apache-2.0
"""What feeds the pipeline: a `Source` of delivery batches, each delivery with its own settle handle.

NATS JetStream (`bus.pull.PullConsumer`) is the source today; the local-ingest socket of a later issue
is a second one. The pipeline sees only these two protocols, so it runs unchanged on either, and in
tests on an in-memory source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class SettleHandle(Protocol):
    """One delivery: its subject, its bytes, and the three ways to settle it (sidecar-behaviour §4).

    `reply` is the handle's own address for a batched ACK (a JetStream ack subject); a source that
    has none settles through the methods alone.
    """

    subject: str
    data: bytes
    reply: str

    async def ack(self) -> None: ...
    async def nak(self, delay: int | float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


class Source(Protocol):
    """Hands out batches of deliveries and takes capacity back as they are settled."""

    async def next_batch(
        self, max_messages: int, quantum_s: float, stop_early: Callable[[], bool] | None = None
    ) -> Sequence[SettleHandle]:
        """Wait for at least one delivery, coalesce up to `max_messages` within `quantum_s` (or until
        `stop_early()`), and return them; an empty batch means the source stopped."""
        ...

    def settled(self, n: int) -> None:
        """`n` handed-out deliveries were settled: their capacity comes back."""

    def wake(self) -> None:
        """Re-check `stop_early` of a coalescing `next_batch` now."""


__all__ = ["SettleHandle", "Source"]
