# SPDX-License-Identifier: Apache-2.0
"""Chooses the compiled wire core or the pure-Python twin (`SIE_SIDECAR_NO_EXTENSIONS=1`)."""

from __future__ import annotations

import os
from types import ModuleType

NO_EXTENSIONS_ENV = "SIE_SIDECAR_NO_EXTENSIONS"


def _wants_twin() -> bool:
    return os.environ.get(NO_EXTENSIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def load_wire() -> ModuleType:
    """Return the wire implementation this process should use.

    The native core is mandatory unless the twin is asked for: a wheel without its extension is
    a broken install, and silently running 3-10x slower would hide that.
    """
    if _wants_twin():
        from . import _wire_py

        return _wire_py
    from . import _wire_native

    return _wire_native


wire_impl = load_wire()
USING_NATIVE: bool = wire_impl.IMPLEMENTATION == "native"

__all__ = ["NO_EXTENSIONS_ENV", "USING_NATIVE", "load_wire", "wire_impl"]
