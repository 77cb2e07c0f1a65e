"""`sie-sidecar probe`: ask a running sidecar's `/healthz` or `/readyz` and exit 0 only on 200;
`sie-sidecar probe backend --socket PATH` asks the model backend itself over its IPC socket.

For container HEALTHCHECKs and exec probes, where the slim image has no curl: the standard library
(and msgpack, for the backend's frames) only, so it starts in well under 100 ms and never imports
the runtime.

The backend probe is the backend container's liveness: a backend whose event loop is stuck answers
no Ping, one whose accelerator check fails answers `ready = false`, and one left draining (its
sidecar went away after a Drain) refuses an empty batch as `draining` and would never serve again;
each of those exits 1, so the kubelet restarts it. A backend still loading its model answers Ping
and passes (loading is the startup probe's business).
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

#: The sidecar's own default probe port (`SIE_WORKER_PROBE_PORT`).
DEFAULT_PROBE_PORT = 9095
PROBE_PATHS = ("healthz", "readyz", "backend")
#: The socket `run` talks to when `SIE_IPC_SOCKET_PATH` is unset (config.py's default).
DEFAULT_SOCKET = "/tmp/sie-ipc.sock"
#: The IPC envelope version (wire-protocol §1.2); kept here so the probe imports no runtime.
_IPC_VERSION = 1
_MAX_ANSWER = 1 << 20


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", choices=PROBE_PATHS, default="healthz", help="which probe (default healthz)")
    parser.add_argument("--host", default="127.0.0.1", help="where the sidecar listens (default 127.0.0.1)")
    parser.add_argument(
        "--probe-port",
        type=int,
        default=None,
        help=f"probe port (default $SIE_WORKER_PROBE_PORT, else {DEFAULT_PROBE_PORT})",
    )
    parser.add_argument(
        "--socket",
        default=None,
        help=f"backend: its IPC socket (default $SIE_IPC_SOCKET_PATH, else {DEFAULT_SOCKET})",
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer (default 2)")


def probe_port(explicit: int | None, environ: Mapping[str, str]) -> int:
    """The port the sidecar in this container serves: the flag, else the same variable `run` reads."""
    if explicit is not None:
        return explicit
    raw = (environ.get("SIE_WORKER_PROBE_PORT") or "").strip()
    return int(raw) if raw.isdecimal() and 0 < int(raw) < 65536 else DEFAULT_PROBE_PORT


def check(host: str, port: int, path: str, timeout_s: float) -> tuple[int, str]:
    """(HTTP status, body) of one GET; status 0 with the error's text when nothing answered."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", f"/{path}")
        response = connection.getresponse()
        return response.status, response.read(4096).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()


def _ask(conn: socket.socket, method: str, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """One request envelope out, its response envelope back (4-byte big-endian length + msgpack)."""
    import msgpack  # only the backend probe needs it

    request = {"version": _IPC_VERSION, "method": method, "request_id": request_id, "body": body}
    frame = msgpack.packb(request, use_bin_type=True)
    conn.sendall(struct.pack(">I", len(frame)) + frame)
    (size,) = struct.unpack(">I", _read_exactly(conn, 4))
    if size > _MAX_ANSWER:
        raise ValueError(f"{method} answer of {size} bytes")
    answer = msgpack.unpackb(_read_exactly(conn, size), raw=False)
    if not isinstance(answer, dict) or answer.get("request_id") != request_id:
        raise ValueError(f"{method} answer is not this request's envelope")
    return answer


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the backend closed the connection")
        data += chunk
    return bytes(data)


def check_backend(socket_path: str, timeout_s: float) -> tuple[bool, str]:
    """(alive, why) for the backend on `socket_path`: it answers Ping within `timeout_s` with
    `ready = true`, and an empty RunBatch is not refused as `draining`."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(socket_path)
            pong = _ask(conn, "Ping", "probe-ping", {"timestamp_ms": time.time() * 1000})
            if not pong.get("ok"):
                return False, f"Ping refused: {pong.get('error')}"
            ping = pong.get("body") or {}
            if not ping.get("ready"):
                return False, "Ping answered ready=false (the backend's health check fails)"
            empty = {"model_id": "", "batch_id": 0, "lora_key": "", "total_cost": 0, "items": []}
            batch = _ask(conn, "RunBatch", "probe-drain", empty)
            if not batch.get("ok") and "draining" in str(batch.get("error")):
                return False, "the backend is draining and will take no more work"
            return True, f"ready; loaded {', '.join(ping.get('loaded_models') or []) or 'nothing yet'}"
    except (OSError, ValueError, struct.error) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # msgpack's decode errors: a garbled answer is a dead backend
        return False, f"{type(exc).__name__}: {exc}"


def backend_socket(explicit: str | None, environ: Mapping[str, str]) -> str:
    """The socket to ask: the flag, else the variable `run` and `backend` read, else the default."""
    return explicit or (environ.get("SIE_IPC_SOCKET_PATH") or "").strip() or DEFAULT_SOCKET


def run_probe(args: argparse.Namespace, out: TextIO | None = None) -> int:
    if args.path == "backend":
        alive, why = check_backend(backend_socket(args.socket, os.environ), args.timeout)
        print(f"backend {'alive' if alive else 'dead'}: {why}", file=out or sys.stdout)
        return 0 if alive else 1
    port = probe_port(args.probe_port, os.environ)
    status, body = check(args.host, port, args.path, args.timeout)
    print(f"{args.path} {status or 'unreachable'}: {body.strip()}", file=out or sys.stdout)
    return 0 if status == 200 else 1


__all__ = [
    "DEFAULT_PROBE_PORT",
    "DEFAULT_SOCKET",
    "PROBE_PATHS",
    "add_probe_arguments",
    "backend_socket",
    "check",
    "check_backend",
    "probe_port",
    "run_probe",
]
