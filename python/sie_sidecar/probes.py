# SPDX-License-Identifier: Apache-2.0
"""The `/healthz` and `/readyz` HTTP probes (sidecar-behaviour §10) on the probe port, and (our
extension, `SIE_SIDECAR_DEBUG_ENDPOINT`) `GET /debug/state`: what the worker knows per model, as
JSON, so an SRE debugging a pod needs no debugger; its `telemetry` key is the in-process registry's
snapshot, what `sie-sidecar top` computes its rates from.

The state is on by default so that `top` works as installed, and is answered only to loopback peers
(127.0.0.0/8, ::1, ::ffff:127.x): the probe port listens on every interface for the kubelet, and
the document names models, consumers and the NATS server, which is nothing to hand to the whole
cluster network. `SIE_SIDECAR_DEBUG_ENDPOINT=all` serves any peer, `off` none (404); a refused peer
gets a 403 whose one line names the setting.

A small HTTP/1.1 server of its own rather than `aiohttp.web`: importing aiohttp and its web module
costs 143-160 ms of start-up (measured, docs/benchmarks.md "Libraries"), before the first probe
could answer; three GET paths need no framework.

A minimal HTTP/1.1 responder on asyncio streams rather than aiohttp.web: importing aiohttp cost the
sidecar ~0.15 s CPU before its first reply, and three fixed plain-text answers need no framework. One
request per connection (`Connection: close`), the request head bounded in size and time, any request
body ignored; a malformed request gets `400 bad request`, never an exception out of the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from .pipeline.readiness import Readiness
from .telemetry import Point, Registry

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192  # request line + headers; a kubelet probe sends ~150
HEAD_TIMEOUT_S = 5.0  # for the whole request head to arrive
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64  # served at once; more are closed on accept
_TOKEN_CHARS = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    503: "Service Unavailable",
}
DEBUG_PATH: Final = "/debug/state"
#: The 403 body: one line, naming the setting that opens the state to other peers.
LOOPBACK_ONLY: Final = "forbidden: /debug/state answers loopback peers only (SIE_SIDECAR_DEBUG_ENDPOINT=all: any peer)"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # percent-decoded, without the query


@dataclass(frozen=True, slots=True)
class BadRequest:
    """Why a request head is not an HTTP/1.x request this server can answer (a 400, not an exception)."""

    reason: str


def parse_request_head(head: bytes) -> Request | BadRequest:
    """The method and path of an HTTP/1.x request head (request line, header lines, the blank line),
    or why it is malformed (RFC 9112 §3: request-line = method SP request-target SP HTTP-version)."""
    if len(head) > MAX_HEAD_BYTES:
        return BadRequest("request head too large")
    lines = head.split(b"\r\n")
    if len(lines) < 3 or lines[-2:] != [b"", b""]:
        return BadRequest("request head does not end with an empty line")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return BadRequest("request line is not 'method target version'")
    method, target, version = parts
    if not method or not _TOKEN_CHARS.issuperset(method):
        return BadRequest("method is not a token")
    if version not in (b"HTTP/1.0", b"HTTP/1.1"):
        return BadRequest("not HTTP/1.0 or HTTP/1.1")
    if not target or any(c <= 0x20 or c >= 0x7F for c in target):
        return BadRequest("request target is empty or not printable ASCII")
    for line in lines[1:-2]:
        name, colon, _ = line.partition(b":")
        if not colon or not name or not _TOKEN_CHARS.issuperset(name):
            return BadRequest("malformed header line")
    return Request(method.decode("ascii"), _path_of(target.decode("ascii")))


def _path_of(target: str) -> str:
    """The decoded path of an origin-form (`/p?q`) or absolute-form (`http://h/p?q`) target; "" for
    other forms (`*`, authority-form), which match no probe."""
    if not target.startswith("/") and "://" in target:
        rest = target.partition("://")[2]
        target = "/" + rest.partition("/")[2] if "/" in rest else "/"
    if not target.startswith("/"):
        return ""
    path = target.partition("?")[0].partition("#")[0]
    return unquote(path, errors="replace")


#: What `/debug/state` serves: a JSON-able snapshot, taken when the request arrives.
DebugState = Callable[[], dict[str, Any]]
JSON: Final = "application/json"
TEXT: Final = "text/plain; charset=utf-8"


def point_json(point: Point) -> dict[str, Any]:
    """One registry point as JSON: attributes as an object (a stage passes them as pairs)."""
    return {
        "name": point.name,
        "kind": point.kind,
        "attrs": dict(point.attrs),
        "value": point.value,
        "count": point.count,
        "buckets": list(point.buckets),
        "bounds": list(point.bounds),
    }


def telemetry_json(registry: Registry) -> list[dict[str, Any]]:
    """The registry's snapshot as JSON (`/debug/state`'s `telemetry`): raw cumulative points, so a
    reader diffs two reads for rates and quantiles instead of the sidecar keeping windows."""
    return [point_json(p) for p in registry.snapshot()]


def is_loopback_peer(host: object) -> bool:
    """Whether a peer address (the host of `getpeername()`) is this machine's loopback: 127.0.0.0/8,
    ::1, or an IPv4-mapped 127.x on a dual-stack socket. Anything unparseable is not."""
    if not isinstance(host, str):
        return False
    try:
        address = ipaddress.ip_address(host.partition("%")[0])  # an IPv6 scope id is no part of it
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def answer(
    readiness: Readiness, request: Request, debug_state: DebugState | None = None, *, debug_allowed: bool = True
) -> tuple[int, str, str]:
    """(status, body, content type) for a request: GET or HEAD of a probe or, when `debug_state` is
    given, of `/debug/state` (403 when `debug_allowed` is false: the peer is not one it answers);
    `404 not found` for anything else."""
    if request.method in ("GET", "HEAD"):
        if request.path == "/healthz":
            return 200, "ok", TEXT
        if request.path == "/readyz":
            reason = readiness.reason()
            return (200, "ok", TEXT) if reason is None else (503, f"not ready: {reason}", TEXT)
        if request.path == DEBUG_PATH and debug_state is not None:
            if not debug_allowed:
                return 403, LOOPBACK_ONLY, TEXT
            state = {
                "ready": readiness.reason() is None,
                "not_ready_reason": readiness.reason(),
                "pulling": readiness.pull_reason() is None,
                "not_pulling_reason": readiness.pull_reason(),
                "backend_draining": readiness.backend_draining,
                **debug_state(),
            }
            return 200, json.dumps(state, sort_keys=True, default=str), JSON
    return 404, "not found", TEXT


def render_response(status: int, body: str, *, head_only: bool = False, content_type: str = TEXT) -> bytes:
    payload = body.encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if head_only else head + payload


class ProbeServer:
    """The listening probe server; `cleanup` stops it and drops any connection still being served."""

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness
        #: Serves `/debug/state` once set (the runtime sets it when the dispatcher exists, if enabled).
        self.debug_state: DebugState | None = None
        #: Whether `/debug/state` answers loopback peers only (`SIE_SIDECAR_DEBUG_ENDPOINT=loopback`).
        self.debug_loopback_only = True
        self._server: asyncio.Server | None = None
        self._open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    def serve_debug(self, state: DebugState, telemetry: Registry, *, loopback_only: bool = True) -> None:
        """Serve `/debug/state`: the version, `state()` and the registry's points under `telemetry`
        (one call for both ingest modes of the runtime, so both show the same document); to loopback
        peers only unless `loopback_only` is false."""
        from . import __version__  # read once here, not per request (importlib.metadata)

        version = __version__
        self.debug_loopback_only = loopback_only
        self.debug_state = lambda: {"version": version, **state(), "telemetry": telemetry_json(telemetry)}

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, host, port, limit=MAX_HEAD_BYTES)

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def cleanup(self) -> None:
        if self._server is not None:
            self._server.close()
        # Aborting the sockets ends each handler through its own error path: a cancelled one would
        # be logged by asyncio's stream callback as an error.
        for writer in self._open.values():
            writer.transport.abort()
        await asyncio.gather(*self._open, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or len(self._open) >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self._open[task] = writer
        try:
            await self._serve(reader, writer)
        except Exception as exc:  # a probe connection never takes the process down
            log.debug("probe connection failed", extra={"error": repr(exc)})
        finally:
            del self._open[task]
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            response = render_response(408, "request timeout")
        except asyncio.LimitOverrunError:
            response = render_response(400, "bad request: request head too large")
        except asyncio.IncompleteReadError:
            return  # the client went away before a whole request
        else:
            request = parse_request_head(head)
            if isinstance(request, BadRequest):
                response = render_response(400, f"bad request: {request.reason}")
            else:
                allowed = (
                    request.path != DEBUG_PATH or not self.debug_loopback_only or is_loopback_peer(_peer_host(writer))
                )
                status, body, content_type = answer(self._readiness, request, self.debug_state, debug_allowed=allowed)
                response = render_response(status, body, head_only=request.method == "HEAD", content_type=content_type)
        writer.write(response)
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()


def _peer_host(writer: asyncio.StreamWriter) -> object:
    """The peer's address (None when the transport has none, as a closed one)."""
    peer = writer.get_extra_info("peername")
    return peer[0] if isinstance(peer, tuple) and peer else None


async def start_probes(readiness: Readiness, port: int, host: str = "0.0.0.0") -> ProbeServer | None:
    """Serve `/healthz` and `/readyz`; a bind failure is logged and the process keeps running."""
    server = ProbeServer(readiness)
    try:
        await server.start(host, port)
    except OSError as exc:
        log.error("probe server could not bind", extra={"port": port, "error": repr(exc)})
        return None
    return server


__all__ = [
    "BadRequest",
    "ProbeServer",
    "Request",
    "answer",
    "is_loopback_peer",
    "parse_request_head",
    "point_json",
    "render_response",
    "start_probes",
    "telemetry_json",
]
