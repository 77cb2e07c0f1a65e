# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run` refuses bad configuration at start-up: one line, exit code 2, no secrets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BASE = {
    "SIE_NATS_URL": "nats://127.0.0.1:1",
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "l4",
}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    return subprocess.run(
        [sys.executable, "-m", "sie_sidecar", "run", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({**BASE, "SIE_POOL": "foo.bar"}, "SIE_POOL"),
        ({**BASE, "SIE_BUNDLE": "   "}, "SIE_BUNDLE"),
        ({k: v for k, v in BASE.items() if k != "SIE_NATS_URL"}, "SIE_NATS_URL"),
        ({**BASE, "SIE_SIDECAR_INGEST": "carrier-pigeon"}, "SIE_SIDECAR_INGEST"),
        ({**BASE, "SIE_IPC_SOCKET_PATHS": "/a.sock,/b.sock,/a.sock"}, "SIE_IPC_SOCKET_PATHS"),
        ({**BASE, "SIE_WORKER_LIVENESS_BUDGET_S": "900"}, "SIE_WORKER_LIVENESS_BUDGET_S"),
        ({**BASE, "SIE_MAX_ACK_PENDING": "99999999999999999999"}, "SIE_MAX_ACK_PENDING: 99999999999999999999 is out"),
    ],
)
def test_invalid_configuration_exits_2_with_one_line(env: dict[str, str], needle: str) -> None:
    result = run({**env, "SIE_GATEWAY_API_KEY": "s3cret-key"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sie-sidecar: ") and needle in lines[0]
    assert "s3cret-key" not in result.stderr + result.stdout


def test_help_shows_no_secret_values() -> None:
    result = run({**BASE, "SIE_GATEWAY_API_KEY": "s3cret-key", "SIE_ADMIN_TOKEN": "t0ken"}, "--help")
    assert result.returncode == 0
    assert "--nats-url" in result.stdout and "--gateway-url" in result.stdout
    assert "--gateway-api-key" not in result.stdout  # secrets come from the environment only (issue 32)
    assert "--config-service-url" in result.stdout and "--sidecar-ingest" in result.stdout
    assert "s3cret-key" not in result.stdout and "t0ken" not in result.stdout


def test_replay_subcommand_replays_the_test_trace() -> None:
    """`sie-sidecar replay` is the §4.7 harness: same lines as the golden file of the test trace."""
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "sie_sidecar", "replay", str(data / "controller_trace.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    expected = (data / "controller_trace.expected.jsonl").read_text().split()
    assert proc.stdout.split() == expected
