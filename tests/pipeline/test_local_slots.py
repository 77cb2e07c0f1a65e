# SPDX-License-Identifier: Apache-2.0
"""Local ingest's slot accounting (sidecar-behaviour §11): a `publish_work` slot the pipeline settles
without an outcome ends with a typed `inference_error` "work item was dropped without an outcome",
and its neighbours are answered as usual. The local pipeline as the local runtime wires it (the
local source, the slot reply sink, the real dispatcher and scheduler) against the reference backend
over a real Unix socket.

Local ingest itself has no cancel subscriptions, so the drop is made by the one pipeline path that
settles a delivery without a reply for any ingest: a batch tombstone (worker-direct work, which local
work is) recorded on the dispatcher before the request arrives; intake then ACK-drops that slot."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import msgpack

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.errors import INFERENCE_ERROR
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.local import work_items
from sie_sidecar.local.client import request_body
from sie_sidecar.local.ingest import LocalPipeline
from sie_sidecar.local.request import Body
from sie_sidecar.local.source import LocalReplies, LocalSource, LocalWork
from sie_sidecar.pipeline.deadlines import DeadlineRules
from sie_sidecar.pipeline.delivery import Settler
from sie_sidecar.pipeline.dispatcher import Dispatcher, DispatchSettings
from sie_sidecar.pipeline.feed import feed
from sie_sidecar.sched.quantum import LatencyWindow, QuantumController

POOL, PROFILE, BUNDLE, MODEL = "default", "cpu", "default", "org/model-a"
LANE = f"{POOL}|{PROFILE}|{BUNDLE}"
_ids = itertools.count()


def _body(texts: list[str]) -> tuple[str, Body]:
    rid = f"slots-{next(_ids)}"
    items = work_items(
        rid,
        "encode",
        MODEL,
        [{"item": {"text": t}, "output_types": ["dense"]} for t in texts],
        pool_name=POOL,
        machine_profile=PROFILE,
    )
    raw = request_body(lane=LANE, endpoint="encode", model=MODEL, request_id=rid, items=msgpack.packb(items))
    return rid, Body.decode(raw)


def _results(work: LocalWork) -> list[dict[str, Any]]:
    """Every slot's WorkResult, decoded (the work is done: each slot has one)."""
    assert all(r is not None for r in work.results)
    return [msgpack.unpackb(r) for r in work.results if r is not None]


async def test_a_slot_settled_without_an_outcome_is_answered_inference_error(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    sock = str(tmp_path / "backend.sock")
    backend = BackendServer(adapter, sock, worker_id="backend-0")
    await backend.start()
    ipc = IpcClient(sock, pool_size=2, request_timeout_s=10.0)
    source, replies = LocalSource(max_outstanding=64), LocalReplies()
    settler = Settler(replies)  # as the local runtime: ACKs land on the slots, one call per batch
    quantum = QuantumController(LatencyWindow(), min_ms=1, max_ms=5, target_p50_ms=10)
    dispatcher = Dispatcher(
        dataclasses.replace(DispatchSettings(worker_id="w-local"), deadlines=DeadlineRules(judge=False)),
        ipc,
        replies,
        settler,
        quantum=quantum,
    )
    pipeline = LocalPipeline(
        source=source,
        replies=replies,
        generations=dispatcher.generations,
        worker_id="w-local",
        pool=POOL,
        machine_profile=PROFILE,
        bundle=BUNDLE,
    )
    stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.create_task(
        feed(source, dispatcher.handle, budget=64, inflight=2, stop=stop, tasks=tasks, quantum=quantum)
    )
    source.resume()  # the pull gate's first handshake
    try:
        _, served = _body(["one", "two"])
        served_work = pipeline.submit_work(served)
        dropped_rid, dropped = _body(["three", "four", "five"])
        dispatcher.batch_tombstones.record(dropped_rid)
        dropped_work = pipeline.submit_work(dropped)
        await asyncio.wait_for(asyncio.gather(served_work.done, dropped_work.done), 10)

        assert [r["success"] for r in _results(served_work)] == [True, True]
        for index, result in enumerate(_results(dropped_work)):
            assert result["work_item_id"] == f"{dropped_rid}.{index}" and result["item_index"] == index
            assert (result["success"], result["error_code"]) == (False, INFERENCE_ERROR)
            assert result["error"] == "work item was dropped without an outcome"
            assert result["worker_direct"] is True and result["worker_id"] == "w-local"
        assert settler.counts.dropped == 3 and settler.counts.acked == 2
        assert adapter.items == 2  # the dropped slots never reached the backend
        assert source.unsettled == 0
    finally:
        stop.set()
        source.stop()
        await asyncio.wait_for(loop, 10)
        await dispatcher.close_schedulers(1.0)
        await ipc.close()
        await backend.close()
