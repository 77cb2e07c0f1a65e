#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stand-in for py-spy in `e2e_throughput.py --py-spy PATH`: runs the sidecar under `perf record`
# (4 kHz, call graphs) instead, writing $PERF_OUT (default /tmp/sidecar.perf). Then:
#   perf report -i /tmp/sidecar.perf --no-children --sort dso -g none
set -euo pipefail
while [ "$1" != "--" ]; do shift; done
shift
exec perf record -F 4000 -g -o "${PERF_OUT:-/tmp/sidecar.perf}" -- "$@"
