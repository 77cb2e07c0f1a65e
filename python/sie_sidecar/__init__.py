# SPDX-License-Identifier: Apache-2.0
"""sie-sidecar: a queue-worker sidecar for GPU inference servers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sie-sidecar")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["__version__"]
