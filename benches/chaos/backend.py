# SPDX-License-Identifier: Apache-2.0
"""The reference backend (`sie-sidecar backend`, null adapter) with one more signal for the chaos rig.

SIGUSR1 is a graceful restart's first half: the backend refuses batch work with `draining` for
`--drain-s` seconds (as a backend that was sent `Drain`, while its heartbeat still answers), then
closes (in-flight batches finish) and exits 0; the pod starts it again. SIGTERM/SIGINT stop it as
`sie-sidecar backend` does.

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

from sie_sidecar.backend.cli import add_backend_arguments, build_adapter
from sie_sidecar.backend.server import BackendServer


async def serve(args: argparse.Namespace) -> int:
    server = BackendServer(build_adapter(args), args.socket, worker_id=args.worker_id or socket.gethostname())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def graceful() -> None:
        logging.getLogger("chaos.backend").warning("graceful restart: draining for %.1f s", args.drain_s)
        server.drain_for(None)
        loop.call_later(args.drain_s, stop.set)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, graceful)
    try:
        await server.start()
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
        await server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.chaos.backend", description=__doc__)
    add_backend_arguments(parser)
    parser.add_argument("--drain-s", type=float, default=5.0, help="SIGUSR1: refuse batches this long, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
