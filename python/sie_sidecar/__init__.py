# SPDX-License-Identifier: Apache-2.0
"""sie-sidecar: a queue-worker sidecar for GPU inference servers."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`__version__` on first use: importlib.metadata costs ~30 ms that `run` need not pay at start."""
    if name != "__version__":
        raise AttributeError(f"module 'sie_sidecar' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sie-sidecar")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "0.0.0"


__all__ = ["__version__"]  # provided by __getattr__
