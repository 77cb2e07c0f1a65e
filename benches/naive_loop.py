# SPDX-License-Identifier: Apache-2.0
"""The naive baseline the sidecar has to beat: a plain nats-py `fetch()` loop.

What most people would write first: `js.pull_subscribe` on the pool durable, `fetch(64)`, one RunBatch per fetch
to the backend, then per message one `publish` of the WorkResult and one `ack`. No long-lived pull, no
pipelining across fetches, no flush barrier (the publishes and ACKs share one connection, so their order on
the wire is kept anyway). `benches/e2e_throughput.py` runs it as a subprocess with the sidecar's environment,
so it uses the same topology (`ensure_topology` with the same spec), the same backend and the same wire code.

Run: `SIE_NATS_URL=... SIE_POOL=default SIE_BUNDLE=default SIE_MACHINE_PROFILE=cpu SIE_IPC_SOCKET_PATH=...
python benches/naive_loop.py` (until SIGTERM/SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import nats
from nats.errors import TimeoutError as NatsTimeoutError

from sie_sidecar import wire
from sie_sidecar.bus.topology import TopologySpec, ensure_topology
from sie_sidecar.config import ConfigError, Settings
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.ipc.requests import run_batch_body
from sie_sidecar.wire.types import WorkResult
from sie_sidecar.wire.workitem import decode_work_item

FETCH_BATCH = 64
FETCH_TIMEOUT_S = 5.0


def topology_spec(settings: Settings) -> TopologySpec:
    """The topology `sie-sidecar run` ensures for these settings: both consumers find the same one."""
    return TopologySpec.from_settings(settings)


async def run(settings: Settings) -> int:
    """Consume until SIGTERM/SIGINT: fetch, one RunBatch, then publish + ACK per message."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    nc = await nats.connect(servers=settings.nats_servers, name=f"naive-loop {settings.worker_id}")
    js = nc.jetstream()
    spec = topology_spec(settings)
    await ensure_topology(js, spec)
    sub = await js.pull_subscribe(spec.pool_filter, durable=spec.pool_durable, stream=spec.pool_stream)
    ipc = IpcClient(settings.ipc_socket_path, pool_size=1)
    ready: set[str] = set()
    processed = 0
    try:
        while not stop.is_set():
            fetch = asyncio.ensure_future(sub.fetch(FETCH_BATCH, timeout=FETCH_TIMEOUT_S))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not fetch.done():
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, NatsTimeoutError):
                    await fetch
                break
            try:
                msgs = fetch.result()
            except (TimeoutError, NatsTimeoutError):
                continue
            items = [decode_work_item(msg.data) for msg in msgs]
            model = items[0].model_id  # the naive loop assumes one model per fetch
            if model not in ready:
                await ipc.ensure_model_ready(model)
                ready.add(model)
            outcome = await ipc.run_batch(run_batch_body(model, "encode", items, "", len(items)))
            by_id = {o.work_item_id: o for o in outcome.outcomes}
            for msg, item in zip(msgs, items, strict=True):
                o = by_id[item.work_item_id]
                success = o.disposition == "publish_and_ack"
                result = WorkResult(
                    work_item_id=item.work_item_id,
                    request_id=item.request_id,
                    item_index=item.item_index,
                    success=success,
                    result_msgpack=o.result_msgpack if success else b"",
                    error=None if success else o.error,
                    error_code=None if success else o.error_code,
                    inference_ms=o.inference_ms,
                    worker_id=settings.worker_id,
                )
                await nc.publish(item.reply_subject, wire.encode_work_result(result))
                await msg.ack()
            processed += len(msgs)
    finally:
        await ipc.close()
        with contextlib.suppress(Exception):
            await nc.drain()
    print(f"naive loop: {processed} messages processed", file=sys.stderr)
    return 0


def main() -> int:
    try:
        settings = Settings.from_env(os.environ)
    except ConfigError as exc:
        print(f"naive_loop: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(settings))


if __name__ == "__main__":
    raise SystemExit(main())
