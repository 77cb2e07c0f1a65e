# SPDX-License-Identifier: Apache-2.0
"""The batch former: the native one, or the pure-Python twin with `SIE_SIDECAR_NO_EXTENSIONS=1`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._speedups import USING_NATIVE

if TYPE_CHECKING or not USING_NATIVE:
    from ._batcher_py import Batcher, FormedBatch
else:
    from ._native import Batcher, FormedBatch

__all__ = ["Batcher", "FormedBatch"]
