# SPDX-License-Identifier: Apache-2.0
"""The one place that chooses the compiled core or the pure-Python twins (`SIE_SIDECAR_NO_EXTENSIONS=1`).

Every facade (`wire`, `sched.batcher`, `sched.controller`) and every module with a native kernel
(`pipeline.columns`, `bus.inbound`...) asks here; nothing else in the runtime imports `_twins`, and
only the facades import `_native`. The native core is mandatory unless the twin is asked for: a
wheel without its extension is a broken install, and silently running 3-10x slower would hide that.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

NO_EXTENSIONS_ENV = "SIE_SIDECAR_NO_EXTENSIONS"


def wants_twin() -> bool:
    """Whether this process runs the pure-Python twins."""
    return os.environ.get(NO_EXTENSIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def twin(name: str) -> ModuleType:
    """A twin module by its name under `_twins` (`wire`, `batcher`, `controller`), whatever the selection:
    for the tools that compare both implementations side by side, and for a twin that also runs beside
    its native kernel (`intake`: the per-message loop, whenever a tombstone is set)."""
    return importlib.import_module(f"sie_sidecar._twins.{name}")


def native() -> ModuleType:
    """The compiled core itself (`sie_sidecar._native`), whatever the selection: for the tools that
    compare both implementations side by side (`replay --impl native`)."""
    return importlib.import_module("sie_sidecar._native")


def native_wire() -> ModuleType:
    """The compiled wire core (Rust + Cython names under one namespace), whatever the selection."""
    return importlib.import_module("sie_sidecar.wire._native_api")


def load_wire() -> ModuleType:
    """The wire implementation this process uses."""
    return twin("wire") if wants_twin() else native_wire()


def load(name: str) -> ModuleType:
    """The implementation of one part of the core by its twin's name (`batcher`, `controller`,
    `columns`...): the twin module under `_twins`, or the extension (which holds every part)."""
    return twin(name) if wants_twin() else native()


wire_impl = load_wire()
USING_NATIVE: bool = wire_impl.IMPLEMENTATION == "native"

__all__ = [
    "NO_EXTENSIONS_ENV",
    "USING_NATIVE",
    "load",
    "load_wire",
    "native",
    "native_wire",
    "twin",
    "wants_twin",
    "wire_impl",
]
