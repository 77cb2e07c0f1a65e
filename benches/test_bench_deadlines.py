# SPDX-License-Identifier: Apache-2.0
"""What work deadlines (sidecar-behaviour §15.3) cost a batch: `deadline_split` runs once per group at
intake and once per batch before IPC, on every batch, whether or not its items carry a deadline. The
native call against its Python twin, on 64 gateway-shaped deliveries read in place, with and
without a `deadline`. `make bench` runs it; docs/benchmarks.md has the figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar import _native
from sie_sidecar._twins.deadlines import deadline_split as deadline_split_py
from sie_sidecar.pipeline.delivery import Delivery
from sie_sidecar.wire.workitem import decode_work_item

from .gateway_items import gateway_request_id, gateway_texts, gateway_work_item

N = 64
Split = Callable[[list[Any], float, float, float], Any]


class _Msg:
    subject, reply, data = "sie.work.x", "$JS.ACK.s.c.1.1.1.0.0", b""


def _deliveries(with_deadline: bool, lazy: bool) -> list[Any]:
    """64 gateway WorkItems: scanned deliveries read in place (native), or decoded ones (twin)."""
    now = time.time()
    payloads = []
    for i, text in enumerate(gateway_texts(N)):
        item = gateway_work_item(
            request_id=gateway_request_id(1, i),
            text=text,
            model="BAAI/bge-m3",
            pool="default",
            machine_profile="l4",
            router_id="gw",
            timestamp=now,
        )
        if with_deadline:
            item["deadline"] = now + 60.0
        payloads.append(msgpack.packb(item))
    if lazy:
        from tests.unit.test_lazy_delivery import _scanned

        return list(_scanned(payloads, make_run=True))
    msg: Any = _Msg()  # settlement is not exercised: only the item is read
    return [Delivery(msg=msg, worker_direct=False, item=decode_work_item(p)) for p in payloads]


@pytest.mark.parametrize("with_deadline", [False, True], ids=["v071-items", "with-deadline"])
@pytest.mark.parametrize(("impl", "split"), [("native", _native.deadline_split), ("twin", deadline_split_py)])
def test_deadline_split_64(benchmark: BenchmarkFixture, with_deadline: bool, impl: str, split: Split) -> None:
    ds = _deliveries(with_deadline, lazy=impl == "native")
    now = time.time()
    live, expired, usable, _, _, _ = benchmark(split, ds, now, 5.0, 180.0)
    assert live is ds and not expired and usable == (N if with_deadline else 0)
