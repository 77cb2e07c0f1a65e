# SPDX-License-Identifier: Apache-2.0
"""Local ingest against NATS ingest (issue 13), on the null backend, in one run.

Throughput: the same WorkItems (`--items`, `--items-per-request` per request) sent by the load
generator through NATS (nats-server + `sie-sidecar run`) and through the local socket
(`SIE_SIDECAR_INGEST=local`, `loadgen --local`), alternating NATS, local, NATS, local so drift falls
on both. Reported: items/s, p50/p99 request-to-result latency, and the sidecar's (and nats-server's)
CPU per 1,000 items.

Generation: `--streams` concurrent streams of `--tokens` tokens each, the backend stamping every
token with its publish time (`--gen-timestamps`); reported is the time from that publish to the chunk
arriving at the subscriber (a NATS inbox, or the local client), p50/p99, first chunks and all.

Run from the repository root: `python benches/local_ingest.py [--items 40000] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import nats
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.e2e_throughput import (
    Processes,
    _groups_cpu_s,
    _nats_server_binary,
    _wait_until,
    run_with_children,
)
from benches.null_backend import null_backend_argv
from sie_sidecar import wire
from sie_sidecar.local import Client
from sie_sidecar.local.client import request_body
from sie_sidecar.tools.localhost import free_port, port_open

MODEL = "null/vectors"
POOL, PROFILE, BUNDLE = "default", "cpu", "default"
WORKER = "bench-local-0"
_ids = itertools.count()


async def start_pipeline(procs: Processes, workdir: Path, mode: str, backend_args: list[str]) -> dict[str, Any]:
    """A null backend, a sidecar in `mode` (nats or local) and, for nats, a nats-server."""
    sock = str(workdir / "backend.sock")
    backend = procs.start(
        "backend",
        null_backend_argv(sock, MODEL, "--dim", "64", *backend_args),
        dict(os.environ),
        workdir / "backend.log",
    )
    await _wait_until(lambda: Path(sock).exists(), 60, "the backend", backend)
    env = {
        **os.environ,
        "SIE_POOL": POOL,
        "SIE_BUNDLE": BUNDLE,
        "SIE_MACHINE_PROFILE": PROFILE,
        "SIE_IPC_SOCKET_PATH": sock,
        "SIE_WORKER_ID": WORKER,
        "SIE_WORKER_PROBE_PORT": str(free_port()),
        "SIE_LOG_LEVEL": "warning",
    }
    out: dict[str, Any] = {"backend": backend}
    if mode == "nats":
        port = free_port()
        out["nats"] = procs.start(
            "nats-server",
            [_nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(workdir / "js")],
            dict(os.environ),
            workdir / "nats.log",
        )
        await _wait_until(lambda: port_open(port), 15, "nats-server", out["nats"])
        out["url"] = env["SIE_NATS_URL"] = f"nats://127.0.0.1:{port}"
    else:
        out["socket"] = env["SIE_SIDECAR_LOCAL_SOCKET"] = str(workdir / "ingest" / "local.sock")
        env["SIE_SIDECAR_INGEST"] = "local"
    sidecar = procs.start("sidecar", [sys.executable, "-m", "sie_sidecar", "run"], env, workdir / "sidecar.log")
    out["sidecar"] = sidecar
    if mode == "local":
        await _wait_until(lambda: Path(out["socket"]).exists(), 60, "the local socket", sidecar)
    return out


def _cpu(procs: Processes) -> dict[str, float]:
    by_group = _groups_cpu_s({c.proc.pid for c in procs.children})
    return {c.name: by_group[c.proc.pid] for c in procs.children}


async def _loadgen(procs: Processes, env: dict[str, Any], workdir: Path, name: str, args: list[str]) -> dict[str, Any]:
    """`sie-sidecar loadgen` as its own process (as a gateway or a colocated caller would be), its
    JSON summary back."""
    out = workdir / f"{name}.json"
    target = ["--local", env["socket"]] if "socket" in env else ["--nats-url", env["url"]]
    argv = [sys.executable, "-m", "sie_sidecar", "loadgen", *target, "--model", MODEL, "--no-progress"]
    child = procs.start(name, [*argv, *args, "--json", str(out)], dict(os.environ), workdir / f"{name}.log")
    code = await asyncio.get_running_loop().run_in_executor(None, child.proc.wait, 600)
    procs.children.remove(child)
    if not out.exists():
        raise RuntimeError(
            f"loadgen {name} exited with {code} and no summary:\n{(workdir / f'{name}.log').read_text()[-2000:]}"
        )
    return dict(json.loads(out.read_text()))


async def throughput(procs: Processes, mode: str, args: argparse.Namespace, rate: float = 0.0) -> dict[str, Any]:
    """One run as fast as possible (`rate` 0), or open-loop at `rate` items/s for `--latency-s`."""
    with tempfile.TemporaryDirectory(prefix=f"bench-local-{mode}-") as tmp:
        workdir = Path(tmp)
        env = await start_pipeline(procs, workdir, mode, [])
        shape = ["--items-per-request", str(args.items_per_request)]
        await _loadgen(procs, env, workdir, "warmup", ["--items", str(args.warmup), *shape])
        items = args.items if rate <= 0 else max(1000, round(rate * args.latency_s))
        before = _cpu(procs)
        paced = ["--rate", str(rate)] if rate > 0 else []
        summary = await _loadgen(procs, env, workdir, "load", ["--items", str(items), *shape, *paced])
        after = _cpu(procs)
        procs.stop_all()
    per_1k = {name: (after[name] - before[name]) * 1e6 / max(1, summary["results"]) for name in after}
    latency = summary["latency_ms"]
    return {
        "mode": mode,
        "rate": rate,
        "items": summary["items"],
        "results": summary["results"],
        "lost": summary["lost"],
        "errors": summary["errors_by_code"],
        "items_per_s": summary["items_per_s"],
        "p50_ms": latency["p50"],
        "p99_ms": latency["p99"],
        "cpu_ms_per_1k": per_1k,
    }


async def generation(procs: Processes, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """`args.streams` concurrent streams; latency of every chunk from the backend's publish stamp."""
    backend_args = ["--gen-timestamps", "--gen-token-delay-s", str(args.token_delay_s)]
    with tempfile.TemporaryDirectory(prefix=f"bench-gen-{mode}-") as tmp:
        env = await start_pipeline(procs, Path(tmp), mode, backend_args)
        first: list[float] = []
        every: list[float] = []

        def record(chunk: dict[str, Any]) -> bool:
            now = time.time_ns()
            text = chunk.get("text_delta") or ""
            if text.isdigit():
                latency = (now - int(text)) / 1e6
                every.append(latency)
                if chunk.get("seq") == 0:
                    first.append(latency)
            return bool(chunk.get("done"))

        if mode == "nats":
            await _generate_over_nats(env["url"], args, record)
        else:
            await _generate_locally(env["socket"], args, record)
        procs.stop_all()
    pct = lambda values, q: float(np.percentile(values, q)) if values else None  # noqa: E731
    return {
        "mode": mode,
        "streams": args.streams,
        "chunks": len(every),
        "first_p50_ms": pct(first, 50),
        "first_p99_ms": pct(first, 99),
        "all_p50_ms": pct(every, 50),
        "all_p99_ms": pct(every, 99),
    }


def _generate_item(request_id: str, tokens: int, reply: str) -> dict[str, Any]:
    return {
        "work_item_id": f"{request_id}.0",
        "request_id": request_id,
        "item_index": 0,
        "total_items": 1,
        "operation": "generate",
        "model_id": MODEL,
        "pool_name": POOL,
        "machine_profile": PROFILE,
        "router_id": "bench",
        "reply_subject": reply,
        "timestamp": time.time(),
        "generate": {"prompt": "stream", "max_new_tokens": tokens},
    }


async def _generate_over_nats(url: str, args: argparse.Namespace, record: Any) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    deadline = time.monotonic() + 60
    while True:  # the sidecar creates the stream
        try:
            await js.stream_info(wire.pool_stream_name(POOL))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    done = asyncio.Event()
    finished = 0

    async def on_chunk(msg: Any) -> None:
        nonlocal finished
        if record(msgpack.unpackb(msg.data, raw=False)):
            finished += 1
            if finished == args.streams:
                done.set()

    await nc.subscribe("_INBOX.bench.>", cb=on_chunk)
    await nc.flush()
    await asyncio.sleep(2.0)  # the sidecar is pulling
    subject = wire.pool_work_subject(POOL, PROFILE, BUNDLE, MODEL)
    for _ in range(args.streams):
        rid = f"gen-{next(_ids)}"
        item = _generate_item(rid, args.tokens, f"_INBOX.bench.{rid}")
        await js.publish(subject, msgpack.packb(item, use_bin_type=True))
    await asyncio.wait_for(done.wait(), 120)
    await nc.close()


async def _generate_locally(socket: str, args: argparse.Namespace, record: Any) -> None:
    clients = [await Client.connect(socket) for _ in range(4)]  # 64 streams per connection at most
    deadline = time.monotonic() + 60
    while True:
        try:
            await clients[0].ping()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)  # the first heartbeat has opened the gate

    async def one(client: Client) -> None:
        rid = f"gen-{next(_ids)}"
        items = [_generate_item(rid, args.tokens, "")]
        body = request_body(
            lane=f"{POOL}|{PROFILE}|{BUNDLE}",
            endpoint="generate",
            model=MODEL,
            request_id=rid,
            items=msgpack.packb(items, use_bin_type=True),
        )
        async for raw in client.generate(body):
            record(msgpack.unpackb(raw, raw=False))

    await asyncio.gather(*(one(clients[i % 4]) for i in range(args.streams)))
    for client in clients:
        await client.close()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


async def bench(procs: Processes, args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for mode in ("nats", "local") * args.rounds:
        result = await throughput(procs, mode, args)
        runs.append(result)
        cpu = result["cpu_ms_per_1k"]
        print(
            f"{mode:5s} {result['items_per_s']:9,.0f} items/s  p50 {_fmt(result['p50_ms'])} ms  "
            f"p99 {_fmt(result['p99_ms'])} ms  sidecar {cpu.get('sidecar', 0):.1f} ms/1k  "
            f"nats-server {cpu.get('nats-server', 0):.1f} ms/1k  lost {result['lost']}",
            flush=True,
        )
    by_mode = {m: [r for r in runs if r["mode"] == m] for m in ("nats", "local")}
    rate = 0.5 * min(statistics.median(r["items_per_s"] for r in by_mode[m]) for m in by_mode)
    paced = []
    for mode in ("nats", "local"):
        result = await throughput(procs, mode, args, rate=rate)
        paced.append(result)
        print(
            f"{mode:5s} at {rate:,.0f} items/s: p50 {_fmt(result['p50_ms'])} ms  p99 {_fmt(result['p99_ms'])} ms  "
            f"sidecar {result['cpu_ms_per_1k'].get('sidecar', 0):.1f} ms/1k  lost {result['lost']}",
            flush=True,
        )
    gens = []
    for mode in ("nats", "local"):
        result = await generation(procs, mode, args)
        gens.append(result)
        print(
            f"generation {mode:5s} {result['streams']} streams, {result['chunks']} chunks: first chunk p50 "
            f"{_fmt(result['first_p50_ms'])} p99 {_fmt(result['first_p99_ms'])} ms; every chunk p50 "
            f"{_fmt(result['all_p50_ms'])} p99 {_fmt(result['all_p99_ms'])} ms",
            flush=True,
        )
    ratio = statistics.median(r["items_per_s"] for r in by_mode["local"]) / max(
        1.0, statistics.median(r["items_per_s"] for r in by_mode["nats"])
    )
    print(f"local / nats items/s (medians): {ratio:.2f}x")
    return {"throughput": runs, "paced": paced, "generation": gens, "local_over_nats": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40_000)
    parser.add_argument("--items-per-request", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-s", type=float, default=8.0, help="length of the paced (half-load) runs")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--token-delay-s", type=float, default=0.02)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    result = run_with_children(lambda procs: bench(procs, args), args.json)
    lost = sum(r["lost"] for r in result["throughput"] + result["paced"])
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
