# SPDX-License-Identifier: Apache-2.0
"""The reference backend: an IPC server library and model adapters (docs/runtime.md, `backend/`).

It exists so the sidecar can be run and tested against the real socket protocol without the
upstream inference server: `BackendServer` speaks the protocol, an `Adapter` supplies the model.
"""

from __future__ import annotations

from .adapter import Adapter, is_out_of_memory, item_outcome, unit_counts
from .null import NullAdapter
from .server import BackendServer

__all__ = ["Adapter", "BackendServer", "NullAdapter", "is_out_of_memory", "item_outcome", "unit_counts"]
