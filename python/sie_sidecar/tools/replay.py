# SPDX-License-Identifier: Apache-2.0
"""Replay a JSONL trace through the adaptive batch controller (scheduler-and-prep §4.7).

Input: one event per line, `{"event":"step","dt_s":…,"observed_p50_ms":…,"fill_ratio":…,
"batch_size":…}` or `{"event":"record_inference","inference_ms":…}`; blank and `#` lines skipped.
Output: one compact JSON line per step, `{"wait_ms":…,"batch_cost":…,"starvation_resets":…}`,
so a trace recorded from production (or from the upstream controller) can be diffed line by line.

Exit status: 0 done, 1 a bad trace or configuration (the message names the line), 2 usage.
Hook: `add_replay_arguments` + `run_replay` for the `sie-sidecar` CLI; `main` stands alone.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, cast

Replay = Callable[[str, str | None], list[dict[str, Any]]]


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", default="-", help="JSONL trace file (default, or '-': stdin)")
    parser.add_argument(
        "--config",
        metavar="JSON",
        default=None,
        help="controller fields as a JSON object; unspecified fields take the module defaults",
    )
    parser.add_argument("--plot", metavar="PNG", default=None, help="also plot wait and cost (needs matplotlib)")
    parser.add_argument(
        "--impl",
        choices=("auto", "native", "py"),
        default="auto",
        help="controller implementation (default: as SIE_SIDECAR_NO_EXTENSIONS selects)",
    )


def _replay_for(name: str) -> Replay:
    if name == "native":
        from ..wire._switch import native

        return cast(Replay, native().replay_controller)
    if name == "py":
        from ..wire._switch import twin

        return cast(Replay, twin("controller").replay_controller)
    from ..sched.controller import replay_controller

    return replay_controller


def _plot(steps: list[dict[str, Any]], path: str) -> None:
    """Wait and cost per step, with starvation recoveries marked."""
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")  # files only: no display on servers
    plt: Any = importlib.import_module("matplotlib.pyplot")
    fig, (ax_wait, ax_cost) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    x = range(len(steps))
    ax_wait.plot(x, [s["wait_ms"] for s in steps], drawstyle="steps-post")
    ax_wait.set_ylabel("wait (ms)")
    ax_cost.plot(x, [s["batch_cost"] for s in steps], drawstyle="steps-post", color="tab:orange")
    ax_cost.set_ylabel("batch cost cap")
    ax_cost.set_xlabel("step")
    previous = 0
    for i, s in enumerate(steps):
        if s["starvation_resets"] > previous:
            for ax in (ax_wait, ax_cost):
                ax.axvline(i, color="tab:red", linestyle=":", linewidth=1)
        previous = s["starvation_resets"]
    ax_wait.set_title("adaptive batch controller replay (dotted: starvation recovery)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_replay(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        print("replay: --plot needs matplotlib, which is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    try:
        text = stdin.read() if args.trace == "-" else Path(args.trace).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    try:
        steps = _replay_for(args.impl)(text, args.config)
    except ValueError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    stdout.writelines(json.dumps(step, separators=(",", ":")) + "\n" for step in steps)
    if args.plot is not None:
        _plot(steps, args.plot)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sie-sidecar replay", description=__doc__.splitlines()[0] if __doc__ else None
    )
    add_replay_arguments(parser)
    return run_replay(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
