# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar loadgen --local SOCKET`: the same load as the NATS load generator, sent over the
local-ingest socket (sidecar-behaviour §11) with `sie_sidecar.local.Client`. Each request is one
`publish_work` whose answer carries every slot's WorkResult, so an item's latency is its request's
round trip. The summary is the NATS one (`LoadSummary`), so the two can be compared line by line."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgpack

from ..errors import LocalIngestError
from ..local import Client
from ..local.client import request_body
from .load_run import (
    LoadConfig,
    LoadgenError,
    LoadSummary,
    Run,
    arrival_offsets,
    build_work_item,
    progress_bar,
    recent_p50,
    request_plan,
    show_progress,
    summarize,
    tick,
)

#: Connections to the socket; each carries up to 80 requests at a time (the §11 budget).
CONNECTIONS = 4


async def generate_local_load(config: LoadConfig, socket: str, *, progress: bool = True) -> LoadSummary:
    """Send `config.items` WorkItems as `publish_work` requests and collect their results."""
    try:
        clients = [await Client.connect(socket) for _ in range(CONNECTIONS)]
    except OSError as exc:
        raise LoadgenError(f"cannot connect to the local-ingest socket {socket}: {exc}") from exc
    try:
        await _wait_until_served(clients[0], config.stream_wait_s)
        return await _drive(clients, config, socket, progress=progress)
    finally:
        for client in clients:
            await client.close()


async def _wait_until_served(client: Client, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.ping()
            return
        except (LocalIngestError, OSError) as exc:
            if time.monotonic() > deadline:
                raise LoadgenError(f"the local-ingest socket does not answer ping: {exc}") from exc
            await asyncio.sleep(0.1)


def _lane(config: LoadConfig) -> str:
    return f"{config.pool}|{config.machine_profile}|{config.bundle}"


async def _drive(clients: list[Client], config: LoadConfig, socket: str, *, progress: bool) -> LoadSummary:
    run = Run(config)
    plan = request_plan(config)
    offsets = arrival_offsets(plan, config.rate, config.arrival, config.seed)
    room = asyncio.Semaphore(config.max_in_flight)
    prefix = uuid.uuid4().hex[:12]
    packer = msgpack.Packer(use_bin_type=True)
    lane = _lane(config)
    tasks: set[asyncio.Task[None]] = set()
    bar = progress_bar(config.items) if progress else None

    async def one(request_number: int, request_id: str, items: list[dict[str, Any]]) -> None:
        body = request_body(
            lane=lane,
            endpoint=config.operation,
            model=config.model,
            bundle_config_hash=config.bundle_config_hash,
            request_id=request_id,
            items=packer.pack(items),
            timeout_ms=int(min(300.0, max(1.0, config.timeout_s)) * 1000),
        )
        try:
            results = await clients[request_number % len(clients)].publish_work(body)
        except (LocalIngestError, OSError) as exc:
            for item in items:
                run.record_publish_error(item["work_item_id"], f"{type(exc).__name__}: {exc}")
        else:
            now = time.perf_counter()
            for result in results:
                if isinstance(result, dict):
                    run.record_result(
                        str(result.get("work_item_id")),
                        bool(result.get("success")),
                        result.get("error_code"),
                        now,
                        chunked=False,
                    )
        finally:
            for _ in items:
                room.release()

    ticker = asyncio.create_task(tick(run, bar)) if bar is not None and not bar.disable else None
    items_before = 0
    start = 0.0
    try:
        for request_number, total in enumerate(plan):
            if offsets and run.first_publish is not None:
                delay = start + offsets[request_number] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            for _ in range(total):
                await room.acquire()
            request_id = f"{prefix}-{request_number:08d}"
            timestamp = time.time()
            items = [
                build_work_item(
                    config,
                    request_id=request_id,
                    item_index=index,
                    total_items=total,
                    text_index=items_before + index,
                    timestamp=timestamp,
                )
                for index in range(total)
            ]
            now = time.perf_counter()
            if run.first_publish is None:
                run.first_publish = start = now
            for item in items:
                run.sent_at[item["work_item_id"]] = now
                run.sent += 1
            task = asyncio.create_task(one(request_number, request_id, items))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            items_before += total
        run.publishing_done = True
        run.publish_end = time.perf_counter()
        if tasks:
            await asyncio.wait(set(tasks), timeout=config.timeout_s + 5)
    finally:
        if ticker is not None:
            ticker.cancel()
        for task in tasks:
            task.cancel()
    if bar is not None:
        show_progress(bar, run.results + run.publish_errors, recent_p50(run.latencies_ms))
        bar.close()  # draws the final count and ends the line
    lost = len(run.sent_at)
    summary = summarize(run, lost=lost, unsent=0)
    summary.subject = f"local:{socket}"
    return summary


__all__ = ["CONNECTIONS", "generate_local_load"]
