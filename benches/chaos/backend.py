# SPDX-License-Identifier: Apache-2.0
"""The reference backend (`sie-sidecar backend`, null adapter) with one more signal for the chaos rig.

SIGUSR1 is a graceful restart's first half: the backend refuses batch work with `draining` for
`--drain-s` seconds (as a backend that was sent `Drain`, while its heartbeat still answers), then
closes (in-flight batches finish) and exits 0; the pod starts it again. SIGTERM/SIGINT stop it as
`sie-sidecar backend` does.

SIGUSR2 hangs batch work for `--hang-s` seconds while the heartbeat (`Ping`) and everything else still
answer: a device that stopped making progress, as opposed to a process that stopped (SIGSTOP). Every
batch that starts in the window waits until it ends, then runs.

Run: `python -m benches.chaos.backend --socket PATH --preload MODEL --batch-time 8,30 --drain-s 5`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from typing import Any

from sie_sidecar.backend.adapter import Adapter, BatchOutputs
from sie_sidecar.backend.cli import add_backend_arguments, build_adapter
from sie_sidecar.backend.server import BackendServer


class BatchGate:
    """Holds every batch that starts before `until` (loop time) until then; the rest pass at once."""

    def __init__(self, adapter: Adapter) -> None:
        self.until = 0.0
        self.held = 0
        self._run = adapter.run_batch_outputs

        async def gated(
            model_id: str, op: str, items: list[dict[str, Any]], lora_key: str, *, accepts_f16: bool
        ) -> BatchOutputs:
            wait_s = self.until - asyncio.get_running_loop().time()
            if wait_s > 0:
                self.held += 1
                await asyncio.sleep(wait_s)
            return await self._run(model_id, op, items, lora_key, accepts_f16=accepts_f16)

        adapter.run_batch_outputs = gated  # type: ignore[method-assign]


async def serve(args: argparse.Namespace) -> int:
    adapter = build_adapter(args)
    gate = BatchGate(adapter)
    server = BackendServer(adapter, args.socket, worker_id=args.worker_id or socket.gethostname())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def hang() -> None:
        logging.getLogger("chaos.backend").warning("batches hang for %.1f s (heartbeat answers)", args.hang_s)
        gate.until = loop.time() + args.hang_s

    def graceful() -> None:
        logging.getLogger("chaos.backend").warning("graceful restart: draining for %.1f s", args.drain_s)
        server.drain_for(None)
        loop.call_later(args.drain_s, stop.set)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, graceful)
    loop.add_signal_handler(signal.SIGUSR2, hang)
    try:
        await server.start()
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
        await server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.chaos.backend", description=__doc__)
    add_backend_arguments(parser)
    parser.add_argument("--drain-s", type=float, default=5.0, help="SIGUSR1: refuse batches this long, then exit")
    parser.add_argument("--hang-s", type=float, default=35.0, help="SIGUSR2: hold batches this long")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
