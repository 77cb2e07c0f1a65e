#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stand-in for py-spy in `e2e_throughput.py --py-spy PATH`: runs the sidecar under callgrind
# (instruction counts of every thread, which do not depend on what else runs on the machine),
# writing $VG_OUT (default /tmp/sidecar.callgrind). Two runs of different --items give the per-item
# cost as the slope (docs/benchmarks.md, "Telemetry on, end to end in instructions"); callgrind
# runs the sidecar ~50x slower, so stretch export intervals 50x to keep exports per item:
#   VG_OUT=/tmp/off.4000 python benches/e2e_throughput.py --items 4000 --rounds 1 --half-load-s 0 \
#       --phase-timeout-s 600 --py-spy benches/profilers/callgrind_sidecar.sh
#   callgrind_annotate /tmp/off.4000 | head
# VG_OPTS adds callgrind options, e.g. VG_OPTS=--cache-sim=yes for simulated cache misses per function.
set -euo pipefail
while [ "$1" != "--" ]; do shift; done
shift
# shellcheck disable=SC2086 # VG_OPTS is a list of options
exec valgrind --tool=callgrind ${VG_OPTS:-} --callgrind-out-file="${VG_OUT:-/tmp/sidecar.callgrind}" "$@"
