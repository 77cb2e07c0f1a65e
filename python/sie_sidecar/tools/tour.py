# SPDX-License-Identifier: Apache-2.0
"""A tour of the wire core with live figures: what `sie-sidecar demo` shows until the runtime lands.

Each step runs the compiled core and the pure-Python twin on the same input, checks that they
agree byte for byte, and prints the time of each, so the figures are ratios from one run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import msgpack
import numpy as np

from ..wire._switch import native_wire, twin
from ..wire.limits import MiB
from ..wire.types import WorkResult

_wire_py = twin("wire")
T = TypeVar("T")


def _best_of(fn: Callable[[], T], repeat: int) -> tuple[T, float]:
    """Run `fn` `repeat` times; return its last result and the best time in seconds."""
    best = float("inf")
    result = fn()
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def _fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds * 1e6:8.1f} µs"


def _row(label: str, native_s: float, twin_s: float, extra: str = "") -> None:
    print(f"  {label:<44} native {_fmt(native_s)}   twin {_fmt(twin_s)}   {twin_s / native_s:5.1f}x {extra}")


def _batch_response(items: int, dim: int) -> tuple[bytes, bytes]:
    """A RunBatch request body and the backend's whole response frame for `items` dense items."""
    rng = np.random.default_rng(1)
    requests = [
        {"op": "encode", "work_item_id": f"req.{i}", "request_id": "req", "item_index": i} for i in range(items)
    ]
    body = msgpack.packb(
        {"model_id": "BAAI/bge-small", "batch_id": 0, "lora_key": "", "total_cost": items, "items": requests}
    )
    outcomes = [
        {
            "work_item_id": f"req.{i}",
            "request_id": "req",
            "item_index": i,
            "disposition": "publish_and_ack",
            "result_msgpack": _wire_py.frame_dense(rng.standard_normal(dim).astype(np.float32)),
            "inference_ms": 2.5,
        }
        for i in range(items)
    ]
    envelope = msgpack.packb(
        {"version": 1, "request_id": "w-1", "ok": True, "body": {"outcomes": outcomes}, "error": None},
        use_bin_type=True,
    )
    return body, len(envelope).to_bytes(4, "big") + envelope


def _step_ipc(native: ModuleType, items: int, dim: int) -> None:
    body, frame = _batch_response(items, dim)
    print(f"\n1. IPC: a RunBatch of {items} items out, a {len(frame) / 1024:.0f} KiB response back")
    for mod in (native, _wire_py):
        assert mod.encode_request("RunBatch", "w-1", body) == native.encode_request("RunBatch", "w-1", body)
    _, n_enc = _best_of(lambda: native.encode_request("RunBatch", "w-1", body), 200)
    _, t_enc = _best_of(lambda: _wire_py.encode_request("RunBatch", "w-1", body), 200)
    _row("encode the request frame", n_enc, t_enc)
    reads = [frame[i : i + 65536] for i in range(0, len(frame), 65536)]

    def split_decode(mod: ModuleType) -> int:
        splitter = mod.FrameSplitter()
        bodies = [b for read in reads for b in splitter.feed(read)]
        outcome = mod.decode_batch_outcome(mod.response_body(mod.decode_response(bodies[0]), "w-1"))
        return len(outcome.outcomes)

    got, n_dec = _best_of(lambda: split_decode(native), 50)
    _, t_dec = _best_of(lambda: split_decode(_wire_py), 20)
    _row(f"split 64 KiB reads + decode {got} outcomes", n_dec, t_dec, f"({items / n_dec:,.0f} items/s)")


def _step_chunked(native: ModuleType, mib: int) -> None:
    payload = np.random.default_rng(2).bytes(mib * MiB)
    whole = msgpack.packb({"version": 1, "request_id": "w-2", "ok": True, "body": {"blob": payload}, "error": None})
    frames = native.encode_response_frames(whole, "w-2")
    assert frames == _wire_py.encode_response_frames(whole, "w-2")
    print(f"\n2. A {len(whole) / MiB:.1f} MiB response over IpcResponseChunkV1: {len(frames)} frames of ≤ 4 MiB")
    _, sha = _best_of(lambda: hashlib.sha256(whole).digest(), 3)

    budgets = {mod: mod.ResponseBudget() for mod in (native, _wire_py)}  # one per process, as in production

    def reassemble(mod: ModuleType, *, decode: bool = False) -> tuple[int, int]:
        budget = budgets[mod]
        asm = mod.IpcChunkAssembler("w-2", budget=budget)
        done = None
        for frame in frames:
            done = asm.feed(mod.decode_response(frame))
        assert done is not None
        held = budget.reserved
        with done:
            if decode:
                env = done.decode()
                assert env.ok and bytes(mod.decode_body(mod.response_body(env, "w-2"))["blob"][:16]) == payload[:16]
        assert budget.reserved == 0
        return held, len(done)

    held, size = reassemble(native, decode=True)
    reassemble(_wire_py, decode=True)
    _, n_t = _best_of(lambda: reassemble(native), 3)
    _, t_t = _best_of(lambda: reassemble(_wire_py), 3)
    _row("reassemble + verify SHA-256", n_t, t_t, f"({size / n_t / 1e9:.2f} GB/s)")
    print(f"  {'hashlib.sha256 alone (the floor)':<44} {_fmt(sha)}   native reaches {sha / n_t:.2f}x of it")
    print(f"  budget held until the typed decode is done: {held:,} bytes = 2 x {size:,} + 4096; then released")


def _step_outputs(native: ModuleType, items: int, dim: int) -> None:
    matrix = np.random.default_rng(3).standard_normal((items, dim)).astype(np.float32)
    print(f"\n3. Output framing (msgpack-numpy sentinels), {items} x {dim} float32")
    assert native.frame_dense_batch(matrix).to_list() == _wire_py.frame_dense_batch(matrix)
    _, n_d = _best_of(lambda: native.frame_dense_batch(matrix), 50)
    _, t_d = _best_of(lambda: _wire_py.frame_dense_batch(matrix), 10)
    _, copy = _best_of(matrix.tobytes, 50)
    _row("dense, whole batch", n_d, t_d, f"(one memcpy: {_fmt(copy).strip()}, {n_d / copy:.1f}x of it)")
    scores = np.linspace(0, 1, 64, dtype=np.float32)
    ids = [f"doc-{i}" for i in range(64)]
    assert native.frame_score(scores, ids) == _wire_py.frame_score(scores, ids)
    _, n_s = _best_of(lambda: native.frame_score(scores, ids), 200)
    _, t_s = _best_of(lambda: _wire_py.frame_score(scores, ids), 50)
    _row("score, 64 candidates sorted", n_s, t_s)
    sample = native.frame_dense(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    print(f"  dense [1, 2, 3] → {len(sample)} bytes: {sample.hex()[:48]}… (test vector TV-F4)")


def _step_reply(native: ModuleType) -> None:
    big = WorkResult("req.0", "req", 0, True, result_msgpack=b"\x07" * (3 * MiB), worker_id="w-1")
    plan = native.plan_reply(big, accepts_result_chunks=True, max_payload=MiB)
    twin = _wire_py.plan_reply(big, accepts_result_chunks=True, max_payload=MiB)
    assert plan.messages == twin.messages
    print(f"\n4. Reply of {plan.total_bytes / MiB:.1f} MiB against a 1 MiB NATS max_payload")
    largest = max(map(len, plan.messages))
    print(f"  mode {plan.mode}: {len(plan.messages)} ResultChunkV1 envelopes, largest {largest:,} bytes")
    asm = native.ResultChunkAssembler()
    done = [asm.feed(m) for m in reversed(plan.messages)]  # out of order on purpose
    item, whole = next(d for d in done if d is not None)
    assert whole == native.encode_work_result(big)
    print(f"  gateway side: reassembled {item} out of order, digest verified")
    refused = native.plan_reply(big, accepts_result_chunks=False, max_payload=MiB)
    print(f"  without the capability: {refused.mode} ({len(refused.messages[0])} bytes, PAYLOAD_TOO_LARGE)")


def _step_subjects(native: ModuleType) -> None:
    print("\n5. Subjects and tombstones (Cython)")
    subject = native.pool_work_subject("default", "l4", "default", "BAAI/bge-m3")
    print(f"  {subject} → model {native.model_from_subject(subject)!r}")
    tombstones = native.TombstoneSet()
    for i in range(100_000):
        tombstones.record("gw", f"req-{i}")
    check = tombstones.is_cancelled
    twin = _wire_py.TombstoneSet()
    for i in range(100_000):
        twin.record("gw", f"req-{i}")
    _, n_t = _best_of(lambda: [check("gw", "req-5") for _ in range(10_000)], 5)
    _, t_t = _best_of(lambda: [twin.is_cancelled("gw", "req-5") for _ in range(10_000)], 5)
    _row("is_cancelled, 10,000 lookups in a full set", n_t, t_t, f"({n_t / 10_000 * 1e9:.0f} ns each)")


def run_tour(*, items: int = 256, dim: int = 384, chunked_mib: int = 40) -> int:
    """Print the tour; returns a process exit code."""
    native = native_wire()
    print(f"sie-sidecar wire core: native (Rust + Cython, v{native.__version__}) against the pure-Python twin")
    _step_ipc(native, items, dim)
    _step_chunked(native, chunked_mib)
    _step_outputs(native, items, dim)
    _step_reply(native)
    _step_subjects(native)
    print("\nEvery step checked that both implementations produce the same bytes.")
    return 0
