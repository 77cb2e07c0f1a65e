#!/bin/bash
# The end-to-end bench on two trees, interleaved (after, before, after, before; then both at the
# defaults), so that drift on a noisy machine falls on both alike. BASE is a checkout of the earlier
# commit with its own extension built (e.g. `git worktree add ../base REV` and copy or build its .so).
# Usage: BASE=../base benches/before_after.sh        (logs and JSON in ${OUT:-/tmp})
set -u
cd "$(dirname "$0")/.."
: "${BASE:?set BASE to the earlier tree}"
OUT=${OUT:-/tmp}
TP=(--sidecar-env SIE_PULL_LOOP_MAX_OUTSTANDING=256 --sidecar-env SIE_BATCHER_MAX_BATCH_REQUESTS=64)
run() { # tree label [extra args]
  local tree=$1 label=$2; shift 2
  PYTHONPATH="$tree/python" timeout 300 .venv/bin/python "$tree/benches/e2e_throughput.py" --items 20000 --rounds 2 \
    --half-load-s 8 --json "$OUT/e2e-$label.json" "$@" > "$OUT/e2e-$label.log" 2>&1
  echo "== $label"; grep -E "ratio sidecar|half-load p99|  naive |  sidecar |CPUs busy|CPU before|steady CPU" "$OUT/e2e-$label.log"
}
run "$PWD" after1 "${TP[@]}"
run "$BASE" before1 "${TP[@]}"
run "$PWD" after2 "${TP[@]}"
run "$BASE" before2 "${TP[@]}"
run "$PWD" after-defaults
run "$BASE" before-defaults
