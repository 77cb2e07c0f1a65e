# SPDX-License-Identifier: Apache-2.0
"""The `sie-sidecar` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sie-sidecar",
        description="Queue-worker sidecar for GPU inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"sie-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="a guided tour of the wire core with live figures")
    demo.add_argument("--items", type=int, default=256, help="items per batch in the tour (default 256)")
    demo.add_argument("--dim", type=int, default=384, help="embedding dimension in the tour (default 384)")
    demo.add_argument("--chunked-mib", type=int, default=40, help="size of the chunked response (default 40)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from .tour import run_tour

        return run_tour(items=args.items, dim=args.dim, chunked_mib=args.chunked_mib)
    return 2  # pragma: no cover - argparse rejects unknown commands first
