# SPDX-License-Identifier: Apache-2.0
"""Consumer lag for `/debug/state` (`sie-sidecar top`): JetStream's own `num_pending` of the
consumers this worker pulls from (the pool durable and the worker-direct consumer), read lazily.

Nobody reading the state means no JetStream call: a read of the document finds the cached values,
and when they are older than `max_age_s` (and no refresh is running) it starts one refresh in the
background and answers with what it has, with each value's age. So the request never waits on the
broker, a disconnected server costs the reader nothing but a stale age, and `top` reading once a
second costs one CONSUMER.INFO per consumer every `max_age_s` at most. The worker's documented
permissions already allow `$JS.API.CONSUMER.INFO.*.*` (bus/permissions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nats.js import JetStreamContext

#: How old a cached value may be before a read starts a refresh.
MAX_AGE_S: Final = 2.0
#: One CONSUMER.INFO's deadline: a refresh never hangs on a server that stopped answering.
INFO_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Watched:
    """One consumer: the key it is shown under (`pool`, `worker`), its stream and its name."""

    key: str
    stream: str
    consumer: str


@dataclass(frozen=True, slots=True)
class _Reading:
    at: float  # clock() when the answer came
    num_pending: int
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int


class ConsumerLag:
    """The cached lag of `consumers`; `read()` serves it and refreshes it in the background when stale."""

    def __init__(
        self,
        js: JetStreamContext,
        consumers: Sequence[Watched],
        *,
        max_age_s: float = MAX_AGE_S,
        timeout_s: float = INFO_TIMEOUT_S,
        describe: Callable[[BaseException], str] = lambda exc: f"{type(exc).__name__}: {exc}",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._js = js
        self._consumers = tuple(consumers)
        self._max_age_s = max_age_s
        self._timeout_s = timeout_s
        self._describe = describe
        self._clock = clock
        self._readings: dict[str, _Reading] = {}
        self._errors: dict[str, str] = {}
        self._tried_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Refreshes started (each one CONSUMER.INFO per consumer): tests see the laziness here.
        self.refreshes = 0

    def read(self) -> dict[str, Any]:
        """The lag as `/debug/state` shows it under `lag`: per consumer `num_pending` (and the un-ACKed,
        redelivered and waiting-pull counts) with `age_s`, or nulls before the first answer; `error`
        when its last refresh failed. Starts a refresh when the last one is older than `max_age_s`.
        Call on the event loop."""
        now = self._clock()
        if (
            not self._closed
            and self._task is None
            and (self._tried_at is None or now - self._tried_at >= self._max_age_s)
        ):
            self._tried_at = now
            self.refreshes += 1
            self._task = asyncio.get_running_loop().create_task(self._refresh(), name="consumer-lag")
        out: dict[str, Any] = {}
        for c in self._consumers:
            r = self._readings.get(c.key)
            out[c.key] = {
                "stream": c.stream,
                "consumer": c.consumer,
                "num_pending": None if r is None else r.num_pending,
                "num_ack_pending": None if r is None else r.num_ack_pending,
                "num_redelivered": None if r is None else r.num_redelivered,
                "num_waiting": None if r is None else r.num_waiting,
                "age_s": None if r is None else round(now - r.at, 3),
                "error": self._errors.get(c.key),
            }
        return {"consumers": out, "refreshing": self._task is not None, "max_age_s": self._max_age_s}

    async def _refresh(self) -> None:
        try:
            for c in self._consumers:
                try:
                    info = await self._js.consumer_info(c.stream, c.consumer, timeout=self._timeout_s)
                except Exception as exc:  # shown with the old value and its age; the next read retries
                    self._errors[c.key] = self._describe(exc)
                    continue
                self._readings[c.key] = _Reading(
                    self._clock(),
                    int(info.num_pending or 0),
                    int(info.num_ack_pending or 0),
                    int(info.num_redelivered or 0),
                    int(info.num_waiting or 0),
                )
                self._errors.pop(c.key, None)
        finally:
            self._task = None

    async def close(self) -> None:
        """Stop: no refresh starts after this, and one in flight is cancelled."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["INFO_TIMEOUT_S", "MAX_AGE_S", "ConsumerLag", "Watched"]
