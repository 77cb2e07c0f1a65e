# SPDX-License-Identifier: Apache-2.0
"""The NATS connection of `sie-sidecar run` (sidecar-behaviour §2.1): user/password auth, TLS with the
standard trust store, a first connection bounded by `SIE_NATS_CONNECT_TIMEOUT_S`, and one-line,
redacted, rate-limited logs for what the client reports afterwards.

nats-py, left to itself, retries the first connection forever (with `max_reconnect_attempts=-1`) and
logs each failure with a traceback; a wrong password or an untrusted certificate then looks like an
outage. Here the first connection ends at its deadline or at the first refusal that retrying cannot
fix (credentials, TLS), as `ConnectError`; only after it succeeded do reconnects go on forever.
Client PINGs every `SIE_NATS_PING_INTERVAL_S` leave a server that stopped answering (frozen, not
closed) within seconds rather than nats-py's four minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.errors import AuthorizationError
from nats.errors import Error as NatsError

from ..config import Settings, redact_url_userinfo
from ..errors import ConnectError
from ..logs import should_log

#: Replies to the worker's own requests (JetStream API, pull deliveries, confirmed ACKs, syncs) come
#: to `_INBOX_WORKER.>`, so the worker user needs no subscribe permission on the gateways' `_INBOX.>`
#: (sidecar-behaviour §2.1, §2.6; newer than v0.7.1).
WORKER_INBOX_PREFIX = "_INBOX_WORKER"

log = logging.getLogger(__name__)

RECONNECT_WAIT_S = 0.5
CLOSE_FLUSH_S = 2
# Server refusals that no retry can fix (the server's -ERR text, lower-cased).
_REFUSALS = ("authorization violation", "authentication")


#: What a NATS call can fail with at start-up (the lifecycle catches these without importing nats).
NATS_FAILURES: tuple[type[BaseException], ...] = (NatsError, TimeoutError, OSError)


def tls_context(servers: list[str]) -> ssl.SSLContext | None:
    """A verifying client context for `tls://` URLs; `ssl.create_default_context` trusts the system store
    and honours `SSL_CERT_FILE` / `SSL_CERT_DIR`, so a private CA needs no setting of ours."""
    if any(server.lower().startswith("tls://") for server in servers):
        return ssl.create_default_context()
    return None


def _refused(exc: BaseException) -> bool:
    """True for failures a retry cannot fix: bad credentials, an untrusted or mismatched certificate."""
    if isinstance(exc, AuthorizationError | ssl.SSLError | ssl.CertificateError):
        return True
    return isinstance(exc, NatsError) and any(word in str(exc).lower() for word in _REFUSALS)


class NatsEvents:
    """The client's callbacks: the first connection's refusals, then rate-limited one-line logs.

    `on_reconnected` hooks run after every reconnect (pull consumers re-issue their credit there).
    """

    def __init__(self, redact: Callable[[str], str]) -> None:
        self._redact = redact
        self.on_reconnected: list[Callable[[], None]] = []
        #: The server now connected to (set by `connect`), named in the reconnect line: which node a
        #: sidecar moved to is what an operator asks after a node fault.
        self.server: Callable[[], str | None] = lambda: None
        self.connected = False  # the first connection succeeded
        self.closing = False
        self.failures = 0  # since the last good connection
        self.last_error: str | None = None
        self._refusal: asyncio.Future[str] | None = None

    def describe(self, exc: BaseException) -> str:
        """One redacted line: the type and the message (nats-py's messages may carry the URL)."""
        name = type(exc).__name__
        text = str(exc).strip() or "no detail"
        return self._redact(" ".join((text if name in text else f"{name}: {text}").split()))

    def refusal(self) -> asyncio.Future[str]:
        """Resolves with the reason when the server or TLS refuses the first connection."""
        if self._refusal is None:
            self._refusal = asyncio.get_running_loop().create_future()
        return self._refusal

    async def error(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = self.describe(exc)
        if not self.connected and _refused(exc):
            refusal = self.refusal()
            if not refusal.done():
                refusal.set_result(self.last_error)
            return
        if should_log(self.failures):
            log.warning(
                "NATS connection error" if self.connected else "NATS connection attempt failed",
                extra={"failures": self.failures, "error": self.last_error},
            )

    async def disconnected(self) -> None:
        if self.connected and not self.closing:
            log.warning("NATS disconnected; reconnecting")

    async def reconnected(self) -> None:
        log.info("NATS reconnected; re-issuing pull credit", extra={"failures": self.failures, "server": self.server()})
        self.failures = 0
        for hook in list(self.on_reconnected):
            hook()


async def connect(nc: NatsClient, settings: Settings, events: NatsEvents) -> None:
    """Connect `nc` within `settings.nats_connect_timeout_s`, or raise `ConnectError` (exit code 1).

    Cancel-safe: the attempt in progress is cancelled with the caller; `close(nc, events)` then
    releases whatever it had opened.
    """
    deadline_s = settings.nats_connect_timeout_s
    where = redact_url_userinfo(",".join(settings.nats_servers))
    if settings.nats_url_userinfo_ignored:
        log.warning(
            "SIE_NATS_URL carries user:password@, which is not used to authenticate; "
            "set SIE_NATS_USER and SIE_NATS_PASSWORD",
            extra={"url": where},
        )
    options: dict[str, object] = {}
    if settings.nats_user is not None and settings.nats_password is not None:
        options.update(user=settings.nats_user, password=settings.nats_password)
    tls = tls_context(settings.nats_servers)
    if tls is not None:
        options["tls"] = tls
    attempt = asyncio.ensure_future(
        nc.connect(
            servers=settings.nats_servers,
            error_cb=events.error,
            disconnected_cb=events.disconnected,
            reconnected_cb=events.reconnected,
            max_reconnect_attempts=-1,
            reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]  # nats-py types seconds as int
            ping_interval=settings.nats_ping_interval_s,  # type: ignore[arg-type]  # likewise
            max_outstanding_pings=settings.nats_max_outstanding_pings,
            name=f"sie-sidecar {settings.worker_id}",
            inbox_prefix=WORKER_INBOX_PREFIX,
            **options,  # type: ignore[arg-type]
        )
    )
    events.server = lambda: redact_url_userinfo(nc.connected_url.geturl()) if nc.connected_url is not None else None
    refusal = events.refusal()
    waiters: set[asyncio.Future[Any]] = {attempt, refusal}
    try:
        await asyncio.wait(waiters, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not attempt.done():
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await attempt
    if refusal.done():
        raise ConnectError(f"NATS at {where} refused the connection: {refusal.result()}")
    if attempt.cancelled():
        n = events.failures
        detail = f"; last error: {events.last_error}" if events.last_error else ""
        raise ConnectError(
            f"no connection to NATS at {where} within {deadline_s:g} s ({n} failed attempt{'s' * (n != 1)}{detail})"
        )
    exc = attempt.exception()
    if exc is not None:
        raise ConnectError(f"cannot connect to NATS at {where}: {events.describe(exc)}")
    events.connected = True
    events.failures = 0
    url = nc.connected_url
    log.info("NATS connected", extra={"server": redact_url_userinfo(url.geturl()) if url is not None else where})


async def close(nc: NatsClient, events: NatsEvents) -> None:
    """Flush (bounded) and close; safe on a client that never connected."""
    events.closing = True
    if nc.is_connected:
        with contextlib.suppress(Exception):
            await nc.flush(timeout=CLOSE_FLUSH_S)
    with contextlib.suppress(Exception):
        await nc.close()


__all__ = ["NATS_FAILURES", "ConnectError", "NatsClient", "NatsEvents", "close", "connect", "tls_context"]
