# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar demo --generate`: a streamed answer arriving token by token through the whole
pipeline (gateway-side NATS publish → JetStream → sidecar → ProcessGenerate on the reference backend
→ chunks on the reply inbox), with the time each token took from the backend's publish to here.

The backend's generation adapter draws its tokens from the MiniLM tokenizer's vocabulary (the
tokenizer.json the demo package already ships), deterministically from the prompt.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from .. import wire
from .demo import pipeline

MODEL = "demo/streamer"
PROMPT = "Tell me how a sidecar batches work for a GPU"
TOKENS = 24
TOKEN_DELAY_S = 0.08


def _tokenizer() -> str | None:
    try:
        from ..backend.minilm import find_model_dir

        return str(find_model_dir() / "tokenizer.json")
    except Exception:  # the model package is optional here: the fallback vocabulary streams too
        return None


async def _stream(url: str) -> tuple[list[dict[str, Any]], list[float]]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    deadline = time.monotonic() + 60
    while True:  # the sidecar creates the pool stream at start-up
        try:
            await js.stream_info(wire.pool_stream_name("default"))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    chunks: list[dict[str, Any]] = []
    gaps: list[float] = []
    done = asyncio.Event()
    last = time.perf_counter()

    async def on_chunk(msg: Any) -> None:
        nonlocal last
        chunk = msgpack.unpackb(msg.data, raw=False)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        chunks.append(chunk)
        sys.stdout.write(chunk.get("text_delta") or "")
        sys.stdout.flush()
        if chunk.get("done") or chunk.get("kind") == "nak":
            done.set()

    await nc.subscribe("_INBOX.demo.>", cb=on_chunk)
    await nc.flush()
    rid = f"gen-{os.getpid()}"
    item = {
        "work_item_id": f"{rid}.0",
        "request_id": rid,
        "item_index": 0,
        "total_items": 1,
        "operation": "generate",
        "model_id": MODEL,
        "pool_name": "default",
        "machine_profile": "cpu",
        "router_id": "demo",
        "reply_subject": f"_INBOX.demo.{rid}",
        "timestamp": time.time(),
        "generate": {"prompt": PROMPT, "max_new_tokens": TOKENS},
    }
    await asyncio.sleep(1.0)  # the first heartbeat opens the pull gate
    print(f"  prompt       {PROMPT!r}\n  answer       ", end="")
    last = time.perf_counter()
    await js.publish(wire.pool_work_subject("default", "cpu", "default", MODEL), msgpack.packb(item, use_bin_type=True))
    await asyncio.wait_for(done.wait(), 60)
    print()
    await nc.close()
    return chunks, gaps


def run_generate_demo() -> int:
    """Start nats-server, the reference backend (streaming) and the sidecar; stream one answer."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="sie-demo-gen-"))
    print("sie-sidecar demo --generate: nats-server + reference backend (token streamer) + sidecar")
    tokenizer = _tokenizer()
    backend = ["--preload", MODEL, "--gen-token-delay-s", str(TOKEN_DELAY_S)]
    if tokenizer is not None:
        backend += ["--gen-tokenizer", tokenizer]
    try:
        with pipeline("null", workdir, backend) as (url, _procs):
            vocabulary = "the MiniLM tokenizer's vocabulary" if tokenizer else "a fallback word list"
            print(f"  started      in {time.monotonic() - started:.1f} s; tokens come from {vocabulary}")
            chunks, gaps = asyncio.run(_stream(url))
    except Exception as exc:
        print(f"sie-sidecar demo --generate: FAILED: {exc!r}", file=sys.stderr)
        print(f"Logs kept in {workdir}", file=sys.stderr)
        return 1
    final = chunks[-1] if chunks else {}
    ok = bool(final.get("done")) and [c.get("seq") for c in chunks] == list(range(len(chunks)))
    first = gaps[0] if gaps else 0.0
    between = sorted(gaps[1:]) or [0.0]
    print(
        f"  stream       {len(chunks)} chunks (seq 0..{len(chunks) - 1}, one attempt), finish_reason"
        f" {final.get('finish_reason')!r}, usage {final.get('usage')}"
    )
    print(
        f"  timing       first token {first * 1000:.0f} ms after the publish; between tokens median"
        f" {between[len(between) // 2] * 1000:.0f} ms (the backend waits {TOKEN_DELAY_S * 1000:.0f} ms per token)"
    )
    shutil.rmtree(workdir, ignore_errors=True)
    print("\nAll processes stopped. " + ("OK" if ok else "FAILED: the stream was not complete"))
    return 0 if ok else 1


__all__ = ["run_generate_demo"]
