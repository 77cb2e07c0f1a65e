# SPDX-License-Identifier: Apache-2.0
"""The `sie-sidecar` command line: `run`, `backend`, `loadgen`, `replay`, `top`, `demo`, `tour`."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

#: What nats-py imports only for its WebSocket transport, an optional extra it runs without: `run`
#: hides them while nats loads unless a server is `ws://` or `wss://` (aiohttp alone cost ~0.15 s CPU
#: at start-up, half of it the SSL context aiohttp.connector builds at import).
WEBSOCKET_ONLY = ("aiohttp", "multidict")
WEBSOCKET_SCHEMES = ("ws", "wss")


class _VersionAction(argparse.Action):
    """`--version`, reading the package metadata only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from . import __version__

        print(f"sie-sidecar {__version__}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with only `command`'s options filled in: `run` then starts without
    importing the backend and load-generator modules (numpy, the adapters), about 0.15 s."""
    parser = argparse.ArgumentParser(
        prog="sie-sidecar",
        description="Queue-worker sidecar for GPU inference servers.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="consume JetStream work and serve it through the backend", allow_abbrev=False)
    if command in (None, "run"):
        from .config import add_run_arguments

        add_run_arguments(run)
    backend = commands.add_parser("backend", help="run the reference backend (null or minilm adapter)")
    if command in (None, "backend"):
        from .backend.cli import add_backend_arguments

        add_backend_arguments(backend)
    loadgen = commands.add_parser("loadgen", help="act as the gateway: publish WorkItems, collect results")
    if command in (None, "loadgen"):
        from .tools.loadgen import add_loadgen_arguments

        add_loadgen_arguments(loadgen)
    replay = commands.add_parser("replay", help="replay a controller trace (JSONL) and print or plot the knobs")
    if command in (None, "replay"):
        from .tools.replay import add_replay_arguments

        add_replay_arguments(replay)
    top = commands.add_parser("top", help="a live view of a running sidecar (its /debug/state endpoint)")
    if command in (None, "top"):
        from .tools.top import add_top_arguments

        add_top_arguments(top)
    probe = commands.add_parser("probe", help="ask a running sidecar's /healthz or /readyz; exit 0 only on 200")
    if command in (None, "probe"):
        from .tools.probe import add_probe_arguments

        add_probe_arguments(probe)
    demo = commands.add_parser("demo", help="run the whole pipeline locally and print a summary")
    demo.add_argument("--adapter", choices=("minilm", "null"), default="minilm")
    demo.add_argument("--items", type=int, default=None, help="items to send (default: 2,000 minilm, 50,000 null)")
    demo.add_argument("--generate", action="store_true", help="stream one generated answer token by token instead")
    tour = commands.add_parser("tour", help="a guided tour of the wire core with live figures")
    tour.add_argument("--items", type=int, default=256, help="items per batch in the tour (default 256)")
    tour.add_argument("--dim", type=int, default=384, help="embedding dimension in the tour (default 384)")
    tour.add_argument("--chunked-mib", type=int, default=40, help="size of the chunked response (default 40)")
    return parser


def load_run(servers: Sequence[str]) -> Callable[..., Coroutine[Any, Any, int]]:
    """`runtime.run`, imported the way `sie-sidecar run` starts: nats-py without its WebSocket transport
    when no server in `servers` needs it (anything else may still import aiohttp later, as usual)."""
    websocket = any(url.partition("://")[0].strip().lower() in WEBSOCKET_SCHEMES for url in servers)
    if "nats" not in sys.modules and not websocket:
        hidden = [name for name in WEBSOCKET_ONLY if name not in sys.modules]
        for name in hidden:
            sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError
        try:
            from .bus import connect  # noqa: F401  # the NATS client: its transport module sees no aiohttp
        finally:
            for name in hidden:
                if sys.modules.get(name, ...) is None:
                    del sys.modules[name]
    from .runtime import run

    return run


def _run(argv: list[str]) -> int:
    """`sie-sidecar run`. The garbage collector is off while the modules load (they allocate only
    long-lived objects: collecting them was ~10% of the start-up CPU), and what they made is frozen
    out of every later collection before the sidecar starts."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        import asyncio

        args = build_parser("run").parse_args(argv)
        from .config import ConfigError, Settings
        from .logs import configure_logging

        try:
            settings = Settings.from_sources(os.environ, args)
            settings.require_supported()  # a setting this build lacks is refused, never ignored
        except ConfigError as exc:
            print(f"sie-sidecar: {exc}", file=sys.stderr)
            return 2
        configure_logging(settings.log_filter)
        run = load_run(settings.nats_servers)
        gc.freeze()
    finally:
        if gc_was_enabled:
            gc.enable()
    return asyncio.run(run(settings))


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (its first positional argument), if any."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    if command == "run":
        return _run(argv)
    if command == "probe":  # a HEALTHCHECK every few seconds: no asyncio, no runtime imports
        from .tools.probe import run_probe

        return run_probe(build_parser(command).parse_args(argv))
    import asyncio

    args = build_parser(command).parse_args(argv)

    if args.command == "backend":
        from .backend.cli import run_backend
        from .logs import configure_logging

        configure_logging(os.environ.get("RUST_LOG", "info"))
        return asyncio.run(run_backend(args))
    if args.command == "loadgen":
        from .tools.loadgen import run_loadgen

        return asyncio.run(run_loadgen(args))
    if args.command == "replay":
        from .tools.replay import run_replay

        return run_replay(args)
    if args.command == "top":
        from .tools.top import run_top

        return run_top(args)
    if args.command == "demo":
        if args.generate:
            from .tools.demo_generate import run_generate_demo

            return run_generate_demo()
        from .tools.demo import run_demo

        return run_demo(adapter=args.adapter, items=args.items)
    from .tools.tour import run_tour

    return run_tour(items=args.items, dim=args.dim, chunked_mib=args.chunked_mib)
