# SPDX-License-Identifier: Apache-2.0
"""RunBatch request bodies: the native writer (values spliced from each item's payload) against its
spec, the twin `_twins.requests.write_run_batch_body` (dicts + msgpack), for 64 loadgen WorkItems
decoded natively as the intake does. Per-item cost = the mean / 64."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar.tools.loadgen import LoadConfig, build_work_item
from sie_sidecar.wire.workitem import WorkItem, decode_work_item

ITEMS = 64


def _items(op: str) -> list[WorkItem]:
    config = LoadConfig(nats_url="nats://unused", operation=op)
    return [
        decode_work_item(
            msgpack.packb(
                build_work_item(
                    config, request_id=f"req-{i}", item_index=i, total_items=ITEMS, text_index=i, timestamp=1.7e9 + i
                )
            )
        )
        for i in range(ITEMS)
    ]


def _native(model: str, op: str, items: list[WorkItem], lora: str, cost: int, **kw: Any) -> bytes:
    from sie_sidecar._native import write_run_batch_body

    return write_run_batch_body(model, op, lora, cost, 0, items, kw.get("payload_fetch_ms"), None, None)


def _twin(model: str, op: str, items: list[WorkItem], lora: str, cost: int, **kw: Any) -> bytes:
    from sie_sidecar._twins.requests import write_run_batch_body

    return write_run_batch_body(model, op, lora, cost, 0, items, kw.get("payload_fetch_ms"), None, None)


WRITERS: dict[str, Callable[..., bytes]] = {"native": _native, "py": _twin}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("op", ["encode", "score", "extract"])
def test_run_batch_body_64_items(benchmark: BenchmarkFixture, op: str, writer: str) -> None:
    benchmark.group = f"ipc: RunBatch body of {ITEMS} {op} items"
    items, write = _items(op), WRITERS[writer]
    fetch = [0.0] * ITEMS
    body = benchmark(lambda: write("m", op, items, "", ITEMS, payload_fetch_ms=fetch))
    assert len(msgpack.unpackb(body)["items"]) == ITEMS
