# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar backend --socket`: a missing directory is created owner-only (the quickstart's
`/tmp/sie`), and one that cannot be is one line and exit 2, before any model is loaded."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from sie_sidecar.backend.cli import socket_directory_error


def test_a_missing_socket_directory_is_created_owner_only(tmp_path: Path) -> None:
    sock = tmp_path / "a" / "b" / "ipc.sock"
    assert socket_directory_error(str(sock)) is None
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700


def test_an_impossible_socket_directory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sock = blocker / "ipc.sock"
    problem = socket_directory_error(str(sock))
    assert problem is not None and str(blocker) in problem
    command = [sys.executable, "-m", "sie_sidecar", "backend", "--adapter", "null", "--socket", str(sock)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith(f"sie-sidecar backend: --socket {sock}: cannot create the socket directory")
