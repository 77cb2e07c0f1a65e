# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar backend`: run the reference backend on a Unix socket until SIGTERM/SIGINT.

The arguments live here rather than in the main CLI so the backend can also be started as
`python -m sie_sidecar.backend.cli` (tests run it as a subprocess to exercise crashes).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence

from .adapter import Adapter, oom_nak_delay_ms
from .generation import TokenStreamer
from .null import DEFAULT_BATCH_TIME_A_MS, DEFAULT_BATCH_TIME_B_US, NullAdapter
from .server import BackendServer, serve_until_signalled

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/tmp/sie-ipc.sock"


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """The backend's flags, shared by `sie-sidecar backend` and `python -m sie_sidecar.backend.cli`."""
    parser.add_argument("--adapter", choices=("null", "minilm"), default="null", help="model adapter (default null)")
    parser.add_argument(
        "--socket",
        default=os.environ.get("SIE_IPC_SOCKET_PATH", DEFAULT_SOCKET),
        help=f"Unix socket to serve (default $SIE_IPC_SOCKET_PATH or {DEFAULT_SOCKET})",
    )
    parser.add_argument("--worker-id", default=None, help="worker id reported by Ping (default: the host name)")
    parser.add_argument(
        "--keep-drain",
        action="store_true",
        help="stay draining after a Drain until restarted (v0.7.1); by default the drain ends when the sidecar that "
        "asked for it has closed every connection",
    )
    null = parser.add_argument_group("null adapter")
    null.add_argument("--dim", type=_non_negative(1), default=384, help="vector dimension (default 384)")
    null.add_argument("--load-delay-s", type=_seconds, default=0.0, help="simulated model load time (default 0)")
    null.add_argument("--preload", action="append", default=[], metavar="MODEL", help="a model ready from the start")
    null.add_argument("--retry-later-model", action="append", default=[], metavar="MODEL", help="answer retry_later")
    null.add_argument("--failed-model", action="append", default=[], metavar="MODEL", help="answer failed")
    null.add_argument("--error-every", type=_non_negative(0), default=0, help="every Nth item fails (0 = never)")
    null.add_argument(
        "--oversized-bytes", type=_non_negative(0), default=0, help="pad each batch response past N bytes"
    )
    null.add_argument(
        "--cached-results",
        action="store_true",
        help="answer every encode item with one result framed at start (a backend that costs next to nothing)",
    )
    null.add_argument(
        "--crash-after-batches", type=_non_negative(0), default=0, help="exit(1) when the Nth batch arrives (0 = never)"
    )
    null.add_argument("--batch-delay-s", type=_seconds, default=0.0, help="time every batch takes (default 0)")
    null.add_argument(
        "--config-apply-delay-s", type=_seconds, default=0.0, help="time every model-config write takes (default 0)"
    )
    null.add_argument("--batch-budget", type=_non_negative(1), default=64, help="batch_budget reported on ready")
    null.add_argument(
        "--batch-time",
        type=_batch_time,
        nargs="?",
        default=(0.0, 0.0),
        const=(DEFAULT_BATCH_TIME_A_MS, DEFAULT_BATCH_TIME_B_US),
        metavar="A_MS,B_US",
        help="cost model: a batch occupies one simulated device for A ms + B µs per token"
        f" (the flag alone: {DEFAULT_BATCH_TIME_A_MS:g},{DEFAULT_BATCH_TIME_B_US:g}; default off)",
    )
    null.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="tokenizer.json the descriptor names (with its SHA-256 id), so the sidecar tokenizes and costs by tokens",
    )
    null.add_argument(
        "--declared-tokenizer-id",
        default=None,
        metavar="ID",
        help="declare this tokenizer id instead of the file's SHA-256 (e.g. upstream's 32-hex form: the sidecar"
        " then costs items by tokens but sends none)",
    )
    null.add_argument(
        "--batch-log", default=None, metavar="PATH", help="append one JSON line per cost-model batch to PATH"
    )
    gen = parser.add_argument_group("generation (null adapter)")
    gen.add_argument("--gen-token-delay-s", type=_seconds, default=0.0, help="time between streamed tokens (default 0)")
    gen.add_argument(
        "--gen-tokenizer", default=None, metavar="PATH", help="tokenizer.json whose vocabulary the tokens come from"
    )
    gen.add_argument(
        "--gen-timestamps", action="store_true", help="each token's text is its publish time in ns (latency benches)"
    )
    null.add_argument(
        "--no-run-batch",
        dest="supports_run_batch",
        action="store_false",
        help="a per-op backend: RunBatch is an unknown method (as before RunBatch existed)",
    )


def _non_negative(minimum: int) -> argparse._ActionType:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _batch_time(text: str) -> tuple[float, float]:
    """`A_MS,B_US` -> (a in ms, b in µs per token), both finite and >= 0."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected A_MS,B_US (e.g. 2,2), got {text!r}")
    a, b = (_seconds(part.strip()) for part in parts)  # same rule: a finite number >= 0
    if a == float("inf") or b == float("inf"):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return a, b


def build_adapter(args: argparse.Namespace) -> Adapter:
    """The adapter the arguments ask for; MiniLM is imported only when chosen (it loads weights)."""
    if args.adapter == "minilm":
        from .minilm import MiniLMAdapter

        adapter: Adapter = MiniLMAdapter()
        return adapter
    return NullAdapter(
        args.dim,
        load_delay_s=args.load_delay_s,
        retry_later_models=args.retry_later_model,
        failed_models=args.failed_model,
        error_every=args.error_every,
        oversized_bytes=args.oversized_bytes,
        cached_results=args.cached_results,
        crash_after_batches=args.crash_after_batches,
        batch_delay_s=args.batch_delay_s,
        batch_time_a_ms=args.batch_time[0],
        batch_time_b_us_per_token=args.batch_time[1],
        tokenizer_path=args.tokenizer,
        declared_tokenizer_id=args.declared_tokenizer_id,
        batch_log=args.batch_log,
        supports_run_batch=args.supports_run_batch,
        batch_budget=args.batch_budget,
        preloaded_models=args.preload,
        config_apply_delay_s=args.config_apply_delay_s,
        generator=TokenStreamer(
            tokenizer_path=args.gen_tokenizer or args.tokenizer,
            token_delay_s=args.gen_token_delay_s,
            timestamps=args.gen_timestamps,
        ),
    )


def socket_directory_error(path: str) -> str | None:
    """Why the socket cannot be served at `path`, in one line, before anything is loaded: its
    directory is created (owner-only) when missing, as a volume mount would provide it."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        return f"cannot create the socket directory {directory}: {exc.strerror or exc}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"the socket directory {directory} is not writable by this user"
    return None


async def run_backend(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT, then close (in-flight batches are cancelled)."""
    problem = socket_directory_error(args.socket)
    if problem is not None:
        print(f"sie-sidecar backend: --socket {args.socket}: {problem}", file=sys.stderr)
        return 2
    adapter = build_adapter(args)
    server = BackendServer(
        adapter,
        args.socket,
        worker_id=args.worker_id or socket.gethostname(),
        release_drain_on_disconnect=not args.keep_drain,
        oom_nak_delay_ms=oom_nak_delay_ms(os.environ),
    )
    await serve_until_signalled(server)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sie-sidecar backend", description="Run the reference IPC backend.")
    add_backend_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    return asyncio.run(run_backend(args))


if __name__ == "__main__":
    raise SystemExit(main())
