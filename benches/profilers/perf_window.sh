#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stand-in for py-spy in `e2e_throughput.py --py-spy PATH`: runs the sidecar as is and, from
# $WINDOW_START_S (default 1.4 s) after its start, samples the whole machine for $WINDOW_S (default
# 2 s) with `perf record -a -e cpu-clock` into $PERF_OUT (default /tmp/window.perf), and writes the
# pids there as "$PERF_OUT.pids" (the sidecar; nats-server and the backend as the reference: they do
# the same work whatever the sidecar's settings). perf_window_diff.py compares runs of two settings
# per symbol, each sidecar sample counted against the reference's samples of its own window, so the
# shared machine's speed cancels out (docs/benchmarks.md, "Telemetry on: what the ABBA measures"):
#   PERF_OUT=/tmp/win.off.1 python benches/e2e_throughput.py --items 100000 --rounds 1 \
#       --half-load-s 0 --py-spy benches/profilers/perf_window.sh
#   python benches/profilers/perf_window_diff.py --a /tmp/win.off.? --b /tmp/win.on.?
set -euo pipefail
# shellcheck source=window_hook.sh
source "$(dirname "$0")/window_hook.sh"
out="${PERF_OUT:-/tmp/window.perf}"
record_window() {
    sleep "${WINDOW_START_S:-1.4}"
    echo "sidecar $sidecar" > "$out.pids"
    for pid in $(pgrep -f "nats-server|sie_sidecar backend"); do echo "reference $pid" >> "$out.pids"; done
    perf record -q -a -F 4000 -e cpu-clock -o "$out" -- sleep "${WINDOW_S:-2}"
}
run_sidecar_with record_window "$@"
