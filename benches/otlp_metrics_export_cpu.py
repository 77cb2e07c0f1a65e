#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CPU of one whole OTLP/HTTP metrics export as the sidecar's export thread runs it (snapshot,
bridge, encoding, the SDK exporter's POST to a real receiver on loopback and its answer), for a
registry of 42 series, with the compiled encoder (what ships) and with the SDK's (`--sdk`).

    python benches/otlp_metrics_export_cpu.py [--sdk] [--exports 200]

The receiver (`benches/otlp_sink.py`) runs in its own process, so its decoding is not counted.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

from sie_sidecar.otel.export import _build_metrics
from sie_sidecar.otel.metrics import MetricsSender
from sie_sidecar.otel.target import Target
from sie_sidecar.telemetry import Registry
from sie_sidecar.telemetry.registry import DURATION_BOUNDS_S
from sie_sidecar.tools.localhost import free_port


def wait_for_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def registry() -> Registry:
    """42 series as a running sidecar holds them: 20 histograms, 15 counters, 7 gauges."""
    r = Registry()
    for i in range(20):
        attrs = (("operation", "encode"), ("model", f"org/model-{i % 3}"), ("profile", "default"))
        h = r.histogram(f"sie.worker.h{i}", attrs, DURATION_BOUNDS_S)
        for v in range(100):
            h.record(v * 0.001)
    for i in range(15):
        r.counter(f"sie.worker.c{i}", (("outcome", "success"), ("reason", "none"))).add(5)
    for i in range(7):
        r.gauge(f"sie.worker.g{i}", ()).set(3)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdk", action="store_true", help="encode with the SDK's encoder instead")
    parser.add_argument("--exports", type=int, default=200)
    args = parser.parse_args()
    port = free_port()
    sink = subprocess.Popen([sys.executable, str(Path(__file__).with_name("otlp_sink.py")), str(port)])
    try:
        wait_for_port(port, 10.0)
        target = Target(f"http://127.0.0.1:{port}/v1/metrics", "http/protobuf")
        sender = _build_metrics(
            target, resource={"service.name": "bench"}, lane="l4", version="0", temporality="cumulative", start_ns=1
        )
        if args.sdk:
            sender = MetricsSender(sender.bridge, sender.exporter)
            sender.bridge.request_of = lambda shapes: None  # type: ignore[method-assign]
        r = registry()
        for _ in range(10):  # warm: the connection, the first encodings
            assert sender.send(r.snapshot(), time.time_ns())
        started = time.process_time()
        for _ in range(args.exports):
            assert sender.send(r.snapshot(), time.time_ns())
        each_ms = (time.process_time() - started) / args.exports * 1000
        encoder = "the SDK's encoder" if args.sdk else "the compiled encoder"
        print(f"one metrics export of 42 series, {encoder}: {each_ms:.2f} ms of CPU")
        sender.shutdown()
    finally:
        sink.terminate()
        sink.wait(10)


if __name__ == "__main__":
    main()
