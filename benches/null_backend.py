# SPDX-License-Identifier: Apache-2.0
"""The reference null backend in its own process, for the benches that measure only the sidecar's side."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path


def null_backend_argv(sock: str, model: str, *extra: str) -> list[str]:
    """`python -m sie_sidecar backend --adapter null` on `sock` with `model` preloaded, plus `extra`."""
    return [
        sys.executable,
        "-m",
        "sie_sidecar",
        "backend",
        "--adapter",
        "null",
        "--socket",
        sock,
        "--preload",
        model,
        *extra,
    ]


@contextlib.asynccontextmanager
async def null_backend(model: str, *extra: str) -> AsyncIterator[str]:
    """Start `sie_sidecar backend --adapter null` with `model` preloaded (and `extra` arguments, e.g.
    `--tokenizer PATH`); yield its socket path once it listens."""
    with tempfile.TemporaryDirectory() as tmp:
        sock = f"{tmp}/backend.sock"
        backend = subprocess.Popen(
            null_backend_argv(sock, model, *extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not Path(sock).exists():
                await asyncio.sleep(0.05)
            yield sock
        finally:
            backend.terminate()
            backend.wait()
