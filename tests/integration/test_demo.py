# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar demo` end to end: every process it starts is gone afterwards, nothing is lost, and a
failed run keeps its logs and says where they are."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _children_named(pattern: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if pattern in line and "ps -eo" not in line]


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sie_sidecar", "demo", "--adapter", "null", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_null_demo_runs_the_whole_pipeline_and_cleans_up() -> None:
    before = len(_children_named("sie-demo-"))
    run = _demo("--items", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "OK (" in out and "missing      0 never answered" in out and "late         0 answered" in out
    assert "answered     300 of 300: 300 successes, 0 errors" in out
    assert re.search(r"answered at [\d,]+ and [\d,]+ items/s: the capacity is taken as [\d,]+ items/s", out)
    acked = re.search(r"acked ([\d,]+) of the ([\d,]+) items sent in all phases", out)
    assert acked is not None and acked.group(1) == acked.group(2), out  # warm-up and first items included
    assert "backend batches" in out and "Logs kept" not in run.stderr
    assert len(_children_named("sie-demo-")) == before  # nats-server, backend and sidecar all stopped


def test_a_failed_demo_keeps_its_logs_and_says_where() -> None:
    """A sidecar that cannot start (duplicate socket paths are a start-up error) stops the demo at
    once, not after the load generator's waits, and its log is kept for the user to read."""
    before = len(_children_named("sie-demo-"))
    run = _demo(env={"SIE_IPC_SOCKET_PATHS": "/tmp/x.sock,/tmp/x.sock"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED: the sidecar process exited with code 2" in run.stderr
    kept = re.search(r"Logs kept in (\S+): sidecar.log, backend.log, nats.log", run.stderr)
    assert kept is not None, run.stderr
    workdir = Path(kept.group(1))
    try:
        assert "duplicate socket path" in (workdir / "sidecar.log").read_text()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert len(_children_named("sie-demo-")) == before


@pytest.mark.slow
def test_the_generate_demo_streams_an_answer_token_by_token() -> None:
    before = len(_children_named("sie-demo-gen-"))
    run = subprocess.run(
        [sys.executable, "-m", "sie_sidecar", "demo", "--generate"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "tokens come from the MiniLM tokenizer's vocabulary" in out
    assert "stream       25 chunks (seq 0..24, one attempt), finish_reason 'length'" in out
    answer = next(line for line in out.splitlines() if line.startswith("  answer"))
    assert len(answer.split()) > 24  # "answer" and the 24 streamed tokens
    assert "All processes stopped. OK" in out
    assert len(_children_named("sie-demo-gen-")) == before
