# SPDX-License-Identifier: Apache-2.0
"""The NATS connection of `sie-sidecar run` (sidecar-behaviour §2.1): one login (user/password, a
token, a creds file or an NKey seed file; newer than v0.7.1 but user/password), TLS with the system
trust store or `SIE_NATS_TLS_CA_FILE` and an optional client certificate, a first connection bounded
by `SIE_NATS_CONNECT_TIMEOUT_S`, and one-line, redacted, rate-limited logs for what the client
reports afterwards. config.py has already checked every file; nats-py reads the creds and the seed
itself, each time it signs the server's nonce, so no secret of theirs is held here.

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
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.errors import AuthorizationError
from nats.errors import Error as NatsError

from ..config import ConfigError, Settings, nats_tls_context, redact_url_userinfo
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


def tls_context(servers: list[str], settings: Settings | None = None) -> ssl.SSLContext | None:
    """A verifying client context for `tls://` and `wss://` URLs, or for any URL when a client
    certificate or a CA file is set (a server that requires TLS upgrades a `nats://` connection).
    Without `SIE_NATS_TLS_CA_FILE` it trusts the system store and honours `SSL_CERT_FILE` /
    `SSL_CERT_DIR`; with it, that CA alone."""
    cert = key = ca = None
    if settings is not None:
        cert, key, ca = settings.nats_tls_cert_file, settings.nats_tls_key_file, settings.nats_tls_ca_file
    secure = any(server.lower().startswith(("tls://", "wss://")) for server in servers)
    if not secure and cert is None and ca is None:
        return None
    return nats_tls_context(cert, key, ca)


def login_kind(settings: Settings) -> str:
    """The login in use, for the connected line (never a secret): `user`, `token`, `creds`, `nkey` or
    `none`, with `+client-cert` when a client certificate is presented."""
    kind = next(iter(login_options(settings)), "none")
    name = {"user": "user", "token": "token", "user_credentials": "creds", "nkeys_seed": "nkey"}.get(kind, "none")
    return name + ("+client-cert" if settings.nats_tls_cert_file is not None else "")


def login_options(settings: Settings) -> dict[str, object]:
    """nats-py's options for the one login set (config.py refuses two): user/password, a token, a
    creds file (`user_credentials`) or an NKey seed file (`nkeys_seed`); empty for none."""
    if settings.nats_user is not None and settings.nats_password is not None:
        return {"user": settings.nats_user, "password": settings.nats_password}
    if settings.nats_token is not None:
        return {"token": settings.nats_token}
    if settings.nats_creds_file is not None:
        return {"user_credentials": settings.nats_creds_file}
    if settings.nats_nkey_seed_file is not None:
        return {"nkeys_seed": settings.nats_nkey_seed_file}
    return {}


def _refused(exc: BaseException) -> bool:
    """True for failures a retry cannot fix: bad credentials, an untrusted or mismatched certificate."""
    if isinstance(exc, AuthorizationError | ssl.SSLError | ssl.CertificateError):
        return True
    return isinstance(exc, NatsError) and any(word in str(exc).lower() for word in _REFUSALS)


class NatsEvents:
    """The client's callbacks: the first connection's refusals, then rate-limited one-line logs.

    `on_reconnected` hooks run after every reconnect (pull consumers re-issue their credit there).
    `snapshot()` is what `/debug/state` shows under `nats`.
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
        self.reconnects = 0  # since start: which pods keep losing their server is an operator's question
        self.disconnected_at: float | None = None  # time.monotonic() of the last disconnect, until reconnected
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
            self.disconnected_at = time.monotonic()
            log.warning("NATS disconnected; reconnecting")

    async def reconnected(self) -> None:
        log.info("NATS reconnected; re-issuing pull credit", extra={"failures": self.failures, "server": self.server()})
        self.reconnects += 1
        self.failures = 0
        self.disconnected_at = None
        for hook in list(self.on_reconnected):
            hook()

    def snapshot(self) -> dict[str, Any]:
        """The connection as `/debug/state` shows it: the server (redacted), whether it is up (and
        for how long it has been down), reconnects since start, failures since the last good
        connection and the last error (redacted, kept after a reconnect)."""
        down = self.disconnected_at
        return {
            "server": self.server(),
            "connected": self.connected and down is None and not self.closing,
            "disconnected_s": None if down is None else round(time.monotonic() - down, 3),
            "reconnects": self.reconnects,
            "failures": self.failures,
            "last_error": self.last_error,
        }


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
    options = login_options(settings)
    try:
        tls = tls_context(settings.nats_servers, settings)
    except ConfigError as refused:  # checked at start-up; a file changed or vanished since
        raise ConnectError(f"cannot connect to NATS at {where}: {refused}") from None
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
    server = redact_url_userinfo(url.geturl()) if url is not None else where
    log.info("NATS connected", extra={"server": server, "login": login_kind(settings)})


async def close(nc: NatsClient, events: NatsEvents) -> None:
    """Flush (bounded) and close; safe on a client that never connected."""
    events.closing = True
    if nc.is_connected:
        with contextlib.suppress(Exception):
            await nc.flush(timeout=CLOSE_FLUSH_S)
    with contextlib.suppress(Exception):
        await nc.close()


__all__ = [
    "NATS_FAILURES",
    "ConnectError",
    "NatsClient",
    "NatsEvents",
    "close",
    "connect",
    "login_kind",
    "login_options",
    "tls_context",
]
