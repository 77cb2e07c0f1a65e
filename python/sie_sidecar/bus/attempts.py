# SPDX-License-Identifier: Apache-2.0
"""What the deliveries say about redelivery (sidecar-behaviour §13): `sie.worker.nats.delivery.attempts`
by `redelivered`, and `sie.worker.nats.operations{operation=receive}` with reason `first_delivery`,
`redelivery` or `metadata_unavailable`. A pull consumer counts each run of deliveries as it arrives
(`AttemptTally`, in the native core: the ACK subjects are still in the CPU's caches then), and the
counts go into the registry when it is exported (`observe_pulls`): nothing is recorded per batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..telemetry import NATS_DELIVERY_ATTEMPTS, NATS_OPERATIONS, Counter, Histogram, Registry
from ..wire._switch import load

if TYPE_CHECKING:
    from .pull import PullConsumer

#: A consumer's tally of delivery attempts (`_native.AttemptTally`, or its twin).
AttemptTally: Any = load("attempts").AttemptTally
#: Attempts 1 to 20 (the default max_deliver) each get a bucket, then doubling.
ATTEMPT_BOUNDS: Final = (*(float(n) for n in range(1, 21)), 40.0, 80.0, 160.0)
_FIRST: Final = (("redelivered", "false"),)
_AGAIN: Final = (("redelivered", "true"),)
_RECEIVED: Final = {
    reason: (("operation", "receive"), ("outcome", "success"), ("reason", reason))
    for reason in ("first_delivery", "redelivery", "metadata_unavailable")
}


class _ReceiveInstruments:
    """The receive instruments of one registry, each looked up once, when first recorded into (an
    instrument exists from its first record on, as before: no empty series are exported). Five
    registry lookups per pulled batch were a third of its recording."""

    __slots__ = ("_attempts", "_received", "registry")

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._attempts: dict[bool, Histogram] = {}
        self._received: dict[str, Counter] = {}

    def attempts(self, again: bool) -> Histogram:
        found = self._attempts.get(again)
        if found is None:
            attrs = _AGAIN if again else _FIRST
            found = self._attempts[again] = self.registry.histogram(NATS_DELIVERY_ATTEMPTS, attrs, ATTEMPT_BOUNDS)
        return found

    def received(self, reason: str) -> Counter:
        found = self._received.get(reason)
        if found is None:
            found = self._received[reason] = self.registry.counter(NATS_OPERATIONS, _RECEIVED[reason])
        return found


_instruments: _ReceiveInstruments | None = None


def record_counts(registry: Registry, counts: Sequence[tuple[int, int]], unknown: int) -> None:
    """`delivery_attempts`' pair (or a tally's) into the registry."""
    global _instruments  # noqa: PLW0603  one process-wide cache, replaced when the registry changes
    found = _instruments
    if found is None or found.registry is not registry:
        found = _instruments = _ReceiveInstruments(registry)
    first = again = 0
    for attempt, n in counts:
        if attempt <= 1:
            first += n
        else:
            again += n
        found.attempts(attempt > 1).record_n(float(attempt), n)
    for reason, n in (("first_delivery", first), ("redelivery", again), ("metadata_unavailable", unknown)):
        if n:
            found.received(reason).add(n)


def observe_pulls(registry: Registry, consumers: Sequence[PullConsumer]) -> None:
    """`nats.operations{operation=fetch}`: the pull requests the consumers sent (and those that
    failed to send); `{operation=stream, reason=stream_ended}`: pulls the server ended with a status
    other than a plain expiry (409 and the like), after which the pull is rebuilt (§5.1 step 3).
    Exported from the consumers' own counts instead of recorded twice. And the delivery attempts
    and receive counts each consumer tallied since the last export (`record_counts`)."""
    sent = (("operation", "fetch"), ("outcome", "success"), ("reason", "none"))
    failed = (("operation", "fetch"), ("outcome", "error"), ("reason", "transport"))
    ended = (("operation", "stream"), ("outcome", "error"), ("reason", "stream_ended"))

    def observe(registry: Registry) -> None:
        for consumer in consumers:
            counts, unknown = consumer.take_attempts()
            if counts or unknown:
                record_counts(registry, counts, unknown)
        registry.counter(NATS_OPERATIONS, sent).catch_up(sum(c.stats.requests for c in consumers))
        registry.counter(NATS_OPERATIONS, failed).catch_up(sum(c.stats.request_errors for c in consumers))
        registry.counter(NATS_OPERATIONS, ended).catch_up(
            sum(c.stats.conflicts + c.stats.other_status for c in consumers)
        )

    registry.observe(observe)


__all__ = ["ATTEMPT_BOUNDS", "AttemptTally", "observe_pulls", "record_counts"]
