# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar loadgen` against a real nats-server and an in-test responder (no sidecar needed).

The responder plays the sidecar's part just far enough to check the gateway side: it pulls the
WorkItems from the pool stream, answers with WorkResults (single messages, ResultChunkV1 transfers
out of order, legacy arrays, errors, duplicates, garbage or nothing) and ACKs.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import io
import itertools
import json
import os
import re
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, RetentionPolicy, StreamConfig

from sie_sidecar import wire
from sie_sidecar.tools.load_run import LATE_FACTOR, LATE_SLACK_S, STALL_ITEMS, STALL_MIN_S
from sie_sidecar.tools.loadgen import (
    DEFAULT_TEXTS,
    LoadConfig,
    LoadgenError,
    add_loadgen_arguments,
    arrival_offsets,
    config_from_args,
    deadlines,
    generate_load,
    progress_bar,
    run_loadgen,
    show_progress,
    varied_texts,
)
from sie_sidecar.tools.localhost import find_nats_server, free_port
from sie_sidecar.wire.types import WorkResult

pytestmark = pytest.mark.timeout(60)

POOL = "default"
GATEWAY_KEYS = [  # wire-protocol §7.2, v0.7.1 rows written by the gateway, admission_pool omitted (empty)
    "work_item_id",
    "request_id",
    "item_index",
    "total_items",
    "operation",
    "model_id",
    "profile_id",
    "engine",
    "pool_name",
    "machine_profile",
    "item",
    "payload_ref",
    "output_types",
    "instruction",
    "is_query",
    "options",
    "query_item",
    "query_payload_ref",
    "score_items",
    "labels",
    "output_schema",
    "bundle_config_hash",
    "router_id",
    "reply_subject",
    "timestamp",
    "accepts_result_chunks",
]
TV_W1_KEYS: dict[str, type] = {  # the nine keys the v0.7.1 sidecar requires (TV-W1)
    "work_item_id": str,
    "request_id": str,
    "item_index": int,
    "total_items": int,
    "operation": str,
    "model_id": str,
    "pool_name": str,
    "machine_profile": str,
    "reply_subject": str,
}


def _nats_server_binary() -> str:
    found = find_nats_server()
    if found is None:
        pytest.skip("nats-server binary not available")
    return found


@pytest.fixture
def _loadgen_nats(tmp_path: Path) -> Iterator[str]:
    """A private JetStream-enabled nats-server on a free port, killed at teardown."""
    port = free_port()
    proc = subprocess.Popen(
        [_nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("nats-server did not start") from None
                time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
async def _loadgen_nc(_loadgen_nats: str) -> AsyncIterator[Client]:
    """A client on the private server (named apart from the shared conftest's `nc`)."""
    client = await nats.connect(_loadgen_nats)
    try:
        yield client
    finally:
        await client.close()


async def _create_pool_stream(nc: Client, **limits: Any) -> None:
    """What the sidecar would do at startup: WORK_POOL_default, WorkQueue retention."""
    await nc.jetstream().add_stream(
        StreamConfig(
            name=wire.pool_stream_name(POOL),
            subjects=wire.pool_stream_subjects(POOL),
            retention=RetentionPolicy.WORK_QUEUE,
            discard=DiscardPolicy.NEW,
            **limits,
        )
    )


# --- the responder ---------------------------------------------------------------------------------

Policy = Callable[[dict[str, Any]], str]


def _request_number(item: dict[str, Any]) -> int:
    return int(str(item["request_id"]).rsplit("-", 1)[1])


def _result(item: dict[str, Any], *, size: int = 16, success: bool = True, code: str | None = None) -> WorkResult:
    return WorkResult(
        work_item_id=item["work_item_id"],
        request_id=item["request_id"],
        item_index=item["item_index"],
        success=success,
        result_msgpack=bytes(i % 251 for i in range(size)) if success else b"",
        error=None if success else "boom",
        error_code=code,
        inference_ms=1.0,
        queue_ms=0.5,
        processing_ms=0.0,
        worker_id="responder",
    )


def _chunked(item: dict[str, Any]) -> list[bytes]:
    plan = wire.plan_reply(_result(item, size=3000), accepts_result_chunks=True, max_payload=1024)
    assert plan.mode == "chunked" and len(plan.messages) >= 3
    return plan.messages


def replies_for(item: dict[str, Any], mode: str) -> list[bytes]:
    """The inbox messages the responder publishes for one WorkItem in a given mode."""
    if mode == "single":
        return [wire.encode_work_result(_result(item))]
    if mode == "chunked":  # out of order, with a byte-identical duplicate
        chunks = _chunked(item)
        return [*reversed(chunks), chunks[0]]
    if mode == "corrupt":  # a different payload for an index already received, then the rest (stale)
        chunks = _chunked(item)
        bad = bytearray(chunks[0])
        bad[-1] ^= 0xFF
        return [chunks[0], bytes(bad), *chunks[1:]]
    if mode == "unattributable":  # a result_chunk_v1 envelope without a usable identity
        return [msgpack.packb({"kind": "result_chunk_v1", "work_item_id": 7})]
    if mode == "legacy":  # array-shaped WorkResult, fields by position (§8.2)
        return [msgpack.packb([item["work_item_id"], item["request_id"], item["item_index"], True, b"\x90"])]
    if mode == "error":
        return [wire.encode_work_result(_result(item, success=False, code="inference_error"))]
    if mode == "twice":
        return [wire.encode_work_result(_result(item))] * 2
    if mode == "garbage_then_single":
        return [b"\xc1not msgpack", wire.encode_work_result(_result(item))]
    if mode == "none":
        return []
    raise AssertionError(mode)


class Responder:
    """A stand-in sidecar: pull, reply per policy, flush, then ACK (the §9.3 order).

    It stops on an event, checked between fetches (each at most `FETCH_S`), not by cancelling its
    task: on Python 3.11 a cancel that lands as a message arrives is swallowed inside nats-py's
    `next_msg` (its `asyncio.wait_for` returns the message instead), and a loop that was only ever
    stopped by cancellation then runs until the test times out."""

    FETCH_S = 0.2

    def __init__(self, nc: Client, policy: Policy | None = None, *, late_s: float = 0.0) -> None:
        self.nc = nc
        self.policy: Policy = policy or (lambda item: "single")
        self.late_s = late_s  # how long a "late" item's single reply is held back
        self.received: list[tuple[str, bytes]] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._later: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Responder:
        psub = await self.nc.jetstream().pull_subscribe(
            f"sie.work.{POOL}.*.*.*", durable="responder", stream=wire.pool_stream_name(POOL)
        )
        self._task = asyncio.create_task(self._serve(psub))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._stop.set()
        await asyncio.wait_for(self._task, timeout=10 * self.FETCH_S + 5)
        for task in self._later:
            task.cancel()
        await asyncio.gather(*self._later, return_exceptions=True)

    async def _reply_later(self, item: dict[str, Any], msg: Any) -> None:
        await asyncio.sleep(self.late_s)
        await self.nc.publish(item["reply_subject"], wire.encode_work_result(_result(item)))
        await self.nc.flush()
        await msg.ack()

    async def _serve(self, psub: Any) -> None:
        while not self._stop.is_set():
            try:
                msgs = await psub.fetch(batch=256, timeout=self.FETCH_S)
            except TimeoutError:
                continue
            now = []
            for msg in msgs:
                self.received.append((msg.subject, msg.data))
                item = msgpack.unpackb(msg.data)
                mode = self.policy(item)
                if mode == "late":
                    self._later.add(asyncio.create_task(self._reply_later(item, msg)))
                    continue
                now.append(msg)
                for reply in replies_for(item, mode):
                    await self.nc.publish(item["reply_subject"], reply)
            await self.nc.flush()
            for msg in now:
                await msg.ack()


def _config(url: str, **overrides: Any) -> LoadConfig:
    base: dict[str, Any] = {"nats_url": url, "items": 20, "timeout_s": 5.0, "stream_wait_s": 5.0}
    base.update(overrides)
    return LoadConfig(**base)


# --- tests -----------------------------------------------------------------------------------------


async def test_encode_fan_out_single_and_chunked_results(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc)

    def policy(item: dict[str, Any]) -> str:
        return "chunked" if _request_number(item) % 5 == 1 else "single"

    async with Responder(_loadgen_nc, policy) as responder:
        summary = await generate_load(_config(_loadgen_nats, items=120, items_per_request=4), progress=False)

    assert summary.items == summary.sent == summary.published == 120
    assert summary.results == summary.successes == 120
    assert summary.chunked_results == 6 * 4  # requests 1, 6, 11, ..., 26 of 30
    assert (summary.lost, summary.publish_errors, summary.unsent, summary.duplicates) == (0, 0, 0, 0)
    assert summary.errors_by_code == {} and summary.chunk_errors == 0 and summary.unexpected_replies == 0
    assert summary.ok and summary.elapsed_s > 0 and summary.items_per_s > 0
    assert summary.p50_ms is not None and summary.max_ms is not None and 0 < summary.p50_ms <= summary.max_ms
    requests: dict[str, set[int]] = {}
    for _, raw in responder.received:
        item = msgpack.unpackb(raw)
        assert item["total_items"] == 4
        requests.setdefault(item["request_id"], set()).add(item["item_index"])
    assert len(requests) == 30 and all(indexes == {0, 1, 2, 3} for indexes in requests.values())
    data = summary.to_json()
    assert data["latency_ms"]["p50"] == summary.p50_ms and data["ok"] is True
    json.dumps(data)
    assert "results    120" in summary.format()


async def test_work_item_bytes_follow_the_gateway_order(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc)
    config = _config(
        _loadgen_nats,
        items=3,
        items_per_request=3,
        machine_profile="l4",
        bundle="b1",
        model="BAAI/bge-m3.v2",
        bundle_config_hash="abc123",
        router_id="gw-test",
    )
    async with Responder(_loadgen_nc) as responder:
        summary = await generate_load(config, progress=False)
    assert summary.ok and summary.results == 3

    subject, raw = responder.received[0]
    assert subject == "sie.work.default.l4.b1.BAAI__bge-m3_dot_v2" == config.subject
    # map16 header with 26 keys, and the first key is work_item_id.
    assert raw.startswith(b"\xde\x00\x1a\xacwork_item_id")
    assert b"\xa9timestamp\xcb" in raw  # float64, not float32 or int
    item = msgpack.unpackb(raw)
    assert list(item) == GATEWAY_KEYS
    for key, kind in TV_W1_KEYS.items():
        assert isinstance(item[key], kind) and not isinstance(item[key], bool), key
    request_id = item["request_id"]
    assert item["work_item_id"] == f"{request_id}.0" and item["item_index"] == 0 and item["total_items"] == 3
    assert item["reply_subject"] == f"_INBOX.gw-test.{request_id}"
    assert item["operation"] == "encode" and item["model_id"] == "BAAI/bge-m3.v2"
    assert (item["pool_name"], item["machine_profile"], item["profile_id"], item["engine"]) == (
        "default",
        "l4",
        "default",
        "",
    )
    assert item["item"] == {"text": config.texts[0]} and item["output_types"] == ["dense"]
    assert item["is_query"] is False and item["accepts_result_chunks"] is True
    assert item["bundle_config_hash"] == "abc123" and item["router_id"] == "gw-test"
    for key in ("payload_ref", "instruction", "options", "query_item", "query_payload_ref", "score_items"):
        assert item[key] is None, key
    assert item["labels"] is None and item["output_schema"] is None
    assert abs(item["timestamp"] - time.time()) < 60
    ids = {msgpack.unpackb(raw)["work_item_id"] for _, raw in responder.received}
    assert ids == {f"{request_id}.{i}" for i in range(3)}


async def test_score_and_extract_items(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc)
    async with Responder(_loadgen_nc) as responder:
        score = await generate_load(
            _config(_loadgen_nats, items=3, operation="score", items_per_request=8), progress=False
        )
        extract = await generate_load(_config(_loadgen_nats, items=2, operation="extract"), progress=False)
    assert score.ok and score.results == 3 and extract.ok and extract.results == 2
    items = [msgpack.unpackb(raw) for _, raw in responder.received]
    scored = [item for item in items if item["operation"] == "score"]
    assert len(scored) == 3 and len({item["request_id"] for item in scored}) == 3
    for item in scored:
        assert list(item) == GATEWAY_KEYS
        assert (item["item_index"], item["total_items"], item["item"], item["output_types"]) == (0, 1, None, None)
        assert set(item["query_item"]) == {"text"}
        assert [candidate["id"] for candidate in item["score_items"]] == ["c0", "c1", "c2", "c3"]
        assert all(isinstance(candidate["text"], str) for candidate in item["score_items"])
    extracted = [item for item in items if item["operation"] == "extract"]
    assert len(extracted) == 2
    assert all(item["labels"] and item["output_types"] is None and "text" in item["item"] for item in extracted)


async def test_unanswered_item_is_lost_and_the_cli_fails(
    _loadgen_nc: Client, _loadgen_nats: str, tmp_path: Path
) -> None:
    await _create_pool_stream(_loadgen_nc)
    parser = argparse.ArgumentParser()
    add_loadgen_arguments(parser)
    out = tmp_path / "summary.json"
    args = parser.parse_args(
        ["--nats-url", _loadgen_nats, "--items", "10", "--timeout", "0.5", "--json", str(out), "--no-progress"]
    )
    async with Responder(_loadgen_nc, lambda item: "none" if _request_number(item) == 3 else "single"):
        started = time.monotonic()
        code = await run_loadgen(args)
        waited = time.monotonic() - started
    assert code == 1
    assert 0.5 <= waited < 5
    data = json.loads(out.read_text())
    assert (data["items"], data["results"], data["successes"], data["lost"], data["ok"]) == (10, 9, 9, 1, False)
    assert data["publish_errors"] == 0 and data["router_id"].startswith("loadgen-")


def test_deadlines_follow_the_backlog_at_the_measured_capacity() -> None:
    fixed = deadlines(500, 0.0, 60.0)  # capacity unknown: the fixed timeout, nothing is ever late
    assert (fixed.due_s, fixed.stall_s, fixed.give_up_s) == (None, None, 60.0)
    slow, fast = deadlines(500, 50.0, 60.0), deadlines(500, 5000.0, 60.0)
    assert slow.due_s == pytest.approx(LATE_FACTOR * 500 / 50 + LATE_SLACK_S)  # 21 s for 500 items at 50/s
    assert fast.due_s == pytest.approx(LATE_FACTOR * 500 / 5000 + LATE_SLACK_S)
    assert slow.stall_s == max(STALL_MIN_S, STALL_ITEMS / 50) and fast.stall_s == STALL_MIN_S
    assert deadlines(0, 50.0, 60.0).due_s == LATE_SLACK_S
    with pytest.raises(LoadgenError, match="capacity"):
        LoadConfig(nats_url="nats://x", capacity=-1.0)


async def test_a_late_answer_is_late_not_lost(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    """With a measured capacity, an answer after the due time counts as late (it is a result), the
    wait goes on while answers come, and only an item nothing answers is lost: here the stall rule
    (STALL_MIN_S without an answer past the due time) ends the wait, long before the 30 s timeout."""
    await _create_pool_stream(_loadgen_nc)
    items, capacity = 12, 100.0
    limits = deadlines(items, capacity, 30.0)
    assert limits.due_s is not None and limits.stall_s == STALL_MIN_S
    late_s = limits.due_s + 0.8  # well past the latest possible due time, well inside the stall window

    def policy(item: dict[str, Any]) -> str:
        return {10: "late", 11: "none"}.get(_request_number(item), "single")

    async with Responder(_loadgen_nc, policy, late_s=late_s):
        started = time.monotonic()
        summary = await generate_load(
            _config(_loadgen_nats, items=items, capacity=capacity, timeout_s=30.0), progress=False
        )
        waited = time.monotonic() - started
    assert (summary.results, summary.successes, summary.late, summary.lost) == (11, 11, 1, 1)
    # Due time from what was outstanding at the last publish: the two held back at least, all 12 at most.
    fewest = deadlines(2, capacity, 30.0).due_s
    assert summary.due_s is not None and fewest is not None and not summary.ok
    assert fewest <= summary.due_s <= limits.due_s + 1e-9  # the same sum, added up in another order
    assert late_s + STALL_MIN_S <= waited < late_s + STALL_MIN_S + 5  # the stall rule ended it, not 30 s
    assert "late       1 answered more than" in summary.format() and summary.to_json()["late"] == 1


async def test_bad_replies_are_counted_not_fatal(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc)
    modes = {
        2: "corrupt",
        4: "unattributable",
        6: "legacy",
        8: "error",
        10: "twice",
        12: "garbage_then_single",
        14: "chunked",
    }
    async with Responder(_loadgen_nc, lambda item: modes.get(_request_number(item), "single")):
        summary = await generate_load(_config(_loadgen_nats, items=16, timeout_s=2.0), progress=False)
    assert summary.results == 16 and summary.lost == 0 and summary.publish_errors == 0
    assert summary.errors_by_code == {"inference_error": 1, "transport_failure": 2}
    assert summary.successes == 13
    assert summary.chunk_errors == 2  # the corrupted transfer's later chunks are stale, not more errors
    assert summary.chunked_results == 3  # two failed transfers and one good one
    assert summary.duplicates == 1 and summary.unexpected_replies == 1
    assert summary.ok  # errors answered by the worker are results, not losses


async def test_stream_refusals_are_publish_errors(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc, max_msgs=5)  # discard New: the sixth message is refused
    summary = await generate_load(_config(_loadgen_nats, items=12, timeout_s=0.3), progress=False)
    assert (summary.sent, summary.published, summary.publish_errors, summary.lost) == (12, 5, 7, 5)
    assert summary.results == 0 and not summary.ok
    assert summary.publish_error_samples and "maximum messages" in summary.publish_error_samples[0]


async def test_missing_pool_stream_is_a_clear_error(_loadgen_nats: str) -> None:
    with pytest.raises(LoadgenError, match=r"WORK_POOL_nosuch was not found .* start a sidecar"):
        await generate_load(_config(_loadgen_nats, pool="nosuch", stream_wait_s=0.3), progress=False)
    with pytest.raises(LoadgenError, match="cannot connect"):
        await generate_load(_config(f"nats://127.0.0.1:{free_port()}"), progress=False)


async def test_rate_and_in_flight_cap(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc)
    async with Responder(_loadgen_nc):
        paced = await generate_load(_config(_loadgen_nats, items=40, rate=400.0), progress=False)
        capped = await generate_load(_config(_loadgen_nats, items=300, max_in_flight=8), progress=False)
    assert paced.ok and paced.results == 40
    assert paced.elapsed_s >= 39 / 400  # fixed interval: the last item leaves at first publish + 39/rate
    assert capped.ok and capped.results == 300


async def test_poisson_arrivals_with_varied_texts(_loadgen_nc: Client, _loadgen_nats: str) -> None:
    await _create_pool_stream(_loadgen_nc)
    texts = varied_texts(64, min_words=5, max_words=120, seed=7)
    config = _config(_loadgen_nats, items=120, rate=1000.0, arrival="poisson", seed=11, texts=texts)
    async with Responder(_loadgen_nc) as responder:
        summary = await generate_load(config, progress=False)
    assert summary.ok and summary.results == 120 and summary.arrival == "poisson"
    assert "Poisson arrivals" in summary.format() and summary.to_json()["arrival"] == "poisson"
    last = arrival_offsets([1] * 120, 1000.0, "poisson", seed=11)[-1]
    assert last != pytest.approx(0.119, abs=1e-3)  # not the fixed schedule's last departure
    assert summary.elapsed_s >= last  # open loop: the last item leaves at first publish + its offset
    sent = [msgpack.unpackb(raw)["item"]["text"] for _, raw in responder.received]
    assert sorted(sent) == sorted(texts[i % 64] for i in range(120))
    assert len({len(text.split()) for text in sent}) > 20  # costs vary


def test_poisson_offsets_have_the_mean_rate_and_exponential_gaps() -> None:
    n, rate = 20_000, 1000.0
    fixed = arrival_offsets([1] * n, rate)
    assert fixed[:3] == [0.0, 0.001, 0.002] and fixed[-1] == pytest.approx((n - 1) / rate)
    poisson = arrival_offsets([1] * n, rate, "poisson", seed=3)
    assert poisson[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(poisson))
    gaps = [b - a for a, b in itertools.pairwise(poisson)]
    mean = sum(gaps) / len(gaps)
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert sd / mean == pytest.approx(1.0, abs=0.05)  # exponential: coefficient of variation 1 (fixed: 0)
    assert sum(g < mean for g in gaps) / len(gaps) == pytest.approx(1 - 1 / 2.718281828, abs=0.02)
    assert arrival_offsets([1] * n, rate, "poisson", seed=3) == poisson  # seeded: reproducible
    assert arrival_offsets([1] * n, rate, "poisson", seed=4) != poisson
    fan_out = arrival_offsets([4] * 5000, rate, "poisson", seed=3)
    assert fan_out[-1] / 4999 == pytest.approx(4 / rate, rel=0.05)  # requests of 4 items: 4x the gap
    assert arrival_offsets([1] * 10, 0.0, "poisson") == []
    with pytest.raises(LoadgenError, match="arrival"):
        arrival_offsets([1], rate, "uniform")
    with pytest.raises(LoadgenError, match="arrival"):
        LoadConfig(nats_url="nats://x", arrival="bursty")


def test_varied_texts_span_the_word_range() -> None:
    texts = varied_texts(256, min_words=5, max_words=120, seed=0)
    words = [len(text.split()) for text in texts]
    assert len(texts) == 256 and min(words) >= 5 and max(words) <= 120
    assert min(words) <= 10 and max(words) >= 110 and 50 <= sum(words) / len(words) <= 75
    assert varied_texts(256, seed=0) == texts and varied_texts(256, seed=1) != texts
    vocabulary = {word for text in DEFAULT_TEXTS for word in text.split()}
    assert all(word in vocabulary for text in texts[:8] for word in text.split())
    assert varied_texts(3, min_words=4, max_words=4) and all(
        len(t.split()) == 4 for t in varied_texts(3, min_words=4, max_words=4)
    )
    with pytest.raises(LoadgenError):
        varied_texts(1, min_words=10, max_words=5)


def test_cli_arrival_seed_and_text_words() -> None:
    parser = argparse.ArgumentParser()
    add_loadgen_arguments(parser)
    config = config_from_args(
        parser.parse_args(["--rate", "500", "--arrival", "poisson", "--seed", "9", "--text-words", "5,120"])
    )
    assert (config.rate, config.arrival, config.seed) == (500.0, "poisson", 9)
    assert config.texts == varied_texts(min_words=5, max_words=120, seed=9)
    plain = config_from_args(parser.parse_args([]))
    assert (plain.arrival, plain.texts) == ("fixed", DEFAULT_TEXTS)
    for bad in (["--arrival", "uniform"], ["--text-words", "9,3"], ["--text-words", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_config_validation() -> None:
    with pytest.raises(LoadgenError, match="operation"):
        LoadConfig(nats_url="nats://x", operation="generate")
    with pytest.raises(LoadgenError, match="pool"):
        LoadConfig(nats_url="nats://x", pool="a.b")
    with pytest.raises(LoadgenError, match="items_per_request"):
        LoadConfig(nats_url="nats://x", items_per_request=5000)
    config = LoadConfig(nats_url="nats://x", items=10, items_per_request=4, operation="score")
    assert config.fan_out == 1 and config.router_id.startswith("loadgen-")
    assert config.subject == "sie.work.default.cpu.default.sentence-transformers__all-MiniLM-L6-v2"


def open_terminal() -> tuple[int, int]:
    """A real pseudo-terminal, 120 columns wide (a fresh pty reports 0, which tqdm trims the bar to)."""
    master, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    return master, follower


def read_terminal(master: int) -> str:
    """Everything written to the terminal, once its follower side is closed (Linux then says EIO)."""
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: drained and no writer left
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def last_line(out: io.StringIO) -> str:
    """The bar's current state: what follows the last carriage return, trailing padding removed."""
    return out.getvalue().rsplit("\r", 1)[1].rstrip()


def test_progress_bar_shows_done_total_rate_and_p50_and_ends_the_line() -> None:
    out = io.StringIO()
    bar = progress_bar(50_000, stream=out, force=True, min_interval_s=0.0)
    assert last_line(out).startswith("  0%|") and "0/50,000 items" in last_line(out)
    time.sleep(0.05)  # tqdm's rate needs elapsed time between draws
    show_progress(bar, 12_345, 3.14)
    line = last_line(out)
    assert line.startswith(" 25%|") and "12,345/50,000 items" in line
    assert re.search(r"\d+(\.\d+)?k items/s, p50 3\.1 ms\]$", line), line
    show_progress(bar, 12_400, None)  # no new p50: the last one stays
    assert last_line(out).endswith("p50 3.1 ms]") and "12,400/50,000" in last_line(out)
    bar.close()
    bar.close()
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1


def test_progress_bar_throttles_redraws_but_close_draws_the_final_count() -> None:
    out = io.StringIO()
    bar = progress_bar(300, stream=out, force=True, min_interval_s=60.0)
    for done in range(0, 301, 10):
        show_progress(bar, done, 2.0)
    assert out.getvalue().count("\r") == 1  # the first draw only: the rest fell within the interval
    bar.close()
    assert "300/300 items" in last_line(out) and last_line(out).endswith("p50 2.0 ms]")


def test_progress_bar_draws_on_a_terminal_and_stays_silent_off_one() -> None:
    quiet = io.StringIO()  # not a terminal and not forced: nothing at all
    silent = progress_bar(10, stream=quiet, min_interval_s=0.0)
    assert silent.disable
    show_progress(silent, 5, 1.0)
    silent.close()
    assert quiet.getvalue() == ""

    master, follower = open_terminal()
    try:
        with open(follower, "w", closefd=True) as tty:
            bar = progress_bar(10, stream=tty, min_interval_s=0.0)
            assert not bar.disable
            show_progress(bar, 10, 1.5)
            bar.close()
        drawn = read_terminal(master)
    finally:
        os.close(master)
    assert "10/10 items" in drawn and "p50 1.5 ms" in drawn and drawn.endswith("\n")


async def test_loadgen_draws_progress_on_a_terminal_stderr(
    _loadgen_nc: Client, _loadgen_nats: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await _create_pool_stream(_loadgen_nc)
    async with Responder(_loadgen_nc):
        summary = await generate_load(_config(_loadgen_nats, items=20), progress=True)
    assert summary.ok and capsys.readouterr().err == ""  # captured stderr is no terminal: no bar

    master, follower = open_terminal()
    try:
        with open(follower, "w", closefd=True) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            async with Responder(_loadgen_nc):
                summary = await generate_load(_config(_loadgen_nats, items=40), progress=True)
            monkeypatch.undo()
        drawn = read_terminal(master)
    finally:
        os.close(master)
    assert summary.ok and summary.results == 40
    final = drawn.rstrip().rsplit("\r", 1)[-1]
    assert "100%|" in final and "40/40 items" in final and re.search(r"p50 \d+\.\d ms\]", final), drawn
