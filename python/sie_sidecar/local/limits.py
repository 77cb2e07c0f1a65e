# SPDX-License-Identifier: Apache-2.0
"""The per-connection budgets of the local-ingest socket (sidecar-behaviour §11), shared by the
server that enforces them and the client that stays within them."""

from __future__ import annotations

from typing import Final

DATA_OPS: Final = 80
CONTROL_OPS: Final = 1
REQUEST_BYTES: Final = 64 * 1024 * 1024
CONTROL_RESERVE: Final = 1024
WRITE_FRAMES: Final = 80
WRITE_BYTES: Final = 64 * 1024 * 1024 + 4
WRITE_DEADLINE_S: Final = 5.0
STREAMS: Final = 64
#: On a stream's timeout or disconnect: the cancel signal, then the drain, each bounded.
CANCEL_S: Final = 5.0
DRAIN_S: Final = 5.0

__all__ = [
    "CANCEL_S",
    "CONTROL_OPS",
    "CONTROL_RESERVE",
    "DATA_OPS",
    "DRAIN_S",
    "REQUEST_BYTES",
    "STREAMS",
    "WRITE_BYTES",
    "WRITE_DEADLINE_S",
    "WRITE_FRAMES",
]
