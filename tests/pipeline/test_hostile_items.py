# SPDX-License-Identifier: Apache-2.0
"""Hostile work items through the whole pipeline (issue 15), against the reference backend over its
real socket: every delivery is settled exactly once by the §4.1 table (an item the WorkItem decoder
refuses is NAKed with the base delay, row 3; a decodable one is answered and ACKed), nothing
crashes, and memory stays bounded.

Inputs: bytes that are not msgpack, msgpack that is not a map, every field of a valid item replaced
by each wrong type, text that is not UTF-8 where strings are expected, a 100,000-deep nesting in an
unknown field, a text near NATS's 1 MiB payload limit, and 10,000 distinct model ids."""

from __future__ import annotations

import logging
import resource
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar import wire
from sie_sidecar._native import decode_work_item
from sie_sidecar.errors import WorkItemError
from sie_sidecar.wire.workitem import WorkItem

from .memory import MemoryMessage, memory_pipeline
from .test_sequencing import BUNDLE, POOL, PROFILE, _item, _msg

BASE_NAK_MS = 700
WRONG_VALUES: list[Any] = [None, 7, -1, 1.5, True, b"\x00bin", "", {"a": 1}, [1, 2]]


def _decodable(data: bytes) -> bool:
    try:
        decode_work_item(data, WorkItem)
    except WorkItemError:
        return False
    return True


def _expect_settled_by_the_table(msgs: list[MemoryMessage]) -> None:
    for m in msgs:
        assert len(m.final) == 1, (m.data[:80], m.final)  # exactly one final settlement
        if not _decodable(m.data):
            assert m.final == [("nak", BASE_NAK_MS / 1000)], (m.data[:80], m.final)
        else:
            assert m.final[0][0] in ("ack", "nak"), m.final


def _deeply_nested(depth: int) -> bytes:
    """A valid item with one more key, `deep`, whose value is `depth` nested one-element arrays
    (written by hand: msgpack's own packer stops at 512 levels)."""
    item = _item("deep")
    packed = bytes(msgpack.packb(item))
    assert packed[0] == 0xDE  # map16 header: 18 keys
    count = int.from_bytes(packed[1:3], "big") + 1
    return b"\xde" + count.to_bytes(2, "big") + packed[3:] + b"\xa4deep" + b"\x91" * depth + b"\xc0"


def _not_utf8(field_value: str) -> bytes:
    """A valid item whose `field_value` string (a unique marker) has its last byte made 0xFF."""
    packed = bytes(msgpack.packb(_item("u8", request_id="u8", work_item_id="u8.0", item={"text": field_value})))
    raw = field_value.encode()
    return packed.replace(raw, raw[:-1] + b"\xff")


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_malformed_items_are_settled_by_the_table(tmp_path: Path) -> None:
    base = _item("base")
    wrong_typed = [
        _msg(base, data=msgpack.packb({**base, key: value, "work_item_id": f"w{k}-{v}.0", "request_id": f"w{k}-{v}"}))
        for k, key in enumerate(base)
        for v, value in enumerate(WRONG_VALUES)
        if key not in ("work_item_id", "request_id")
    ]
    hostile = [
        _msg(base, data=b"\xc1 not msgpack"),
        _msg(base, data=b""),
        _msg(base, data=msgpack.packb([1, 2, 3])),
        _msg(base, data=msgpack.packb({"work_item_id": 1})),
        _msg(base, data=_deeply_nested(100_000)),
        _msg(base, data=_not_utf8("marker-text")),
        *wrong_typed,
    ]
    async with memory_pipeline(tmp_path, nak_delay_ms=BASE_NAK_MS) as p:
        rss_before = _max_rss_mb()
        p.send(hostile)
        await p.until_settled(hostile, timeout=60)
        _expect_settled_by_the_table(hostile)
        assert sum(not _decodable(m.data) for m in hostile) >= 5  # the table's row 3 was exercised
        good = [_msg(_item(f"ok{i}")) for i in range(4)]
        p.send(good)
        await p.until_settled(good)
        assert all(m.final == [("ack", None)] for m in good)
        assert _max_rss_mb() - rss_before < 128


async def test_a_text_near_the_nats_payload_limit_is_answered(tmp_path: Path) -> None:
    big = _msg(_item("big", item={"text": "word " * 190_000}))  # ~950 KB, under NATS's 1 MiB
    assert 900_000 < len(big.data) < 1024 * 1024
    async with memory_pipeline(tmp_path, nak_delay_ms=BASE_NAK_MS) as p:
        p.send([big])
        await p.until_settled([big], timeout=60)
        assert len(big.final) == 1 and big.final[0][0] in ("ack", "nak")


async def test_ten_thousand_distinct_models(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """10,000 cold models at once: each first EnsureModelReady answers loading, so the groups park
    until the parked-item capacity is spent and the rest are NAKed with the base delay (§4.2);
    every delivery settles once, and the capacity warning is one line, not one per model."""
    msgs = [
        _msg(_item(f"m{i}"), subject=wire.pool_work_subject(POOL, PROFILE, BUNDLE, f"org/model-{i}"))
        for i in range(10_000)
    ]
    async with memory_pipeline(tmp_path, nak_delay_ms=BASE_NAK_MS) as p:
        rss_before = _max_rss_mb()
        with caplog.at_level(logging.WARNING, logger="sie_sidecar.pipeline.dispatcher"):
            p.send(msgs)
            await p.until_settled(msgs, timeout=240)
        finals = [m.final for m in msgs]
        assert all(f in ([("ack", None)], [("nak", BASE_NAK_MS / 1000)]) for f in finals)
        acked = sum(f == [("ack", None)] for f in finals)
        assert acked > 0 and len(p.sink.replies) == acked  # the parked ones were served once loaded
        capacity_lines = [r for r in caplog.records if "parked-item capacity" in r.getMessage()]
        assert 1 <= len(capacity_lines) <= 2
        grown = _max_rss_mb() - rss_before
        assert grown < 512, f"{grown:.0f} MB for 10,000 model lanes"
