# SPDX-License-Identifier: Apache-2.0
"""The `sie-sidecar` command line: `run`, `backend`, `loadgen`, `demo`, `tour`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    from .backend.cli import add_backend_arguments
    from .config import add_run_arguments
    from .loadgen import add_loadgen_arguments

    parser = argparse.ArgumentParser(
        prog="sie-sidecar",
        description="Queue-worker sidecar for GPU inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"sie-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="consume JetStream work and serve it through the backend", allow_abbrev=False)
    add_run_arguments(run)
    backend = commands.add_parser("backend", help="run the reference backend (null or minilm adapter)")
    add_backend_arguments(backend)
    loadgen = commands.add_parser("loadgen", help="act as the gateway: publish WorkItems, collect results")
    add_loadgen_arguments(loadgen)
    demo = commands.add_parser("demo", help="run the whole pipeline locally and print a summary")
    demo.add_argument("--adapter", choices=("minilm", "null"), default="minilm")
    demo.add_argument("--items", type=int, default=None, help="items to send (default: 2,000 minilm, 50,000 null)")
    tour = commands.add_parser("tour", help="a guided tour of the wire core with live figures")
    tour.add_argument("--items", type=int, default=256, help="items per batch in the tour (default 256)")
    tour.add_argument("--dim", type=int, default=384, help="embedding dimension in the tour (default 384)")
    tour.add_argument("--chunked-mib", type=int, default=40, help="size of the chunked response (default 40)")
    return parser


def _run(args: argparse.Namespace) -> int:
    from .app import run
    from .config import ConfigError, Settings
    from .logs import configure_logging

    try:
        settings = Settings.from_sources(os.environ, args)
    except ConfigError as exc:
        print(f"sie-sidecar: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_filter)
    return asyncio.run(run(settings))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "backend":
        from .backend.cli import run_backend
        from .logs import configure_logging

        configure_logging(os.environ.get("RUST_LOG", "info"))
        return asyncio.run(run_backend(args))
    if args.command == "loadgen":
        from .loadgen import run_loadgen

        return asyncio.run(run_loadgen(args))
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(adapter=args.adapter, items=args.items)
    from .tour import run_tour

    return run_tour(items=args.items, dim=args.dim, chunked_mib=args.chunked_mib)
