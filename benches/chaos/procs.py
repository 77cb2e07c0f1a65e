# SPDX-License-Identifier: Apache-2.0
"""Child processes of the rig: each the leader of its own process group, all of them killed on any exit.

Every child is registered in one module-level registry; `atexit` and the SIGTERM/SIGINT handlers of
`install_cleanup` SIGKILL every group still alive, so a failed or interrupted run leaves nothing behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

STOP_GRACE_S = 15.0

_LIVE: set[Proc] = set()


def threads_stopped(pid: int) -> bool | None:
    """Whether every thread of `pid` is in group stop (`T` in /proc/PID/task/TID/stat); None where
    /proc has no such process. `kill` returns before the stop: one thread takes SIGSTOP and stops
    the others, long enough for a server thread on another CPU to answer one more request."""
    tasks = Path(f"/proc/{pid}/task")
    states = []
    for stat in tasks.glob("*/stat"):
        with contextlib.suppress(OSError, IndexError):  # a thread that exited meanwhile
            states.append(stat.read_text().rpartition(")")[2].split()[0])
    if not states:
        return None if not tasks.exists() else False
    return all(state in ("T", "t") for state in states)


class Proc:
    """One command that can be started, signalled, stopped and started again (same argv, env and log)."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log = log
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        with self.log.open("ab") as out:
            out.write(f"\n===== start {self.starts + 1} at {time.strftime('%H:%M:%S')} =====\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole process group (a no-op once it is gone)."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def wait_stopped(self, timeout_s: float = 1.0) -> bool:
        """After SIGSTOP: until the kernel shows every thread stopped (`threads_stopped`); where /proc
        has no such process, False at once."""
        if self.popen is None:
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            stopped = threads_stopped(self.popen.pid)
            if stopped is None:
                return False
            if stopped:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running after `timeout_s`."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the group and reap the leader."""
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
        _LIVE.discard(self)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM (SIGCONT first, in case it is stopped), then SIGKILL after `grace_s`."""
        if self.popen is None:
            return None
        if self.alive:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            self.wait(grace_s)
        self.kill()  # stragglers of the group, and the leader if it ignored SIGTERM
        return self.returncode

    def this_start_log(self) -> str:
        """What the process wrote since its latest start (the text after the last start marker)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return text.rpartition(f"===== start {self.starts} at ")[2] if self.starts else ""

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def kill_all() -> None:
    """SIGKILL every registered group that is still alive (SIGCONT is not needed for SIGKILL)."""
    for proc in list(_LIVE):
        proc.kill()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds every finally (and then atexit), so every child is stopped


def install_cleanup() -> None:
    """Kill all children at interpreter exit and turn SIGTERM/SIGINT/SIGHUP into a clean exit."""
    atexit.register(kill_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)


__all__ = ["STOP_GRACE_S", "Proc", "install_cleanup", "kill_all", "threads_stopped"]
