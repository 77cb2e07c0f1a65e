# SPDX-License-Identifier: Apache-2.0
"""`benches/profilers/sched_window_diff.py`: a window is the difference of its two snapshots, the
busy thread is the serving one, the others add up, a thread born inside the window is left out,
and the reference's CPU is summed over its processes."""

from __future__ import annotations

from pathlib import Path

from benches.profilers.sched_window_diff import describe, read_window

SNAPSHOTS = """\
start sidecar 100 1000 50 7000 10 2000 1500
start sidecar 101 10 1 1300 5 500 200
start sidecar 102 8 0 1200 3 300 100
start reference 7 400 40 90 0 0 0
start reference 8 600 60 80 0 0 0
end sidecar 100 1140 62 7200 40 4800 3300
end sidecar 101 10 2 1300 6 530 215
end sidecar 102 9 0 1201 3 310 104
end sidecar 103 5 0 10 0 7 1
end reference 7 560 50 90 0 0 0
end reference 8 800 70 80 0 0 0
"""


def test_a_window_is_the_difference_of_its_snapshots(tmp_path: Path) -> None:
    path = tmp_path / "window"
    path.write_text(SNAPSHOTS)
    window = read_window(str(path))
    assert window.serving == {
        "utime": 140,
        "stime": 12,
        "minflt": 200,
        "migrations": 30,
        "switches": 2800,
        "involuntary": 1800,
    }
    assert window.others == {"utime": 1, "stime": 1, "minflt": 1, "migrations": 1, "switches": 40, "involuntary": 19}
    assert window.reference_ticks == (160 + 10) + (200 + 10)
    line = describe("w", window)
    assert "152 ticks (12 system)" in line and "against the reference 0.400" in line


def test_a_window_without_a_busy_thread_says_so(tmp_path: Path) -> None:
    path = tmp_path / "idle"
    path.write_text("start sidecar 1 0 0 0 0 0 0\nend sidecar 1 5 0 0 0 0 0\n")
    assert describe("idle", read_window(str(path))) == "idle: no serving thread in the window"
