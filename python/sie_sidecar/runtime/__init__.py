# SPDX-License-Identifier: Apache-2.0
"""The runtime: start-up in order, the exit stack, the steady-state garbage collection, and the drain
(sidecar-behaviour §2.1, §15.4), once for both ingest modes. NATS ingest (`nats_mode`) and local
ingest (`local_mode`, §11) are two configurations of it; `lifecycle.run` picks one from the settings.

`cli` is the only importer outside this package: `run` is the entry point, `shutdown_bound_s` the
worst-case drain a pod's termination grace must cover.
"""

from __future__ import annotations

from ..errors import StartupError
from .drain import shutdown_bound_s
from .lifecycle import run

__all__ = ["StartupError", "run", "shutdown_bound_s"]
