# SPDX-License-Identifier: Apache-2.0
"""What the dispatcher records per batch with metrics on, through the real execution path: the
lane's instruments and the work-item ages are looked up inline (a method only on a miss), so a
catalog change must still move the very next batch to its new attributes, and a new registry must
still get the next records."""

from __future__ import annotations

from pathlib import Path

from sie_sidecar.telemetry import ModelCatalog, Registry
from sie_sidecar.telemetry.names import BATCH_SIZE, IPC_ACQUIRE_DURATION, IPC_REQUESTS, QUEUE_DURATION, WORK_ITEM_AGE

from .memory import MemoryMessage, MemoryPipeline, memory_pipeline
from .test_sequencing import _item, _msg

OTHER = (("operation", "encode"), ("model", "other"), ("profile", "other"))
NAMED = (("operation", "encode"), ("model", "org/model-a"), ("profile", "default"))
ENCODE = (("operation", "encode"),)


async def _serve(p: MemoryPipeline, prefix: str, n: int) -> list[MemoryMessage]:
    messages = [_msg(_item(f"{prefix}{i}")) for i in range(n)]
    p.send(messages)
    await p.until_settled(messages)
    assert all(m.final == [("ack", None)] for m in messages)
    return messages


async def test_a_catalog_change_moves_the_next_batch_to_the_new_attributes(tmp_path: Path) -> None:
    async with memory_pipeline(tmp_path) as p:
        registry = p.dispatcher.telemetry
        catalog = ModelCatalog([])  # org/model-a not in it yet: recorded as (other, other)
        p.dispatcher.record_with(catalog)
        await _serve(p, "a", 5)
        assert registry.value(BATCH_SIZE, OTHER) == 5  # the batch sizes' sum: every item, once
        assert registry.histogram(QUEUE_DURATION, OTHER).count == 5
        assert registry.value(BATCH_SIZE, NAMED) == 0

        catalog.extend("org/model-a")  # a live config commit
        await _serve(p, "b", 7)
        assert registry.value(BATCH_SIZE, NAMED) == 7  # the very next batches, under the new pair
        assert registry.histogram(QUEUE_DURATION, NAMED).count == 7
        assert registry.value(BATCH_SIZE, OTHER) == 5  # nothing more under the old one
        assert registry.histogram(WORK_ITEM_AGE, ENCODE).count == 12  # one age an item, by operation only


async def test_the_ipc_client_records_each_request_and_its_wait_for_a_slot(tmp_path: Path) -> None:
    """The request counter and the pool wait, read inline in the client: a second registry (the
    client's `telemetry` replaced) gets the next requests, none of them the first's."""
    async with memory_pipeline(tmp_path) as p:
        client = p.ipc
        first, second = Registry(), Registry()
        client.telemetry = first
        await _serve(p, "a", 3)
        run_batch_ok = (("method", "run_batch"), ("outcome", "success"))
        served = first.value(IPC_REQUESTS, run_batch_ok)
        assert served >= 1
        waited = (("transport", client.transport), ("outcome", "success"))
        assert first.histogram(IPC_ACQUIRE_DURATION, waited).count >= served
        client.telemetry = second
        await _serve(p, "b", 3)
        assert second.value(IPC_REQUESTS, run_batch_ok) >= 1
        assert second.histogram(IPC_ACQUIRE_DURATION, waited).count >= second.value(IPC_REQUESTS, run_batch_ok)
        assert first.value(IPC_REQUESTS, run_batch_ok) == served  # nothing more in the old registry
