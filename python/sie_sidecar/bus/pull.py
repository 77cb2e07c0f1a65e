# SPDX-License-Identifier: Apache-2.0
"""One long-lived JetStream pull per consumer, with honest credit accounting.

nats-py's `fetch()` is a request-and-wait round trip per batch and caps near 20k msg/s; keeping pull requests
outstanding on a private inbox is 3-5x faster (shared/design/nats-hot-path.md). nats-py has no such API, so
this module builds it: it publishes `$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>` requests with the inbox as
the reply subject, counts the credit they grant, and reacts to the status messages the server sends there.

Invariant: `unsettled + credit <= max_outstanding`, where `unsettled` counts messages received and not yet
reported through `settled()`, and `credit` counts messages requested on the current inbox and not yet
delivered or expired. Whenever the credit becomes unknowable (a reconnect, a 409/503, silence), the inbox is
rotated: requests made on the old inbox can no longer deliver into the buffer, so forgetting their credit is
safe. Stragglers that still arrive on a retired inbox (or after `stop()`) are NAKed with a delay that outlasts
every pull request still live on the server: NAKed at once, JetStream would hand them straight back to that
same request, and each bounce costs a delivery attempt (20 of them went in 15 ms).

`pause()` stops pulling while the backend cannot serve (the runtime's readiness gate): the credit is given up by
rotating the inbox, no new request goes out, and what is buffered or still arrives goes back with a delay.
`resume()` pulls again. A consumer can start paused, so that nothing is pulled before the first handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import api as js_api

from ..logs import Throttled
from ..telemetry import Registry
from .attempts import AttemptTally
from .direct import DirectQueue as _DirectQueue
from .direct import direct_delivery_supported
from .inbound import FastInbound
from .outbound import FramedWriter

logger = logging.getLogger(__name__)
#: Failures that repeat every back-off (0.5 s) while NATS is unhappy: rate-limited, with a count.
_warn = Throttled(logger)

_PENDING_MSGS = "Nats-Pending-Messages"
_RETIRE_GRACE_S = 1.0
_NAK_MARGIN_S = 0.2  # the server times a pull request from its arrival, a little after we sent it


@dataclass
class PullStats:
    """Counters for telemetry and tests; monotonically increasing."""

    requests: int = 0
    requested_msgs: int = 0
    messages: int = 0
    heartbeats: int = 0
    timeouts: int = 0  # 408: a request expired
    conflicts: int = 0  # 409: consumer deleted, max waiting, max batch, max bytes, ...
    other_status: int = 0  # 503 no responders (no consumer), 400 bad request, anything else
    resets: int = 0  # inbox rotations with the credit forgotten
    watchdog_resets: int = 0
    reconnect_resets: int = 0
    stale_naks: int = 0  # messages NAKed because they arrived on a retired inbox or after stop()
    paused_naks: int = 0  # buffered messages NAKed back when the consumer was paused
    excess: int = 0  # messages beyond the known credit (should stay 0)
    request_errors: int = 0


class PullConsumer:
    """Keeps one long-lived pull open on `stream`/`durable` and hands out batches of `nats.aio.msg.Msg`.

    The caller takes batches with `next_batch()` (or `batches()`), settles every message (ACK, NAK,
    term or a deliberate drop) and reports it with `settled(n)`; capacity returns only then.
    The app's `reconnected_cb` should call `on_reconnected()`; a watchdog also notices reconnects and
    silent request loss on its own.
    """

    def __init__(
        self,
        nc: Client,
        stream: str,
        durable: str,
        *,
        batch: int = 64,
        expires_s: float = 5.0,
        max_outstanding: int = 64,
        heartbeat_s: float | None = None,
        backoff_s: float = 0.5,
        watchdog_s: float | None = None,
        direct: bool = True,
        writer: FramedWriter | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be >= 1")
        if expires_s <= 0:
            raise ValueError("expires_s must be > 0")
        heartbeat = expires_s / 2 if heartbeat_s is None else heartbeat_s
        if not 0 < heartbeat <= expires_s / 2:
            # The server answers 400 "heartbeat value too large" above half the expiry.
            raise ValueError("heartbeat_s must be in (0, expires_s / 2]")
        self._nc = nc
        #: Buffered messages that wake `next_batch`: 1, or while it coalesces, what fills its batch.
        self._wake_at = 1
        #: The connection's framed writer: pull requests go straight to the socket through it while
        #: nothing is queued (no flusher wake-up per request); None: `nc.publish`.
        self._writer = writer
        self.stream = stream
        self.durable = durable
        self._batch = batch
        self._max_outstanding = max_outstanding
        self._request_cap = min(batch, max_outstanding)
        self._low_water = max(1, self._request_cap // 2)
        self._expires_s = expires_s
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._request_extra = {"expires": int(expires_s * 1e9), "idle_heartbeat": int(heartbeat * 1e9)}
        #: The request body after its `batch` (JSON encoded once, not per request: `_request_body`).
        self._request_tail = json.dumps(self._request_extra, separators=(",", ":"))[1:].encode()
        self._backoff_s = backoff_s
        self._watchdog_s = 2 * expires_s if watchdog_s is None else watchdog_s
        self._tick_s = min(1.0, expires_s / 4)
        self._retire_after_s = expires_s + _RETIRE_GRACE_S

        self._buffer: deque[Msg] = deque()
        self._unsettled = 0
        self._credit = 0
        self._high_water = 0
        self._gen = 0
        self._sub: Subscription | None = None
        self._inbox = ""
        self._retired: list[tuple[Subscription, float]] = []
        self._data = asyncio.Event()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._linger: asyncio.Task[None] | None = None  # unsubscribes the inboxes after stop()
        self._requests_expire_at = 0.0  # monotonic time by which every pull request sent has expired
        self._started = False
        self._stopped = False
        self._direct = direct
        self._fast = FastInbound.install(nc) if direct else None
        self._naks: set[asyncio.Task[None]] = set()
        self._last_activity = 0.0
        self._reset_reason: str | None = None
        self._paused_until = 0.0
        self._pause_reason: str | None = None  # set by pause(): no pull requests go out
        self._return_delay_s = 0.0
        self._seen_reconnects = 0
        self._status_streak = 0
        self.stats = PullStats()
        self._telemetry: Registry | None = None
        self._attempts = AttemptTally()

    # -- public API ---------------------------------------------------------------------------------------

    @property
    def telemetry(self) -> Registry | None:
        """Set (metrics on): each received run's delivery attempts are tallied, for `take_attempts` (§13)."""
        return self._telemetry

    @telemetry.setter
    def telemetry(self, registry: Registry | None) -> None:
        self._telemetry = registry
        if self._sub is not None:
            self._tally_in_scan(self._sub._id)

    def _tally_in_scan(self, sid: int) -> None:
        """Have the fast path count the delivery attempts of `sid`'s runs as it scans them (metrics
        on), while the ACK subjects are still in the CPU's caches: one pass over a run, not two."""
        if self._fast is not None:
            counting = self._telemetry is not None and not self._stopped
            self._fast.tally(sid, self._attempts if counting else None)

    def take_attempts(self) -> tuple[list[tuple[int, int]], int]:
        """The delivery attempts tallied since the last call (`_native.delivery_attempts`' pair)."""
        taken: tuple[list[tuple[int, int]], int] = self._attempts.take()
        return taken

    @property
    def unsettled(self) -> int:
        """Messages received and not yet reported through `settled()` (buffered ones included)."""
        return self._unsettled

    @property
    def credit(self) -> int:
        """Messages requested on the current inbox and not yet delivered or expired."""
        return self._credit

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def high_water(self) -> int:
        """The most unsettled messages ever held at once (bounded by max_outstanding)."""
        return self._high_water

    @property
    def max_outstanding(self) -> int:
        return self._max_outstanding

    @property
    def inbox(self) -> str:
        return self._inbox

    @property
    def paused(self) -> str | None:
        """Why the consumer is not pulling (`pause()`), None while it pulls."""
        return self._pause_reason

    def snapshot(self) -> dict[str, Any]:
        """What `/debug/state` shows: the messages held now (a heap census counts ~a dozen Python
        blocks per held message, so live memory is read against this), the credit out, and the bound."""
        return {
            "stream": self.stream,
            "durable": self.durable,
            "unsettled": self._unsettled,
            "buffered": len(self._buffer),
            "credit": self._credit,
            "max_outstanding": self._max_outstanding,
            "high_water": self._high_water,
            "paused": self._pause_reason,
        }

    def requests_live_s(self) -> float:
        """How long pull requests this consumer sent may still deliver (server-side expiry plus a margin).

        A message NAKed with a shorter delay can be handed straight back to one of them."""
        left = self._requests_expire_at - time.monotonic()
        return left + _NAK_MARGIN_S if left > 0 else 0.0

    async def start(self, *, paused: str | None = None) -> None:
        """Subscribe the first inbox and start the task that keeps credit topped up; with `paused` (a
        reason) no pull request goes out until `resume()`."""
        if self._started:
            return
        if self._stopped:
            raise RuntimeError("PullConsumer cannot be restarted after stop()")
        if paused is not None:
            self._pause_reason = paused
        self._seen_reconnects = self._reconnects()
        await self._rotate("start")
        self._started = True
        self._task = asyncio.create_task(self._pump(), name=f"pull:{self.stream}.{self.durable}")

    async def stop(self) -> None:
        """Stop pulling. Messages still buffered (never handed out) are NAKed to come back as soon as
        this consumer's pull requests have expired (seconds, not ack_wait), and the inboxes stay
        subscribed until then so anything the server still delivers to them is NAKed straight back."""
        if self._stopped:
            return
        self._stopped = True
        if self._sub is not None:
            self._tally_in_scan(self._sub._id)  # what still arrives is handed back, not counted
        self._data.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        leftovers = list(self._buffer)
        self._buffer.clear()
        self._unsettled = max(0, self._unsettled - len(leftovers))
        # NAKed at once, the leftovers could be handed straight back to our own still-live pull requests,
        # each bounce costing a delivery attempt; so they come back once those requests have expired.
        delay_s = max(0.0, self._requests_expire_at - time.monotonic())
        for msg in leftovers:
            with contextlib.suppress(NatsError):
                await (msg.nak(delay=delay_s + _NAK_MARGIN_S) if delay_s > 0 else msg.nak())
        # Outstanding pull requests stay live on the server until they expire, and the server may still
        # deliver to them (the NAKed leftovers included). Keep every inbox subscribed until then, so
        # those deliveries are NAKed straight back instead of waiting out ack_wait on a dead inbox.
        lingering = list(self._retired)
        if self._sub is not None:
            lingering.append((self._sub, time.monotonic() + self._retire_after_s))
        self._retired.clear()
        self._sub = None
        self._credit = 0
        if lingering:
            self._linger = asyncio.create_task(self._unsubscribe_when_expired(lingering))
        if leftovers and self._nc.is_connected:
            with contextlib.suppress(NatsError, TimeoutError):
                await self._nc.flush(timeout=1)
        logger.info(
            "pull consumer stopped",
            extra={"stream": self.stream, "consumer": self.durable, "nak_on_stop": len(leftovers)},
        )

    async def next_batch(
        self, max_messages: int, quantum_s: float, stop_early: Callable[[], bool] | None = None
    ) -> list[Msg]:
        """Wait for one message, then coalesce more until `max_messages` or `quantum_s` has passed (§5.1 step 4).

        `stop_early` (checked after the first message and whenever `wake()` is called) ends the
        coalescing at once, e.g. when the backend has gone idle: waiting then only adds latency.
        Returns `[]` once the consumer is stopped. Cancel-safe: messages collected so far go back to the
        front of the buffer. Meant for one caller at a time.
        """
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        while not self._buffer:
            if self._stopped:
                return []
            self._data.clear()
            await self._data.wait()
        batch = self._take(max_messages)
        if len(batch) >= max_messages or quantum_s <= 0 or (stop_early is not None and stop_early()):
            return batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + quantum_s
        try:
            while len(batch) < max_messages and not self._stopped:
                if self._buffer:
                    batch.extend(self._take(max_messages - len(batch)))
                    continue
                if stop_early is not None and stop_early():
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._data.clear()
                # Woken once the batch can be filled, or by `wake()` (stop_early may hold now), or at
                # the deadline: not by every run of deliveries in between.
                self._wake_at = max_messages - len(batch)
                try:
                    async with asyncio.timeout(remaining):
                        await self._data.wait()
                except TimeoutError:
                    batch.extend(self._take(max_messages - len(batch)))  # what arrived meanwhile
                    break
                finally:
                    self._wake_at = 1
        except asyncio.CancelledError:
            self._buffer.extendleft(reversed(batch))
            self._data.set()
            raise
        return batch

    async def batches(self, max_messages: int, quantum_s: float) -> AsyncIterator[list[Msg]]:
        """`next_batch()` in a loop until the consumer stops."""
        while True:
            batch = await self.next_batch(max_messages, quantum_s)
            if not batch:
                return
            yield batch

    def set_max_outstanding(self, max_outstanding: int) -> None:
        """Change the pull-ahead (the derived default follows the backends' batch budgets). Raising
        it tops up at once; lowering it takes effect as held messages settle, since credit already
        granted cannot be taken back."""
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be >= 1")
        if max_outstanding == self._max_outstanding:
            return
        self._max_outstanding = max_outstanding
        self._request_cap = min(self._batch, max_outstanding)
        self._low_water = max(1, self._request_cap // 2)
        self._kick.set()

    def wake(self) -> None:
        """Wake a coalescing `next_batch` so that it re-checks its `stop_early` condition."""
        self._data.set()

    def pause(self, reason: str, *, return_delay_s: float = 0.0) -> None:
        """Stop pulling (the backend cannot serve): no new pull requests; the outstanding ones are
        forgotten by rotating the inbox, so whatever they still deliver, and whatever is buffered and
        not yet handed out, goes back to the stream with a NAK delayed by at least `return_delay_s` and
        past the life of those requests. Messages already handed out are the caller's to settle."""
        if self._stopped:
            return
        was = self._pause_reason
        self._pause_reason = reason
        self._return_delay_s = max(0.0, return_delay_s)
        if was is None:
            self._request_reset(f"paused: {reason}", 0.0)

    def resume(self) -> None:
        """Pull again after `pause()`."""
        if self._pause_reason is None:
            return
        self._pause_reason = None
        self._kick.set()

    def settled(self, n: int) -> None:
        """Report that `n` handed-out messages were ACKed, NAKed, terminated or dropped; frees their capacity."""
        if n < 0:
            raise ValueError("n must be >= 0")
        if n == 0:
            return
        self._unsettled -= n
        if self._unsettled < 0:
            logger.warning(
                "settled more messages than were received",
                extra={"stream": self.stream, "consumer": self.durable, "excess": -self._unsettled},
            )
            self._unsettled = 0
        if not self._top_up_now():
            self._kick.set()

    def on_reconnected(self) -> None:
        """Call from the connection's reconnected callback: pull requests do not survive a reconnect."""
        rc = self._reconnects()
        if rc == self._seen_reconnects:
            return  # the watchdog already handled this reconnect
        self._seen_reconnects = rc
        self._request_reset("reconnected", 0.0)

    # -- inbound (subscription callback; never awaits for an accepted message) ------------------------------

    def _make_direct(self, gen: int) -> Callable[[Msg], None]:
        def on_msg(msg: Msg) -> None:
            try:
                accepted = self._accept(msg, gen)
            except Exception:  # never let a bug here break nats-py's reader loop
                logger.exception("pull delivery failed", extra={"stream": self.stream, "consumer": self.durable})
                accepted = False
            if not accepted:
                self._hand_back([msg])

        return on_msg

    def _hand_back(self, msgs: list[Msg]) -> None:
        """Delivered on a retired inbox or after stop(): hand them back, once our requests are gone."""
        for msg in msgs:
            task = asyncio.ensure_future(self._nak_late(msg))
            self._naks.add(task)
            task.add_done_callback(self._naks.discard)

    def _make_direct_run(self, gen: int, sid: int) -> Callable[[list[Msg]], None]:
        """The fast path's callback: a run of JetStream deliveries (every one has an ACK subject;
        status messages never take this path), accounted for at once. Their delivery attempts were
        counted by the scan when `sid` is tallied there (`_tally_in_scan`)."""
        fast = self._fast

        def on_run(msgs: list[Msg]) -> None:
            try:
                accepted = self._accept_run(msgs, gen, fast is not None and fast.tallied(sid))
            except Exception:  # never let a bug here break nats-py's reader loop
                logger.exception("pull delivery failed", extra={"stream": self.stream, "consumer": self.durable})
                accepted = False
            if not accepted:
                self._hand_back(msgs)

        return on_run

    def _late_delay_s(self) -> float:
        """The NAK delay for a message this consumer will not handle: past the life of every pull
        request it sent (else the server hands the message straight back to one of them), and while
        paused at least the pause's return delay."""
        delay = self.requests_live_s()
        if self._pause_reason is not None:
            delay = max(delay, self._return_delay_s)
        return delay

    async def _nak_late(self, msg: Msg) -> None:
        delay = self._late_delay_s()
        with contextlib.suppress(NatsError):
            await (msg.nak(delay=delay) if delay > 0 else msg.nak())

    def _make_cb(self, gen: int) -> Callable[[Msg], Awaitable[None]]:
        async def on_msg(msg: Msg) -> None:
            if self._accept(msg, gen):
                return
            # Delivered on a retired inbox or after stop(): hand it back, once our requests are gone.
            await self._nak_late(msg)

        return on_msg

    def _accept(self, msg: Msg, gen: int) -> bool:
        if not msg.reply:
            self._on_status(msg, gen)
            return True
        return self._accept_run([msg], gen)

    def _accept_run(self, msgs: list[Msg], gen: int, tallied: bool = False) -> bool:
        """Take a run of deliveries with ACK subjects (one, from `_accept`), counted once; `tallied`:
        their delivery attempts were counted as they were scanned."""
        if gen != self._gen or self._stopped:
            self.stats.stale_naks += len(msgs)
            return False
        n = len(msgs)
        self._last_activity = time.monotonic()
        self._status_streak = 0
        granted = min(n, self._credit)
        self._credit -= granted
        self.stats.excess += n - granted
        self._unsettled += n
        self._high_water = max(self._high_water, self._unsettled)
        self.stats.messages += n
        if self._telemetry is not None and not tallied:
            # Read as the run arrives, while its ACK subjects are still in the CPU's caches (read
            # when a batch was taken, they came from memory); one native call, nothing else.
            self._attempts.add(msgs)
        self._buffer.extend(msgs)
        if len(self._buffer) >= self._wake_at:
            self._data.set()
        if self._credit < self._low_water and not self._top_up_now():
            self._kick.set()
        return True

    def _on_status(self, msg: Msg, gen: int) -> None:
        headers = msg.headers or {}
        status = headers.get(js_api.Header.STATUS, "")
        description = headers.get(js_api.Header.DESCRIPTION, "")
        current = gen == self._gen and not self._stopped
        if status == js_api.StatusCode.CONTROL_MESSAGE:
            self.stats.heartbeats += 1
            if current:
                self._last_activity = time.monotonic()
            return
        if status == js_api.StatusCode.REQUEST_TIMEOUT:
            self.stats.timeouts += 1
            if not current:
                return
            self._last_activity = time.monotonic()
            self._status_streak = 0
            pending = headers.get(_PENDING_MSGS)
            if pending is not None and pending.isdigit():
                self._credit = max(0, self._credit - int(pending))
            else:
                # Unknown remainder: keep the (over-)estimate; the watchdog clears it if it was wrong.
                logger.debug("408 without a pending count", extra={"stream": self.stream, "consumer": self.durable})
            self._kick.set()
            return
        if status == js_api.StatusCode.CONFLICT:
            self.stats.conflicts += 1
        else:
            self.stats.other_status += 1
        if not current:
            return
        self._status_streak += 1
        level = logging.WARNING if self._status_streak == 1 or self._status_streak % 20 == 0 else logging.DEBUG
        logger.log(
            level,
            "pull request rejected; re-issuing after a back-off",
            extra={
                "stream": self.stream,
                "consumer": self.durable,
                "status": status,
                "description": description,
                "streak": self._status_streak,
            },
        )
        self._request_reset(f"status {status} {description}".strip(), self._backoff_s)

    # -- credit maintenance (one task) ------------------------------------------------------------------------

    async def _pump(self) -> None:
        while True:
            try:
                await self._maintain()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _warn.warning(
                    "pull maintenance failed; retrying after a back-off",
                    key=self.durable,
                    extra={"stream": self.stream, "consumer": self.durable, "error": repr(exc)},
                )
                self._paused_until = max(self._paused_until, time.monotonic() + self._backoff_s)
            timeout = self._tick_s
            wait_pause = self._paused_until - time.monotonic()
            if wait_pause > 0:
                timeout = min(timeout, wait_pause)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout, 0.001)):
                    await self._kick.wait()
            self._kick.clear()

    async def _maintain(self) -> None:
        now = time.monotonic()
        connected = self._nc.is_connected
        if connected:
            rc = self._reconnects()
            if rc != self._seen_reconnects:
                self._seen_reconnects = rc
                self._request_reset("reconnect detected", 0.0)
            elif self._credit > 0 and self._reset_reason is None and now - self._last_activity > self._watchdog_s:
                self.stats.watchdog_resets += 1
                logger.warning(
                    "no messages or heartbeats for too long; re-issuing the pull",
                    extra={
                        "stream": self.stream,
                        "consumer": self.durable,
                        "silent_s": round(now - self._last_activity, 3),
                        "credit": self._credit,
                    },
                )
                self._request_reset("watchdog", 0.0)
        reason = self._reset_reason
        if reason is not None and connected:
            self._reset_reason = None
            try:
                await self._rotate(reason)
            except BaseException:
                self._reset_reason = reason
                raise
        if self._pause_reason is not None and self._buffer:
            await self._return_buffered()
        await self._retire_expired(now)
        if (
            connected
            and self._reset_reason is None
            and self._pause_reason is None
            and time.monotonic() >= self._paused_until
        ):
            await self._top_up()

    async def _return_buffered(self) -> None:
        """Paused: NAK what is buffered (never handed out) with the late delay, and free its capacity."""
        leftovers = list(self._buffer)
        self._buffer.clear()
        self._unsettled = max(0, self._unsettled - len(leftovers))
        delay = self._late_delay_s()
        for msg in leftovers:
            with contextlib.suppress(NatsError):
                await (msg.nak(delay=delay) if delay > 0 else msg.nak())
        self.stats.paused_naks += len(leftovers)

    def _request_size(self) -> int:
        """How many messages to request now: 0 while credit is at or above half the request size,
        or the room under the outstanding cap is only a sliver while credit is still live."""
        if self._credit >= self._low_water:
            return 0
        room = self._max_outstanding - self._unsettled - self._credit
        want = min(self._request_cap - self._credit, room)
        if want <= 0 or (self._credit > 0 and want < self._low_water):
            return 0  # no room, or only a sliver while credit is still live: wait for settles
        return want

    def _request_command(self, payload: bytes) -> bytes:
        return b"PUB %s %s %d\r\n%s\r\n" % (self._next_subject.encode(), self._inbox.encode(), len(payload), payload)

    def _top_up_now(self) -> bool:
        """The pump's top-up done at once, from the settle or the delivery that made room, when
        nothing else needs the pump (connected, no reset, pause or back-off pending, the writer's
        direct path free): no task wake-up per batch. False: the pump must run (it is kicked)."""
        writer = self._writer
        if (
            writer is None
            or self._reset_reason is not None
            or self._pause_reason is not None
            or self._sub is None
            or not self._nc.is_connected
            or self._reconnects() != self._seen_reconnects
            or time.monotonic() < self._paused_until
        ):
            return False
        want = self._request_size()
        if want == 0:
            return True  # nothing to request: nothing for the pump either
        payload = self._request_body(want)
        if not writer.write_now(self._request_command(payload), 1, len(payload)):
            return False
        self._grant(want)
        self._requested(want)
        return True

    def _grant(self, want: int) -> None:
        """Count `want` more messages of credit (before the request is sent: nothing asks twice)."""
        if self._credit == 0:
            self._last_activity = time.monotonic()  # the watchdog measures silence from the first request
        self._credit += want

    def _requested(self, want: int) -> None:
        """A request for `want` messages went out."""
        self.stats.requests += 1
        self.stats.requested_msgs += want
        self._requests_expire_at = max(self._requests_expire_at, time.monotonic() + self._expires_s)

    async def _top_up(self) -> None:
        """Re-request when credit falls below half the request size, within the outstanding cap."""
        want = self._request_size()
        if want == 0:
            return
        payload = self._request_body(want)
        self._grant(want)
        try:
            if self._writer is not None and self._writer.framed:
                await self._writer.publish_framed(self._request_command(payload), 1, len(payload))
            else:
                await self._nc.publish(self._next_subject, payload, reply=self._inbox)
        except Exception as exc:
            self._credit = max(0, self._credit - want)
            self.stats.request_errors += 1
            self._paused_until = time.monotonic() + self._backoff_s
            _warn.warning(
                "pull request publish failed",
                key=self.durable,
                extra={"stream": self.stream, "consumer": self.durable, "error": repr(exc)},
            )
            return
        self._requested(want)

    def _request_body(self, want: int) -> bytes:
        """`{"batch": want, "expires": ..., "idle_heartbeat": ...}` as compact JSON, byte for byte
        what `json.dumps` writes (tested), without encoding the constant part each time."""
        return b'{"batch":%d,%s' % (want, self._request_tail)

    async def _rotate(self, reason: str) -> None:
        """Move to a fresh inbox and forget the credit of the old one (see the module docstring)."""
        gen = self._gen + 1
        inbox = self._nc.new_inbox()
        # Bytes are bounded by the credit already; a byte cap would only drop (and delay) deliveries.
        if self._direct:
            sub = await self._nc.subscribe(inbox, pending_bytes_limit=0)
            if direct_delivery_supported(sub):
                # No await between subscribing and this: nothing can have been delivered yet.
                sub._pending_queue = _DirectQueue(sub, self._make_direct(gen))  # type: ignore[assignment]
                if self._fast is not None:
                    self._fast.register(sub._id, self._make_direct_run(gen, sub._id))
            else:
                logger.warning("nats-py internals changed; using callback delivery")
                self._direct = False
                await self._unsubscribe(sub)
                sub = await self._nc.subscribe(inbox, cb=self._make_cb(gen), pending_bytes_limit=0)
        else:
            sub = await self._nc.subscribe(inbox, cb=self._make_cb(gen), pending_bytes_limit=0)
        old, forgotten = self._sub, self._credit
        now = time.monotonic()
        self._gen, self._inbox, self._sub, self._credit = gen, inbox, sub, 0
        # Only the current inbox's runs are counted as scanned: a retired one's are handed back.
        if old is not None and self._fast is not None:
            self._fast.tally(old._id, None)
        self._tally_in_scan(sub._id)
        self._last_activity = now
        if old is not None:
            self._retired.append((old, now + self._retire_after_s))
        if reason.startswith("reconnect"):
            self.stats.reconnect_resets += 1
            # Requests buffered during the outage go out only now; keep old inboxes open for their lifetime.
            self._retired = [(s, max(d, now + self._retire_after_s)) for s, d in self._retired]
        if reason != "start":
            self.stats.resets += 1
            logger.info(
                "pull inbox rotated",
                extra={
                    "stream": self.stream,
                    "consumer": self.durable,
                    "reason": reason,
                    "forgotten_credit": forgotten,
                    "unsettled": self._unsettled,
                },
            )

    async def _unsubscribe_when_expired(self, subs: list[tuple[Subscription, float]]) -> None:
        """After stop(): drop each inbox once the pull requests sent on it have expired."""
        for sub, deadline in sorted(subs, key=lambda entry: entry[1]):
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            await self._unsubscribe(sub)

    async def _retire_expired(self, now: float) -> None:
        if not self._retired:
            return
        keep: list[tuple[Subscription, float]] = []
        for sub, deadline in self._retired:
            if deadline <= now:
                await self._unsubscribe(sub)
            else:
                keep.append((sub, deadline))
        self._retired = keep

    # -- helpers ----------------------------------------------------------------------------------------------

    def _request_reset(self, reason: str, backoff_s: float) -> None:
        if self._reset_reason is None:
            self._reset_reason = reason
        if backoff_s > 0:
            self._paused_until = max(self._paused_until, time.monotonic() + backoff_s)
        self._kick.set()

    def _take(self, n: int) -> list[Msg]:
        buf = self._buffer
        if n >= len(buf):
            taken = list(buf)
            buf.clear()
            return taken
        # `popleft` called n times from C (~20% less than a comprehension, four bytecodes a message; the
        # opcode census in docs/benchmarks.md, issue 32).
        return list(map(deque.popleft, repeat(buf, n)))

    def _reconnects(self) -> int:
        return int(self._nc.stats.get("reconnects", 0))

    async def _unsubscribe(self, sub: Subscription) -> None:
        if self._fast is not None:
            self._fast.unregister(sub._id)
        with contextlib.suppress(NatsError):
            await sub.unsubscribe()
