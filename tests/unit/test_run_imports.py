# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run` starts without what it does not use (issue 10: CPU before the first reply): no
aiohttp (nats-py's WebSocket transport, ~0.15 s of imports) unless a server is `ws://`/`wss://`, and
a probe server that needs no HTTP framework. A later import that pulls them back in fails here."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sie_sidecar import cli

#: Imported by `run` for a nats:// sidecar, none of these may be.
NOT_FOR_RUN = ("aiohttp", "multidict", "yarl", "aiohttp.web")

PROBE = """
import json, sys
from sie_sidecar import cli
run = cli.load_run(sys.argv[1:])
loaded = sorted(m for m in {names} if m in sys.modules)
import nats.aio.transport as transport
websocket_ready = transport.aiohttp is not None
import aiohttp  # still importable afterwards: only nats was kept from it
print(json.dumps({{"run": run.__module__, "loaded": loaded, "websocket_ready": websocket_ready,
                  "aiohttp_later": aiohttp.ClientSession.__name__}}))
"""


def probe(*servers: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).resolve().parents[1])}
    code = PROBE.format(names=repr(NOT_FOR_RUN))
    proc = subprocess.run(
        [sys.executable, "-c", code, *servers], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_run_imports_the_app_without_aiohttp() -> None:
    assert probe("nats://127.0.0.1:4222", "tls://other:4222") == {
        "run": "sie_sidecar.runtime.lifecycle",
        "loaded": [],
        "websocket_ready": False,
        "aiohttp_later": "ClientSession",
    }


@pytest.mark.parametrize("server", ["ws://127.0.0.1:8080", "WSS://gw:443"])
def test_a_websocket_server_keeps_nats_websocket_transport(server: str) -> None:
    result = probe("nats://127.0.0.1:4222", server)
    assert result["websocket_ready"] is True


def test_the_probe_server_needs_no_http_framework() -> None:
    code = f"import sys, sie_sidecar.probes; print([m for m in {NOT_FOR_RUN!r} if m in sys.modules])"
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_run_leaves_the_garbage_collector_on_when_it_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The collector is off only while `run` imports; every way out of `_run` turns it back on."""
    for key in [k for k in os.environ if k.startswith("SIE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SIE_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("SIE_POOL", "foo.bar")  # refused: exit 2 before anything starts
    assert gc.isenabled()
    assert cli.main(["run"]) == 2
    assert gc.isenabled()
    assert "SIE_POOL" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert gc.isenabled()
