"""`sie-sidecar probe`, the container HEALTHCHECK: exit 0 only when the probe answers 200."""

from __future__ import annotations

import asyncio
import io
import socket
import time

import pytest

from sie_sidecar.cli import build_parser, main
from sie_sidecar.config import Settings
from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.probes import ProbeServer
from sie_sidecar.tools.probe import DEFAULT_PROBE_PORT, probe_port, run_probe

REQUIRED = {"SIE_NATS_URL": "nats://127.0.0.1:4222", "SIE_POOL": "p", "SIE_BUNDLE": "b", "SIE_MACHINE_PROFILE": "m"}


async def probe(port: int, *path: str) -> tuple[int, str]:
    out = io.StringIO()
    args = build_parser("probe").parse_args(["probe", *path, "--probe-port", str(port)])
    code = await asyncio.to_thread(run_probe, args, out)
    return code, out.getvalue()


async def test_healthz_passes_while_the_process_serves(server: ProbeServer) -> None:
    assert await probe(server.port) == (0, "healthz 200: ok\n")


async def test_readyz_follows_the_backend_heartbeat(server: ProbeServer, readiness: Readiness) -> None:
    assert await probe(server.port, "readyz") == (1, "readyz 503: not ready: handshake pending\n")
    readiness.last_ping_ok = time.monotonic()
    assert await probe(server.port, "readyz") == (0, "readyz 200: ok\n")
    readiness.draining = True
    assert await probe(server.port, "readyz") == (1, "readyz 503: not ready: draining\n")


async def test_nothing_listening_fails_with_the_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connect is refused
        code, text = await probe(port)
    assert code == 1
    assert text.startswith("healthz unreachable: ConnectionRefusedError")


def test_main_dispatches_probe(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert main(["probe", "readyz", "--probe-port", str(s.getsockname()[1]), "--timeout", "1"]) == 1
    assert capsys.readouterr().out.startswith("readyz unreachable:")


def test_port_defaults_to_the_setting_run_reads() -> None:
    assert Settings.from_sources(REQUIRED).worker_probe_port == DEFAULT_PROBE_PORT
    assert probe_port(None, {}) == DEFAULT_PROBE_PORT
    assert probe_port(None, {"SIE_WORKER_PROBE_PORT": "9200"}) == 9200
    assert probe_port(None, {"SIE_WORKER_PROBE_PORT": "not-a-port"}) == DEFAULT_PROBE_PORT
    assert probe_port(9300, {"SIE_WORKER_PROBE_PORT": "9200"}) == 9300
