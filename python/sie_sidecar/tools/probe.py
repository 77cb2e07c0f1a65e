"""`sie-sidecar probe`: ask a running sidecar's `/healthz` or `/readyz` and exit 0 only on 200.

For container HEALTHCHECKs and exec probes, where the slim image has no curl: it uses the standard
library only, so it starts in about 60 ms and never imports the runtime.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
from collections.abc import Mapping
from typing import TextIO

#: The sidecar's own default probe port (`SIE_WORKER_PROBE_PORT`).
DEFAULT_PROBE_PORT = 9095
PROBE_PATHS = ("healthz", "readyz")


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", choices=PROBE_PATHS, default="healthz", help="which probe (default healthz)")
    parser.add_argument("--host", default="127.0.0.1", help="where the sidecar listens (default 127.0.0.1)")
    parser.add_argument(
        "--probe-port",
        type=int,
        default=None,
        help=f"probe port (default $SIE_WORKER_PROBE_PORT, else {DEFAULT_PROBE_PORT})",
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


def run_probe(args: argparse.Namespace, out: TextIO | None = None) -> int:
    port = probe_port(args.probe_port, os.environ)
    status, body = check(args.host, port, args.path, args.timeout)
    print(f"{args.path} {status or 'unreachable'}: {body.strip()}", file=out or sys.stdout)
    return 0 if status == 200 else 1


__all__ = ["DEFAULT_PROBE_PORT", "PROBE_PATHS", "add_probe_arguments", "check", "probe_port", "run_probe"]
