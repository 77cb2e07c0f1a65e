# SPDX-License-Identifier: Apache-2.0
# Sourced by the window profilers (perf_window.sh, sched_window.sh), which stand in for py-spy in
# `e2e_throughput.py --py-spy PATH`: the bench calls them with py-spy's arguments, then `--`, then
# the sidecar's command line. `run_sidecar_with WINDOW_FUNCTION "$@"` starts that command line,
# runs WINDOW_FUNCTION (which reads `$sidecar`, the sidecar's pid) beside it, passes SIGINT/SIGTERM
# on to the sidecar, and returns when the sidecar exits.
run_sidecar_with() {
    local window="$1"
    shift
    while [ "$1" != "--" ]; do shift; done
    shift
    "$@" &
    sidecar=$!
    "$window" &
    trap 'kill -INT $sidecar' INT TERM
    wait "$sidecar"
}
