# SPDX-License-Identifier: Apache-2.0
"""Heap census of a running sidecar: what its Python heap holds, and what grew between two moments.

Why: the soak saw `sys.getallocatedblocks()` rise ~1 block per 50-100 items while RSS and the C heap
stayed flat. Blocks alone cannot tell a cache filling up to its bound from a leak; a census of *where*
the live blocks were allocated, taken twice under the same load, can.

Two halves:
- the child: `python -m benches.heap_census child DIR [sidecar args...]` starts `tracemalloc` before
  anything of the package is imported (so every allocation is traced), then runs `sie-sidecar run`.
  Each SIGUSR1 writes, under `DIR/pid-PID/`, `census-NNN.tracemalloc` (a tracemalloc snapshot) and
  `census-NNN.json`: the allocated blocks before and after a full collection, what that collection
  freed by type (`DEBUG_SAVEALL`: cyclic garbage, with reprs), live objects per type from
  `gc.get_objects()` (the frozen start-up objects only as a count: `gc.freeze()` hides them), and
  objects native code made inside a loop callback. A census takes ~1.5 s of the loop.
  `HEAP_CENSUS_TRACE=0` leaves tracemalloc off: the counts and the garbage only, at full speed.
- the report: `python -m benches.heap_census diff DIR` (or `report()` from the leak check) compares the
  first census with each later one: blocks, the allocation sites whose live bytes or blocks grew most
  (grouped by traceback, the sidecar's own frames first) and the object types whose count grew.

`benches/leak_check.py --census-dir DIR` runs the sidecar under the child and signals it at set points
of the load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import reprlib
import signal
import sys
import time
import traceback
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

FRAMES = 12  # traceback depth kept per allocation: enough to reach the sidecar's frame below asyncio's
TOP = 12


# --- the child -------------------------------------------------------------------------------------------------------


class Censor:
    """Writes one census per call into `directory`, numbered from 0."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.taken = 0

    def take(self) -> Path:
        """One census now; the path of its JSON half."""
        stem = self.directory / f"census-{self.taken:03d}"
        self.taken += 1
        blocks_before = sys.getallocatedblocks()
        garbage = collect_garbage()  # what a collection would free is not live: count only what survives one
        # Counted before the snapshot exists: its traces are Python objects too.
        blocks = sys.getallocatedblocks()
        tracing = tracemalloc.is_tracing()
        traced = tracemalloc.get_traced_memory()[0] if tracing else 0
        types = Counter(type(obj).__qualname__ for obj in gc.get_objects())
        made_by_callbacks = callback_made_objects() if tracing else {}
        if tracing:
            snapshot = tracemalloc.take_snapshot()
            snapshot.dump(f"{stem}.tracemalloc")
            del snapshot
        info = {
            "blocks": blocks,
            "blocks_before_collect": blocks_before,  # the difference: cyclic garbage waiting for a collection
            "collected": sum(entry["count"] for entry in garbage.values()),
            "garbage": garbage,  # the cyclic garbage that collection freed, by type
            "gc_stats": gc.get_stats(),
            "traced_bytes": traced,
            "frozen_objects": gc.get_freeze_count(),
            "types": dict(types.most_common()),
            "made_by_loop_callbacks": made_by_callbacks,
        }
        Path(f"{stem}.json").write_text(json.dumps(info))
        return Path(f"{stem}.json")


def collect_garbage(samples: int = 5) -> dict[str, Any]:
    """A full collection that keeps what it frees (`DEBUG_SAVEALL`) long enough to name it: per
    type the count and a few reprs. Cyclic garbage is alive until its generation is collected, and
    with the sidecar's gen-0 threshold of 10,000 that can be hours; its types say which code makes
    the cycles."""
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        counts: Counter[str] = Counter(type(obj).__qualname__ for obj in gc.garbage)
        reprs: dict[str, list[str]] = {}
        for obj in gc.garbage:
            kept = reprs.setdefault(type(obj).__qualname__, [])
            if len(kept) < samples:
                kept.append(_SHORT_REPR.repr(obj))
    finally:
        gc.garbage.clear()
        gc.set_debug(flags)
    gc.collect()  # the garbage, now unreferenced by gc.garbage, goes for real
    return {name: {"count": n, "samples": reprs[name]} for name, n in counts.most_common()}


def _handle_run_lines() -> tuple[str, range]:
    lines, first = inspect.getsourcelines(asyncio.events.Handle._run)
    return inspect.getsourcefile(asyncio.events.Handle._run) or "", range(first, first + len(lines))


_HANDLE_RUN = _handle_run_lines()
#: Reprs of bounded cost: a multi-MB payload is not rendered whole to keep 160 characters of it.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 160


def _in_handle_run(frame: tracemalloc.Frame) -> bool:
    return frame.filename == _HANDLE_RUN[0] and frame.lineno in _HANDLE_RUN[1]


def callback_made_objects(samples: int = 5) -> dict[str, Any]:
    """Live objects whose allocation's innermost traced frame is asyncio's `Handle._run`: made by
    native code (a C or Rust callable) the loop called directly, so no Python frame names their
    maker. Per type: the count and a few reprs, which usually do. Objects the collector does not
    track (tuples of atoms, ints, strings) are found as referents of those it does."""
    seen: set[int] = set()
    counts: Counter[str] = Counter()
    reprs: dict[str, list[str]] = {}
    for holder in gc.get_objects():
        for obj in (holder, *gc.get_referents(holder)):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            trace = tracemalloc.get_object_traceback(obj)
            if trace is None or not _in_handle_run(trace[-1]):
                continue
            name = type(obj).__qualname__
            counts[name] += 1
            kept = reprs.setdefault(name, [])
            if len(kept) < samples:
                kept.append(_SHORT_REPR.repr(obj))
    return {name: {"count": n, "samples": reprs[name]} for name, n in counts.most_common()}


def child(directory: Path, sidecar_args: list[str]) -> int:
    """Trace every allocation, take a census on each SIGUSR1, run the sidecar."""
    if os.environ.get("HEAP_CENSUS_TRACE", "1") != "0":  # 0: counts only, at the sidecar's own speed
        tracemalloc.start(FRAMES)
    own = directory / f"pid-{os.getpid()}"  # a restarted sidecar is a new process with its own censuses
    censor = Censor(own)
    busy = False

    def on_usr1(_signum: int, _frame: FrameType | None) -> None:
        """Never raises into the code it interrupted (the event loop): an error is printed, and a
        signal during a census is ignored (a nested census would clear `gc.garbage` under the first)."""
        nonlocal busy
        if busy:
            return
        busy = True
        try:
            censor.take()
        except BaseException:  # anything raised here would surface in the sidecar's loop
            traceback.print_exc()
        finally:
            busy = False

    signal.signal(signal.SIGUSR1, on_usr1)  # before the directory exists: `take_census` waits for it
    own.mkdir(parents=True, exist_ok=True)
    from sie_sidecar.cli import main as sidecar_main

    return sidecar_main(["run", *sidecar_args])


# --- the report ------------------------------------------------------------------------------------------------------


@dataclass
class SiteGrowth:
    """One allocation site (a traceback) whose live memory changed between two censuses."""

    frames: list[str]  # "file:line", innermost first
    size_diff: int
    count_diff: int
    size: int
    count: int


@dataclass
class CensusDiff:
    """What grew from one census of a process to a later one."""

    first: str
    last: str
    blocks: tuple[int, int]
    traced_bytes: tuple[int, int]
    sites: list[SiteGrowth] = field(default_factory=list)
    types: list[tuple[str, int, int]] = field(default_factory=list)  # (type, count in last, growth)
    made_by_callbacks: list[tuple[str, int, int, str]] = field(default_factory=list)  # (type, growth, now, sample)


def _ignore(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    """Drop the census's own allocations (tracemalloc, this module's json/pickle)."""
    return snapshot.filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<unknown>"),
        ]
    )


def _short(filename: str) -> str:
    """`sie_sidecar/pipeline/feed.py` for the package's files, the bare name for everything else."""
    _, sep, tail = filename.rpartition("sie_sidecar/")
    return f"{sep}{tail}" if sep else Path(filename).name


def _own_frame_first(frames: list[str]) -> list[str]:
    """The innermost frames, cut after the first frame of the package (what made the allocation)."""
    for index, frame in enumerate(frames):
        if frame.startswith("sie_sidecar/"):
            return frames[: index + 1]
    return frames[:4]


def diff(first: Path, last: Path, *, top: int = TOP) -> CensusDiff:
    """Growth from census `first` to census `last` (paths without suffix, e.g. DIR/census-000)."""
    info0 = json.loads(first.with_suffix(".json").read_text())
    info1 = json.loads(last.with_suffix(".json").read_text())
    snap0 = _ignore(tracemalloc.Snapshot.load(str(first.with_suffix(".tracemalloc"))))
    snap1 = _ignore(tracemalloc.Snapshot.load(str(last.with_suffix(".tracemalloc"))))
    result = CensusDiff(
        first.name,
        last.name,
        (info0["blocks"], info1["blocks"]),
        (info0["traced_bytes"], info1["traced_bytes"]),
    )
    stats = snap1.compare_to(snap0, "traceback")
    stats.sort(key=lambda s: (s.count_diff, s.size_diff), reverse=True)
    for stat in stats[:top]:
        if stat.count_diff <= 0:
            break
        frames = [f"{_short(fr.filename)}:{fr.lineno}" for fr in reversed(stat.traceback)]
        result.sites.append(
            SiteGrowth(_own_frame_first(frames), stat.size_diff, stat.count_diff, stat.size, stat.count)
        )
    types0: dict[str, int] = info0["types"]
    types1: dict[str, int] = info1["types"]
    grown = [(name, n, n - types0.get(name, 0)) for name, n in types1.items() if n > types0.get(name, 0)]
    grown.sort(key=lambda row: row[2], reverse=True)
    result.types = grown[:top]
    made0: dict[str, Any] = info0.get("made_by_loop_callbacks", {})
    made1: dict[str, Any] = info1.get("made_by_loop_callbacks", {})
    for name, entry in made1.items():
        growth = entry["count"] - made0.get(name, {}).get("count", 0)
        if growth > 0:
            result.made_by_callbacks.append((name, growth, entry["count"], (entry["samples"] or [""])[-1]))
    result.made_by_callbacks.sort(key=lambda row: row[1], reverse=True)
    del result.made_by_callbacks[top:]
    return result


def censuses(directory: Path) -> list[Path]:
    """One process's censuses in the order taken (paths without suffix)."""
    return sorted(p.with_suffix("") for p in directory.glob("census-*.json"))


def count_taken(directory: Path) -> int:
    """Censuses written under `directory` by every process (the caller waits for this to rise)."""
    return sum(1 for _ in directory.rglob("census-*.json"))


def format_diff(d: CensusDiff) -> str:
    """The diff as the report prints it."""
    lines = [
        f"{d.first} -> {d.last}: blocks {d.blocks[0]:,} -> {d.blocks[1]:,} ({d.blocks[1] - d.blocks[0]:+,}),"
        f" traced {d.traced_bytes[0] / 1e6:.2f} -> {d.traced_bytes[1] / 1e6:.2f} MB",
        "  sites whose live blocks grew (count, bytes; innermost frame first):",
    ]
    lines += [
        f"    {s.count_diff:+6,} blocks {s.size_diff:+9,} B (now {s.count:,}) {' < '.join(s.frames)}" for s in d.sites
    ] or ["    none"]
    if d.made_by_callbacks:
        lines.append("  made by native code a loop callback ran (type: count, a sample):")
        lines += [f"    {name}: {n:+,} (now {now:,}) {sample}" for name, n, now, sample in d.made_by_callbacks]
    lines.append("  types whose live objects grew:")
    lines += [f"    {growth:+6,} {name} (now {n:,})" for name, n, growth in d.types] or ["    none"]
    return "\n".join(lines)


def report(directory: Path, *, top: int = TOP) -> str:
    """Per process (each `pid-*` below `directory`, or `directory` itself): its first census against
    every later one."""
    processes = sorted(p for p in directory.glob("pid-*") if p.is_dir()) or [directory]
    parts = []
    for process in processes:
        found = censuses(process)
        if len(found) < 2:
            parts.append(f"heap census: {len(found)} census(es) in {process}, need 2")
            continue
        parts.append(f"== {process.name}")
        parts += [format_diff(diff(found[0], later, top=top)) for later in found[1:]]
    return "\n".join(parts)


async def take_census(pid: int, directory: Path, timeout_s: float = 60.0) -> bool:
    """SIGUSR1 to the child `pid`, then wait until its census file is written (about a second).
    False when none came in time or the process is gone."""
    if not (directory / f"pid-{pid}").is_dir():
        return False  # not started far enough to have its handler (SIGUSR1 would kill it)
    before = count_taken(directory)
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while count_taken(directory) == before:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["child"] and len(args_in) >= 2:
        return child(Path(args_in[1]), args_in[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("mode", choices=["diff"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--top", type=int, default=TOP)
    args: Any = parser.parse_args(args_in)
    print(report(args.dir, top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
