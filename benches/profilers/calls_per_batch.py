# SPDX-License-Identifier: Apache-2.0
"""Python calls and (profiled) time per batch of a cProfile dump of the sidecar, by category.

Categories: asyncio machinery, nats-py, each room of the package, native core calls, builtins,
socket I/O and start-up. Epoll waits are left out. `--batches` is the number of batches the profiled
round ran (items / 64 at the defaults); `--top N` also lists the N most expensive functions.

    python benches/profilers/calls_per_batch.py /tmp/sidecar.prof --batches 469
"""

from __future__ import annotations

import argparse
import collections
import pstats


def category(path: str, name: str) -> str | None:
    """Where one profiled function belongs (None: left out, the event loop's idle waits)."""
    if "epoll" in name:
        return None
    if "method 'send'" in name or "recv" in name:
        return "socket send / recv (wall: preemption)"
    startup = ("importlib", "dataclasses", "_parser.py", "_compiler.py", "typing.py", "enum.py", "argparse")
    if any(s in path for s in startup) or any(
        s in name for s in ("marshal", "builtins.exec", "__build_class__", "create_dynamic", "posix.stat")
    ):
        return "start-up (imports, class creation)"
    if "sie_sidecar._native" in name or any(s in name for s in ("FrameSplitter", "PercentileWindow", "Batcher")):
        return "native core calls"
    if "/asyncio/" in path or "selectors.py" in path or "_asyncio" in name or "Context" in name:
        return "asyncio machinery"
    if "/nats/" in path:
        return "nats-py"
    if "sie_sidecar/bus/" in path:
        return "bus: inbound scan" if "inbound" in path else "bus: pull consumer, writer, ACK confirmation"
    for room in ("pipeline", "sched", "ipc"):
        if f"sie_sidecar/{room}/" in path:
            return room
    if path.startswith("~"):
        return "builtins"
    return "other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("profile")
    parser.add_argument("--batches", type=float, required=True)
    parser.add_argument("--top", type=int, default=0)
    args = parser.parse_args(argv)
    stats = pstats.Stats(args.profile).stats  # type: ignore[attr-defined]
    seconds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    rows = []
    for (path, line, name), (_, ncalls, tottime, _, _) in stats.items():
        where = category(path, name)
        if where is None:
            continue
        seconds[where] += tottime
        calls[where] += ncalls
        rows.append((tottime, ncalls, f"{path.rsplit('/', 1)[-1]}:{line}:{name}"))
    b = args.batches
    print(f"calls per batch: {sum(calls.values()) / b:,.0f}")
    for where, t in seconds.most_common():
        print(f"  {t / b * 1e6:8.0f} us  {calls[where] / b:7.0f} calls  {where}")
    for t, n, fn in sorted(rows, reverse=True)[: args.top]:
        print(f"  {t / b * 1e6:8.1f} us  {n / b:7.1f} calls  {fn}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
