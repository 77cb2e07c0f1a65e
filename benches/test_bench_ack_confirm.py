# SPDX-License-Identifier: Apache-2.0
"""What confirmed ACKs add to a 64-item batch on the sidecar's side: rewriting the framed buffer's
last ACK to carry the reply subject (one copy of the buffer). The rest is per batch too: a dict
entry until the answer, and the answer itself (one inbound message). The e2e figure this is a
share of: ~830 µs of sidecar CPU per 64-item batch (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar.bus.ack_confirm import ask_last_ack
from sie_sidecar.bus.outbound import frame_pubs

ITEMS = 64
RESULT_BYTES = 1_600  # a 384-d float32 embedding, msgpack-framed, with its WorkResult keys
SUBJECTS = [f"$JS.ACK.WORK_POOL_default.default_cpu_default.1.{i}.{i}.1796449776218876062.0" for i in range(ITEMS)]


def _batch_buffer() -> bytes:
    replies = [(f"_INBOX.gateway.{i}", b"x" * RESULT_BYTES) for i in range(ITEMS)]
    return frame_pubs([*replies, *((s, b"+ACK") for s in SUBJECTS)])


@pytest.mark.benchmark(group="ack-confirm")
def test_bench_ask_last_ack(benchmark: BenchmarkFixture) -> None:
    buffer = _batch_buffer()
    out = benchmark(ask_last_ack, buffer, SUBJECTS[-1], "_INBOX.confirm.123456")
    assert out is not None and len(out) == len(buffer) + len(" _INBOX.confirm.123456")
