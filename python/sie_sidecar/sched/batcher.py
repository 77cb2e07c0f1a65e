# SPDX-License-Identifier: Apache-2.0
"""The batch former: the native one, or the pure-Python twin with `SIE_SIDECAR_NO_EXTENSIONS=1`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire._switch import load

if TYPE_CHECKING:  # the stubs are the typing source; the twin matches them (parity tests)
    from .._native import Batcher, FormedBatch
else:
    _impl = load("batcher")
    Batcher, FormedBatch = _impl.Batcher, _impl.FormedBatch

__all__ = ["Batcher", "FormedBatch"]
