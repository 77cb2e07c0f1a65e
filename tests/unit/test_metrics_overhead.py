# SPDX-License-Identifier: Apache-2.0
"""The telemetry ABBA's measures: the sidecar's CPU relative to the reference processes, and the OTLP
sink that decodes between runs (a real sink process, real HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from benches import e2e_throughput as e2e
from benches.e2e_throughput import REFERENCE, ThroughputRun, relative_cpu, relative_cpu_by_tenth
from benches.metrics_overhead import _spread, sink_stats
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sie_sidecar.tools.localhost import free_port, port_open

BENCH = Path(__file__).resolve().parents[2] / "benches" / "metrics_overhead.py"


def run_with(cpu_s: dict[str, float], warm: dict[str, float] | None) -> ThroughputRun:
    return ThroughputRun(
        contender="sidecar",
        round=1,
        items=1000,
        preload_s=0.0,
        elapsed_s=1.0,
        items_per_s=1000.0,
        startup_s=0.1,
        steady_items_per_s=1000.0,
        replies=1000,
        lost=0,
        duplicates=0,
        failures=0,
        unexpected=0,
        timed_out=False,
        stream_left=0,
        ack_pending=0,
        redelivered=0,
        cpu_s=cpu_s,
        cpu_first_s=None,
        first_replies=1,
        exit_code=0,
        stop_s=0.1,
        killed=False,
        log_problems=0,
        cpu_warm_s=warm,
        warm_replies=250,
    )


def test_relative_cpu_is_the_sidecars_share_of_the_reference_processes_over_the_window() -> None:
    assert REFERENCE == ("nats-server", "backend")
    run = run_with(
        {"sidecar": 2.0, "nats-server": 3.0, "backend": 4.0, "bench": 9.0},
        {"sidecar": 0.5, "nats-server": 1.0, "backend": 1.0, "bench": 1.0},
    )
    # (2.0 - 0.5) / ((3.0 - 1.0) + (4.0 - 1.0)): the bench's own CPU is not the yardstick
    assert relative_cpu(run, run.cpu_warm_s) == pytest.approx(0.3)
    assert relative_cpu(run, {}) == pytest.approx(2.0 / 7.0)


def test_relative_cpu_is_none_without_a_window_or_a_reference() -> None:
    run = run_with({"sidecar": 1.0, "nats-server": 1.0, "backend": 1.0}, None)
    assert relative_cpu(run, run.cpu_warm_s) is None
    idle = run_with({"sidecar": 1.0, "nats-server": 1.0, "backend": 1.0}, {"nats-server": 1.0, "backend": 1.0})
    assert relative_cpu(idle, idle.cpu_warm_s) is None


def test_relative_cpu_by_tenth_is_each_tenths_own_share() -> None:
    """A one-off cost in one tenth shows there and nowhere else; a tenth without reference CPU is None."""
    run = run_with({}, None)
    run.cpu_first_s = {"sidecar": 1.0, "nats-server": 1.0, "backend": 1.0}
    run.cpu_tenths = [
        (100, {"sidecar": 3.0, "nats-server": 2.0, "backend": 2.0}),  # +2 over +2: 1.0 (an import, say)
        (200, {"sidecar": 3.5, "nats-server": 2.5, "backend": 2.5}),  # +0.5 over +1: 0.5
        (300, {"sidecar": 3.6, "nats-server": 2.5, "backend": 2.5}),  # no reference CPU
    ]
    assert relative_cpu_by_tenth(run) == [pytest.approx(1.0), pytest.approx(0.5), None]
    run.cpu_first_s = None
    assert relative_cpu_by_tenth(run) == [pytest.approx(0.5), None]


def test_spread_is_max_over_min() -> None:
    assert _spread([0.35, None, 0.36, 0.378]) == pytest.approx(0.378 / 0.35 - 1)
    assert _spread([None]) is None


def _post(port: int, path: str, body: bytes) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/x-protobuf"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.status)


def test_the_sink_keeps_bodies_and_decodes_them_when_asked_for_its_counts() -> None:
    spans = ExportTraceServiceRequest()
    scope = spans.resource_spans.add().scope_spans.add()
    scope.spans.extend([Span(name="a"), Span(name="b"), Span(name="c")])
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.CopyFrom(Metric(name="m"))
    metric.sum.data_points.extend([NumberDataPoint(as_int=1), NumberDataPoint(as_int=2)])
    port = free_port()
    sink = subprocess.Popen([sys.executable, str(BENCH), "--sink", str(port)])
    try:
        deadline = time.monotonic() + 30
        while not port_open(port):
            assert sink.poll() is None, "the sink exited"
            assert time.monotonic() < deadline, "the sink did not open its port"
            time.sleep(0.05)
        assert _post(port, "/v1/traces", spans.SerializeToString()) == 200
        assert _post(port, "/v1/metrics", metrics.SerializeToString()) == 200
        assert _post(port, "/v1/metrics", b"\xff\xff not protobuf") == 200  # refused only when counted
        stats = sink_stats(port)
        assert stats["spans"] == 3 and stats["span_exports"] == 1
        assert stats["data_points"] == 2 and stats["exports"] == 1
        assert stats["bad"] == 1
        assert stats["bytes"] == len(spans.SerializeToString()) + len(metrics.SerializeToString())
        assert sink_stats(port) == stats  # decoded once
    finally:
        sink.terminate()
        sink.wait(timeout=10)


def test_the_paired_bench_reads_a_process_group_s_cpu_in_nanoseconds_over_all_its_threads() -> None:
    """`paired_ab.group_cpu_ns`: a child spinning in two live threads is counted whole, to well
    under a clock tick's 10 ms, and a group that does not exist reads 0. (A thread that has exited
    is not counted: the bench reads the sidecars, whose threads live as long as they do.)

    The child says when both threads have spun. Waiting instead for the reading to pass 0.3 s raced:
    the interpreter's start counts too, so a thread could still be spinning when the test read the
    "still" value (CI, 2026-12-07: it grew 20 ms in the 0.1 s after)."""
    from benches.paired_ab import group_cpu_ns

    spin = (
        "import threading, time\n"
        "spun = threading.Barrier(3)\n"
        "def burn():\n"
        "    end = time.thread_time() + 0.15\n"
        "    while time.thread_time() < end: pass\n"
        "    spun.wait()\n"
        "    time.sleep(30)\n"
        "for _ in range(2): threading.Thread(target=burn, daemon=True).start()\n"
        "spun.wait(); print('spun', flush=True); time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"
        used = group_cpu_ns(child.pid)
        assert 300_000_000 <= used < 600_000_000  # both threads' 0.15 s, plus the interpreter's start
        time.sleep(0.1)
        assert group_cpu_ns(child.pid) - used < 5_000_000  # asleep: the reading holds still
    finally:
        child.kill()
        child.communicate()  # reaps it and closes its pipe
    assert group_cpu_ns(child.pid) == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")
def test_pinning_gives_the_sidecar_the_last_cpu_and_every_other_process_the_rest(tmp_path: Path) -> None:
    mine = os.sched_getaffinity(0)
    procs = e2e.Processes()
    # A thread the child starts: every thread of the sidecar (its export threads) runs on its CPU.
    code = "import os, threading; threading.Thread(target=lambda: print(sorted(os.sched_getaffinity(0)))).start()"
    try:
        sidecar, rest = e2e.pin_sidecar()
        assert sidecar == {max(mine)}
        assert rest == mine - sidecar
        assert os.sched_getaffinity(0) == rest  # the bench itself is one of the others
        for name in ("sidecar", "nats-server"):
            child = procs.start(name, [sys.executable, "-c", code], dict(os.environ), tmp_path / f"{name}.log")
            assert child.proc.wait(timeout=30) == 0
        assert (tmp_path / "sidecar.log").read_text().strip() == str(sorted(sidecar))
        assert (tmp_path / "nats-server.log").read_text().strip() == str(sorted(rest))
    finally:
        e2e._PINNED.clear()
        os.sched_setaffinity(0, mine)
        procs.stop_all()
