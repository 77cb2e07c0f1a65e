# SPDX-License-Identifier: Apache-2.0
"""The sidecar's CPU per 1,000 items and start-up with OTLP metrics and traces off and on, side by side
in one run (issues 14 and 32).

One OTLP/HTTP sink (a subprocess: this file with `--sink PORT`; it decodes every export as a collector
would and counts requests, data points and spans), then `--rounds` x {off, on} e2e sidecar runs in ABBA
order (off, on, on, off, off, on, ...), each exactly e2e_throughput's throughput round: a fresh
nats-server and null backend, `--items` preloaded WorkItems, one sidecar start timed to the last reply.
"on" runs get `SIE_METRICS_ENABLED=true` and `SIE_TRACING_ENABLED=true` (every batch sampled: the
default `parentbased_always_on`, the items carry no context), the sink's endpoints, `http/protobuf`, a
1 s metrics export interval and a 1 s span schedule delay, so exports happen inside the measured
window; `--no-traces` leaves tracing off. No naive loop, no half-load phase.

Issue 32's bounds: steady CPU per item on/off within 3%, start-up (first reply) within 0.05 s.

Run from the repository root: `python benches/metrics_overhead.py [--items 50000] [--rounds 3] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benches.*` importable like under pytest and mypy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.e2e_throughput import (
    Processes,
    ThroughputRun,
    _busy_cpus,
    _key_value,
    _median,
    _tail,
    _wait_until,
    abba,
    add_pin_option,
    pin_if_asked,
    precompile_package,
    relative_cpu,
    relative_cpu_by_tenth,
    run_with_children,
    startup_cpu_s,
    steady_cpu_ms_per_1k,
    throughput_round,
    warm_cpu_ms_per_1k,
)
from sie_sidecar import wire
from sie_sidecar.tools.localhost import free_port, port_open

MODES = ("off", "on")
EXPORT_INTERVAL_MS = 1000  # default: pushes land inside a ~2 s measured window
TARGET_RATIO = 1.03  # issue 32: metrics and traces on cost under 3% more steady CPU per item
TARGET_STARTUP_S = 0.05  # issue 32: and start-up (to the first reply) within 0.05 s


# --- the sink (its own process) ------------------------------------------------------------------------------------


def _data_points(request: Any) -> int:
    """Data points in one ExportMetricsServiceRequest, over every metric type."""
    total = 0
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total


def serve_sink(port: int) -> None:
    """POST /v1/metrics and /v1/traces: keep the body; GET /stats: decode what came since the last
    call (every body must decode), count, and return the counts so far as JSON.

    Why decode late: the bench asks for the stats between runs, so the sink's protobuf decoding (tens
    of ms of CPU an export) stays out of the measured window. Decoding as exports arrived put it on
    this 2-CPU machine's cores while the sidecar ran, which in a pod happens on the collector's node,
    not the sidecar's: with 1 s exports it cost the "on" runs ~6% more sidecar CPU per item
    (docs/benchmarks.md, "Telemetry on: what the ABBA measures")."""
    from aiohttp import web
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    stats = {"exports": 0, "data_points": 0, "bytes": 0, "bad": 0, "span_exports": 0, "spans": 0}
    pending: list[tuple[str, bytes]] = []

    def decode(kind: str, body: bytes) -> None:
        try:
            if kind == "traces":
                spans = ExportTraceServiceRequest()
                spans.ParseFromString(body)
                stats["spans"] += sum(len(ss.spans) for rs in spans.resource_spans for ss in rs.scope_spans)
                stats["span_exports"] += 1
            else:
                metrics = ExportMetricsServiceRequest()
                metrics.ParseFromString(body)
                stats["data_points"] += _data_points(metrics)
                stats["exports"] += 1
        except Exception:
            stats["bad"] += 1
            return
        stats["bytes"] += len(body)

    async def traces(request: web.Request) -> web.Response:
        pending.append(("traces", await request.read()))
        return web.Response(content_type="application/x-protobuf")

    async def metrics(request: web.Request) -> web.Response:
        pending.append(("metrics", await request.read()))
        return web.Response(content_type="application/x-protobuf")

    async def get_stats(request: web.Request) -> web.Response:
        while pending:
            decode(*pending.pop(0))
        return web.json_response(stats)

    app = web.Application()
    app.router.add_post("/v1/metrics", metrics)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/stats", get_stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def sink_stats(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as response:
        data: dict[str, int] = json.loads(response.read())
    return data


# --- runs ----------------------------------------------------------------------------------------------------------


@dataclass
class ModeRun:
    mode: str
    run: ThroughputRun
    exports: int  # sink exports from environment start to sidecar stop (the push at shutdown included)
    data_points: int
    export_bytes: int
    spans: int = 0

    @property
    def steady_cpu_ms(self) -> float | None:
        return steady_cpu_ms_per_1k(self.run, "sidecar")

    @property
    def warm_cpu_ms(self) -> float | None:
        return warm_cpu_ms_per_1k(self.run, "sidecar")

    @property
    def total_cpu_ms(self) -> float:
        return self.run.cpu_s.get("sidecar", 0.0) * 1e6 / self.run.items

    @property
    def steady_relative(self) -> float | None:
        return relative_cpu(self.run, self.run.cpu_first_s)

    @property
    def warm_relative(self) -> float | None:
        return relative_cpu(self.run, self.run.cpu_warm_s)


def schedule(rounds: int) -> list[str]:
    """off, on, on, off, off, on, ...: ABBA, so drift cancels out."""
    return abba(rounds, MODES)


def metrics_env(
    port: int, interval_ms: int = EXPORT_INTERVAL_MS, *, traces: bool = True, metrics: bool = True
) -> dict[str, str]:
    env: dict[str, str] = {}
    if metrics:
        env |= {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{port}/v1/metrics",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms),
        }
    if traces:
        env |= {
            "SIE_TRACING_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": str(interval_ms),
        }
    return env


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


async def run_bench(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    began = time.monotonic()
    if not args.no_precompile and precompile_package() != 0:
        print("warning: some sie_sidecar modules did not compile", flush=True)
    busy_before = _busy_cpus()
    if busy_before > 0.25:
        print(f"warning: {busy_before:.2f} CPUs busy before the run; other work skews the figures", flush=True)
    # The sink outlives every round, and throughput_round stops all of `procs` at its end: its own group.
    sink_procs = Processes()
    port = free_port()
    sink_log = Path(args.keep_logs or tempfile.gettempdir()) / f"otlp-sink-{os.getpid()}.log"
    sink_log.parent.mkdir(parents=True, exist_ok=True)
    sink = sink_procs.start("otlp-sink", [sys.executable, __file__, "--sink", str(port)], dict(os.environ), sink_log)
    runs: list[ModeRun] = []
    try:
        await _wait_until(lambda: port_open(port), 30, "the OTLP sink", sink)
        base_env = dict(args.sidecar_env)
        for index, mode in enumerate(schedule(args.rounds), start=1):
            on_env = metrics_env(port, args.export_interval_ms, traces=not args.no_traces, metrics=not args.no_metrics)
            env = {**base_env, **(on_env if mode == "on" else {})}
            before = sink_stats(port)
            run = await throughput_round(
                procs, "sidecar", index, argparse.Namespace(**{**vars(args), "sidecar_env": env})
            )
            after = sink_stats(port)
            mode_run = ModeRun(
                mode,
                run,
                exports=after["exports"] - before["exports"],
                data_points=after["data_points"] - before["data_points"],
                export_bytes=after["bytes"] - before["bytes"],
                spans=after["spans"] - before["spans"],
            )
            runs.append(mode_run)
            print(
                f"run {index} {mode:<3}: {run.items_per_s:8,.0f} items/s"
                f" (steady {_fmt(run.steady_items_per_s, ',.0f')}),"
                f" sidecar CPU/1k steady {_fmt(mode_run.steady_cpu_ms, '.1f')} ms"
                f" (all {mode_run.total_cpu_ms:.1f} ms), start-up {_fmt(run.startup_s, '.3f')} s"
                f" (CPU {_fmt(startup_cpu_s(run), '.3f')} s),"
                f" {run.replies:,}/{run.items:,} replies in {run.elapsed_s:.2f} s,"
                f" lost {run.lost}, dup {run.duplicates},"
                f" sink: {mode_run.exports} exports / {mode_run.data_points:,} data points / {mode_run.spans:,} spans",
                flush=True,
            )
        sink_total = sink_stats(port)
    except Exception:
        print(f"OTLP sink log:\n{_tail(sink_log)}", file=sys.stderr)
        raise
    finally:
        sink_procs.stop_all()
    summary = report(runs, sink_total, args)
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return {
        "config": {
            "items": args.items,
            "rounds": args.rounds,
            "sidecar_env": args.sidecar_env,
            "metrics_env": metrics_env(
                port, args.export_interval_ms, traces=not args.no_traces, metrics=not args.no_metrics
            ),
            "native_wire": wire.USING_NATIVE,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "busy_cpus_before": busy_before,
            "loadavg_after": os.getloadavg(),
        },
        "summary": summary,
        "sink": sink_total,
        "runs": [
            {
                "mode": r.mode,
                "exports": r.exports,
                "data_points": r.data_points,
                "export_bytes": r.export_bytes,
                "spans": r.spans,
            }
            | asdict(r.run)
            for r in runs
        ],
    }


def _signals(args: argparse.Namespace) -> str:
    return "traces" if args.no_metrics else "metrics" if args.no_traces else "metrics and traces"


def _spread(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) / min(present) - 1 if present and min(present) > 0 else None


def _ratio(on: float | None, off: float | None) -> float | None:
    return on / off if on is not None and off else None


def report(runs: list[ModeRun], sink_total: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    """Print the per-run table (markdown, for docs/benchmarks.md) and the medians; return the summary."""
    per = {m: [r for r in runs if r.mode == m] for m in MODES}

    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return _median(present) if present else None

    medians: dict[str, dict[str, float | None]] = {
        m: {
            "items_per_s": med([r.run.items_per_s for r in per[m]]),
            "steady_items_per_s": med([r.run.steady_items_per_s for r in per[m]]),
            "steady_cpu_ms_per_1k": med([r.steady_cpu_ms for r in per[m]]),
            "warm_cpu_ms_per_1k": med([r.warm_cpu_ms for r in per[m]]),
            "steady_relative_cpu": med([r.steady_relative for r in per[m]]),
            "warm_relative_cpu": med([r.warm_relative for r in per[m]]),
            "cpu_ms_per_1k": med([r.total_cpu_ms for r in per[m]]),
            "startup_s": med([r.run.startup_s for r in per[m]]),
            "startup_cpu_s": med([startup_cpu_s(r.run) for r in per[m]]),
        }
        for m in MODES
    }
    ratios = {key: _ratio(medians["on"][key], medians["off"][key]) for key in medians["on"]}
    print()
    print(
        f"{_signals(args)} overhead: {args.items:,} encode items per run,"
        f" null backend, {os.cpu_count()} CPUs, {args.rounds} rounds x {{off, on}} (ABBA),"
        f" export interval {args.export_interval_ms} ms"
    )
    print()
    warm = f"{args.warm_fraction:.0%}"
    print(
        "| run | telemetry | items/s | steady items/s | steady sidecar CPU / 1,000 items (first reply -> last)"
        f" | the same past the first {warm} of the replies | sidecar CPU / 1,000 items (start -> last)"
        f" | sidecar CPU / nats-server + backend CPU, steady | the same past the first {warm}"
        " | start-up (to the first reply) | CPU before the first reply | exports / data points / spans received |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for index, r in enumerate(runs, start=1):
        print(
            f"| {index} | {r.mode} | {r.run.items_per_s:,.0f} | {_fmt(r.run.steady_items_per_s, ',.0f')}"
            f" | {_fmt(r.steady_cpu_ms, '.2f')} ms | {_fmt(r.warm_cpu_ms, '.2f')} ms | {r.total_cpu_ms:.1f} ms"
            f" | {_fmt(r.steady_relative, '.4f')} | {_fmt(r.warm_relative, '.4f')}"
            f" | {_fmt(r.run.startup_s, '.3f')} s | {_fmt(startup_cpu_s(r.run), '.3f')} s"
            f" | {r.exports} / {r.data_points:,} / {r.spans:,} |"
        )
    for m in MODES:
        d = medians[m]
        exports = sum(r.exports for r in per[m])
        points = sum(r.data_points for r in per[m])
        spans = sum(r.spans for r in per[m])
        print(
            f"| median | {m} | {_fmt(d['items_per_s'], ',.0f')} | {_fmt(d['steady_items_per_s'], ',.0f')}"
            f" | {_fmt(d['steady_cpu_ms_per_1k'], '.2f')} ms | {_fmt(d['warm_cpu_ms_per_1k'], '.2f')} ms"
            f" | {_fmt(d['cpu_ms_per_1k'], '.1f')} ms"
            f" | {_fmt(d['steady_relative_cpu'], '.4f')} | {_fmt(d['warm_relative_cpu'], '.4f')}"
            f" | {_fmt(d['startup_s'], '.3f')} s | {_fmt(d['startup_cpu_s'], '.3f')} s"
            f" | {exports} / {points:,} / {spans:,} (sum) |"
        )
    print(
        f"| on/off | | {_fmt(ratios['items_per_s'], '.3f')}x | {_fmt(ratios['steady_items_per_s'], '.3f')}x"
        f" | {_fmt(ratios['steady_cpu_ms_per_1k'], '.3f')}x | {_fmt(ratios['warm_cpu_ms_per_1k'], '.3f')}x"
        f" | {_fmt(ratios['cpu_ms_per_1k'], '.3f')}x"
        f" | {_fmt(ratios['steady_relative_cpu'], '.3f')}x | {_fmt(ratios['warm_relative_cpu'], '.3f')}x"
        f" | {_fmt(ratios['startup_s'], '.3f')}x | {_fmt(ratios['startup_cpu_s'], '.3f')}x | |"
    )
    print()
    cpu_ratio = ratios["steady_cpu_ms_per_1k"]
    verdict = "-" if cpu_ratio is None else ("met" if cpu_ratio < TARGET_RATIO else "NOT met")
    warm_ratio = ratios["warm_cpu_ms_per_1k"]
    warm_verdict = "-" if warm_ratio is None else ("met" if warm_ratio < TARGET_RATIO else "NOT met")
    relative_ratio = ratios["warm_relative_cpu"]
    relative_verdict = "-" if relative_ratio is None else ("met" if relative_ratio < TARGET_RATIO else "NOT met")
    on_start, off_start = medians["on"]["startup_s"], medians["off"]["startup_s"]
    startup_delta = on_start - off_start if on_start is not None and off_start is not None else None
    startup_verdict = "-" if startup_delta is None else ("met" if startup_delta <= TARGET_STARTUP_S else "NOT met")
    print(
        f"steady sidecar CPU per 1,000 items on/off: {_fmt(cpu_ratio, '.3f')}x"
        f" (target < {TARGET_RATIO:.2f}x: {verdict}), past the first {warm} of the replies"
        f" {_fmt(warm_ratio, '.3f')}x ({warm_verdict}); items/s on/off: {_fmt(ratios['items_per_s'], '.3f')}x;"
        f" start-up on - off: {_fmt(startup_delta, '+.3f')} s (target <= {TARGET_STARTUP_S} s: {startup_verdict})"
    )
    spread = {m: _spread([r.warm_relative for r in per[m]]) for m in MODES}
    print(
        f"steady sidecar CPU relative to nats-server + backend, past the first {warm} of the replies, on/off:"
        f" {_fmt(relative_ratio, '.3f')}x (target < {TARGET_RATIO:.2f}x: {relative_verdict});"
        f" runs within a mode spread {_fmt(spread['off'], '.1%')} (off) and {_fmt(spread['on'], '.1%')} (on)"
        " (max/min - 1)"
    )
    by_tenth = _by_tenth(per) if args.tenths else None
    if by_tenth is not None:
        print(
            "relative on/off by tenth of the replies (medians; the first from the first reply): "
            + ", ".join(_fmt(v, ".3f") + "x" for v in by_tenth)
        )
    on_exports = sum(r.exports for r in per["on"])
    off_exports = sum(r.exports for r in per["off"])
    print(
        f"OTLP sink: {sink_total['exports']} exports, {sink_total['data_points']:,} data points,"
        f" {sink_total['spans']:,} spans, {sink_total['bytes']:,} bytes received in all"
        f" ({sink_total['bad']} undecodable);"
        f" on runs {on_exports}, off runs {off_exports} (each run's count includes its push at shutdown)"
    )
    problems = []
    if not args.no_metrics and (not on_exports or any(r.exports == 0 for r in per["on"])):
        problems.append("an 'on' run exported nothing: metrics were not on")
    if off_exports:
        problems.append("an 'off' run exported: metrics were not off")
    for index, r in enumerate(runs, start=1):
        flags = []
        if r.run.lost or r.run.duplicates or r.run.failures:
            flags.append(f"lost {r.run.lost}, dup {r.run.duplicates}, failed {r.run.failures}")
        if r.run.timed_out:
            flags.append("timed out")
        if r.run.killed or r.run.exit_code not in (0, None):
            flags.append(f"exit {r.run.exit_code}{' after SIGKILL' if r.run.killed else ''}")
        if flags:
            problems.append(f"run {index} {r.mode}: " + "; ".join(flags))
        # Reported, not failed on: with metrics on the null model logs once that it is not in the catalog.
        if r.run.log_problems:
            print(
                f"  note: run {index} {r.mode}: {r.run.log_problems} warning/error log lines,"
                f" e.g. {r.run.log_samples[0]}"
            )
    for line in problems:
        print(f"  warning: {line}")
    if not args.no_traces and any(r.spans == 0 for r in per["on"]):
        problems.append("an 'on' run exported no span: tracing was not on")
    return {
        "medians": medians,
        "ratios_on_over_off": ratios,
        "startup_on_minus_off_s": startup_delta,
        "target_met": verdict == "met",
        "warm_target_met": warm_verdict == "met",
        "warm_relative_target_met": relative_verdict == "met",
        "startup_target_met": startup_verdict == "met",
        "relative_on_over_off_by_tenth": by_tenth,
        "problems": problems,
    }


def _by_tenth(per: dict[str, list[ModeRun]]) -> list[float | None]:
    """On/off of the median relative CPU (`relative_cpu_by_tenth`) in each tenth of the replies."""
    shares = {m: [relative_cpu_by_tenth(r.run) for r in per[m]] for m in MODES}
    tenths = min((len(s) for m in MODES for s in shares[m]), default=0)
    out: list[float | None] = []
    for i in range(tenths):
        on, off = ([v for s in shares[m] if (v := s[i]) is not None] for m in ("on", "off"))
        out.append(_ratio(_median(on), _median(off)) if on and off else None)
    return out


# --- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=50_000, help="preloaded encode items per run (default 50000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of {off, on} runs, ABBA (default 3)")
    parser.add_argument("--work", choices=("gateway", "loadgen"), default="gateway", help="WorkItems' shape")
    add_pin_option(parser)
    parser.add_argument("--phase-timeout-s", type=float, default=120.0, help="give up on a run after this long")
    parser.add_argument(
        "--export-interval-ms",
        type=int,
        default=EXPORT_INTERVAL_MS,
        help=f"OTEL_METRIC_EXPORT_INTERVAL of the 'on' runs (default {EXPORT_INTERVAL_MS}; the sidecar's own is 5000)",
    )
    parser.add_argument("--no-traces", action="store_true", help="'on' runs export metrics only")
    parser.add_argument("--no-metrics", action="store_true", help="'on' runs export spans only")
    parser.add_argument(
        "--warm-fraction",
        type=float,
        default=0.25,
        help="also measure steady CPU past this fraction of the replies (default 0.25): the one-off SDK import is"
        " over by then",
    )
    parser.add_argument(
        "--tenths",
        action="store_true",
        help="also snapshot the CPU at each tenth of the replies and print on/off, relative, by tenth",
    )
    parser.add_argument("--json", metavar="PATH", help="write the raw numbers as JSON to PATH")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy every process log into DIR")
    parser.add_argument(
        "--no-precompile", action="store_true", help="leave sie_sidecar's bytecode unwritten (see e2e_throughput)"
    )
    parser.add_argument(
        "--sidecar-env",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="extra environment for the sidecar in both modes",
    )
    parser.add_argument("--sink", metavar="PORT", type=int, help=argparse.SUPPRESS)  # internal: be the OTLP sink
    args = parser.parse_args(argv)
    if args.items < 1 or args.rounds < 1:
        parser.error("--items and --rounds must be >= 1")
    args.sidecar_env = dict(args.sidecar_env)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sink is not None:
        serve_sink(args.sink)
        return 0
    pin_if_asked(args)
    result = run_with_children(lambda procs: run_bench(args, procs), args.json)
    return 0 if not result["summary"]["problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
