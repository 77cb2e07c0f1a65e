# SPDX-License-Identifier: Apache-2.0
"""`benches/profilers/opcodes_sidecar.py`: the bytecodes a batch are the slope between two runs'
counts (so start-up, run once in each, falls out), and the diff orders functions by what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benches.profilers.opcodes_sidecar import diff, per_batch


def _write(prefix: Path, n: int, counts: dict[str, int]) -> None:
    Path(f"{prefix}.{n}.json").write_text(json.dumps(counts))


def test_start_up_falls_out_and_a_batch_is_the_slope(tmp_path: Path) -> None:
    prefix = tmp_path / "op.off"
    # start-up: 5,000 bytecodes in both runs; the hot function: 10 a item; one only in the larger run
    _write(prefix, 3000, {"startup": 5000, "hot": 30_000})
    _write(prefix, 9000, {"startup": 5000, "hot": 90_000, "late": 600})
    got = per_batch(str(prefix), (3000, 9000), 64)
    assert got == pytest.approx({"startup": 0.0, "hot": 640.0, "late": 6.4})


def test_the_diff_lists_the_largest_change_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    off, on = tmp_path / "off", tmp_path / "on"
    for n, scale in ((3000, 1), (9000, 3)):
        _write(off, n, {"a": 1000 * scale, "b": 2000 * scale})
        _write(on, n, {"a": 1000 * scale, "b": 2000 * scale, "telemetry": 300 * scale})
    diff(str(off), str(on), (3000, 9000), 60, top=5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "bytecodes a 60-item batch: 60 -> 66 (+6)"
    assert lines[1].split()[-1] == "telemetry" and lines[1].split()[0] == "+6.0"
