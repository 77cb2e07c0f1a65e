# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar demo` end to end: every process it starts is gone afterwards, nothing is lost."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _children_named(pattern: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if pattern in line and "ps -eo" not in line]


@pytest.mark.slow
def test_null_demo_runs_the_whole_pipeline_and_cleans_up() -> None:
    before = len(_children_named("sie-demo-"))
    run = subprocess.run(
        [sys.executable, "-m", "sie_sidecar", "demo", "--adapter", "null", "--items", "300"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "lost 0" in run.stdout and "OK" in run.stdout
    assert "backend batches" in run.stdout and "acked 300" in run.stdout
    assert len(_children_named("sie-demo-")) == before  # nats-server, backend and sidecar all stopped
