# SPDX-License-Identifier: Apache-2.0
"""What the kernel counted in each `sched_window.sh` window: the sidecar's serving thread (the one that
used the CPU), its other threads together, and the reference (nats-server + backend) CPU.

    python benches/profilers/sched_window_diff.py /tmp/sched.off.* /tmp/sched.on.*

Per window: the serving thread's CPU ticks, minor faults, migrations and switches (all and
involuntary), its CPU against the reference's (the machine's speed cancels out, as in the ABBA
benches), and the other threads' CPU and switches.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

COUNTERS = ("utime", "stime", "minflt", "migrations", "switches", "involuntary")
BUSY_TICKS = 20  # a thread with more CPU than this in the window is the serving one


@dataclass
class Window:
    serving: dict[str, int] = field(default_factory=dict)
    others: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    reference_ticks: int = 0


def read_window(path: str) -> Window:
    """The counters' differences between the window's start and end snapshots of `path`."""
    start: dict[tuple[str, str], list[int]] = {}
    window = Window()
    with open(path) as lines:
        for line in lines:
            mark, role, ident, *values = line.split()
            counts = [int(v) for v in values]
            if mark == "start":
                start[(role, ident)] = counts
                continue
            before = start.get((role, ident))
            if before is None:  # a thread born inside the window: not comparable
                continue
            delta = dict(zip(COUNTERS, (b - a for a, b in zip(before, counts, strict=True)), strict=True))
            if role == "reference":
                window.reference_ticks += delta["utime"] + delta["stime"]
            elif delta["utime"] + delta["stime"] > BUSY_TICKS:
                window.serving = delta
            else:
                for name, value in delta.items():
                    window.others[name] += value
    return window


def describe(path: str, window: Window) -> str:
    serving = window.serving
    if not serving:
        return f"{path}: no serving thread in the window"
    ticks = serving["utime"] + serving["stime"]
    share = ticks / window.reference_ticks if window.reference_ticks else float("nan")
    return (
        f"{path}: serving thread {ticks} ticks ({serving['stime']} system), {serving['minflt']} minor faults,"
        f" {serving['migrations']} migrations, {serving['switches']} switches ({serving['involuntary']} involuntary);"
        f" against the reference {share:.3f}; other threads {window.others['utime'] + window.others['stime']} ticks,"
        f" {window.others['switches']} switches"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("windows", nargs="+", help="files written by sched_window.sh")
    for path in parser.parse_args().windows:
        print(describe(path, read_window(path)))


if __name__ == "__main__":
    main()
