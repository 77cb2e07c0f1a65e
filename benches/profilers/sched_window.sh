#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stand-in for py-spy in `e2e_throughput.py --py-spy PATH`, like perf_window.sh, but reading the
# kernel's own counters instead of sampling: from $WINDOW_START_S (default 3 s) after the sidecar's
# start to $WINDOW_S (default 4 s) later, each sidecar thread's CPU ticks, minor page faults,
# migrations between CPUs and context switches (voluntary and not), and nats-server's and the
# backend's CPU ticks as the reference, snapshotted into $SCHED_OUT (default /tmp/sched.window).
# sched_window_diff.py prints the differences per window, so runs of two settings can be compared
# without a profiler's own cost (docs/benchmarks.md, "Telemetry on: what it is not"):
#   SCHED_OUT=/tmp/sched.off.1 python benches/e2e_throughput.py --items 100000 --rounds 1 \
#       --half-load-s 0 --py-spy benches/profilers/sched_window.sh
#   python benches/profilers/sched_window_diff.py /tmp/sched.off.* /tmp/sched.on.*
set -uo pipefail
# shellcheck source=window_hook.sh
source "$(dirname "$0")/window_hook.sh"
out="${SCHED_OUT:-/tmp/sched.window}"
snapshot() {  # one line a thread: mark, role, id, utime, stime, minflt, migrations, switches, involuntary
    for task in /proc/"$sidecar"/task/*; do
        read -r -a stat < "$task/stat" || continue
        counters=$(awk '/^se.nr_migrations/{m=$3} /^nr_switches/{s=$3} /^nr_involuntary_switches/{i=$3}
            END{print m+0, s+0, i+0}' "$task/sched" 2>/dev/null)
        echo "$1 sidecar ${task##*/} ${stat[13]} ${stat[14]} ${stat[9]} ${counters:-0 0 0}"
    done
    for pid in $(pgrep -f "nats-server|sie_sidecar backend"); do
        read -r -a stat < "/proc/$pid/stat" || continue
        echo "$1 reference $pid ${stat[13]} ${stat[14]} ${stat[9]} 0 0 0"
    done
}
count_window() {
    sleep "${WINDOW_START_S:-3}"
    snapshot start > "$out"
    sleep "${WINDOW_S:-4}"
    snapshot end >> "$out"
}
run_sidecar_with count_window "$@"
