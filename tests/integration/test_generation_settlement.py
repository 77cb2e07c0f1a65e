# SPDX-License-Identifier: Apache-2.0
"""How generation deliveries are settled (sidecar-behaviour §4.4, §5.6, §13, §14, §15.4; wire-protocol
§2.2, §5.2), observed where it counts: on a protocol-traced real nats-server, whose log shows every
ACK, NAK (with its delay) and progress ACK the sidecar wrote to each JetStream message.

The backend is the reference backend on a real Unix socket, with the backend library's generation
stream where it can say what a test needs (a NAK with a delay, progress events), and a scripted peer
in front of it where it cannot (a stream that ends unsettled, an unknown event kind, a frame for
another request, a response chunk)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from sie_sidecar import wire
from sie_sidecar.backend.generation import GenerateStream, TokenStreamer
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.bus.topology import TopologySpec, ensure_topology
from sie_sidecar.ipc.types import LOADING_IN_PROGRESS, ReadyResponse
from sie_sidecar.logs import Throttled
from sie_sidecar.pipeline import generation
from sie_sidecar.wire.generation import EXECUTED_HASH_KEY

from .conftest import NatsServer
from .generation_peer import (
    GenerationPeer,
    JetStreamTrace,
    Script,
    Settlement,
    Step,
    event_frame,
    frame,
    publish_frame,
)
from .stack import BUNDLE, MODEL, NAK_DELAY_S, POOL, PROFILE, WORKER, Stack, running_stack, start_stack, work_item
from .test_live_config import DEBUG_ENV, doc, hash_of, notify

pytestmark = pytest.mark.timeout(90)

POOL_STREAM = wire.pool_stream_name(POOL)
BASE_NS = round(NAK_DELAY_S * 1e9)
ACK: Settlement = ("ack", None)
PROGRESS: Settlement = ("progress", None)
BASE_NAK: Settlement = ("nak", BASE_NS)


def generate_item(prompt: str = "tell me", max_new_tokens: int = 3, **extra: Any) -> dict[str, Any]:
    item = work_item(operation="generate", text="", **extra)
    item["item"] = None
    item["output_types"] = None
    item["generate"] = {"prompt": prompt, "max_new_tokens": max_new_tokens}
    return item


async def publish(stack: Stack, item: Mapping[str, Any] | None = None, *, data: bytes | None = None) -> int:
    """Publish through JetStream as the gateway does; the message's stream sequence."""
    payload = data if data is not None else msgpack.packb(item, use_bin_type=True)
    model = item["model_id"] if item is not None else MODEL
    ack = await stack.js.publish(wire.pool_work_subject(POOL, PROFILE, BUNDLE, model), payload)
    return int(ack.seq)


def chunks_for(stack: Stack, request_id: str) -> list[dict[str, Any]]:
    return [r for r in stack.replies if r.get("kind") == "chunk" and r.get("request_id") == request_id]


async def debug_points(stack: Stack, name: str) -> list[dict[str, Any]]:
    """The `/debug/state` telemetry points of one instrument (§13, in-process registry)."""
    url = f"http://127.0.0.1:{stack.settings.worker_probe_port}/debug/state"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        state = json.loads(await r.text())
    return [p for p in state["telemetry"] if p["name"] == name]


async def naks_by_reason(stack: Stack) -> dict[str, float]:
    counts: dict[str, float] = {}
    for p in await debug_points(stack, "sie.worker.nats.operations"):
        if p["attrs"].get("operation") == "nak":
            reason = p["attrs"]["reason"]
            counts[reason] = counts.get(reason, 0.0) + float(p["value"])
    return counts


@dataclass(frozen=True)
class Raw:
    """Bytes that go into a msgpack document as they are (repeated keys, a key of any type)."""

    data: bytes


def _packed(value: Any) -> bytes:
    return value.data if isinstance(value, Raw) else bytes(msgpack.packb(value, use_bin_type=True))


def raw_map(*pairs: tuple[Any, Any]) -> Raw:
    """A map written pair by pair (map16), so keys may repeat: a dict can not say that."""
    return Raw(b"\xde" + len(pairs).to_bytes(2, "big") + b"".join(_packed(k) + _packed(v) for k, v in pairs))


def raw_array(*values: Any) -> Raw:
    return Raw(b"\xdc" + len(values).to_bytes(2, "big") + b"".join(_packed(v) for v in values))


@contextlib.asynccontextmanager
async def peer_stack(
    nats_server: NatsServer, tmp_path: Path, scripts: Mapping[str, Script], **kw: Any
) -> AsyncIterator[tuple[Stack, GenerationPeer]]:
    """The reference backend, the scripted peer in front of it, and the sidecar talking to the peer."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    backend = BackendServer(adapter, str(tmp_path / "backend.sock"), worker_id="backend-0")
    await backend.start()
    peer = GenerationPeer(str(tmp_path / "backend.sock"), scripts)
    peer_sock = str(tmp_path / "peer.sock")
    server = await asyncio.start_unix_server(peer.handle, peer_sock, limit=1 << 20)
    try:
        async with running_stack(nats_server, tmp_path, adapter=adapter, external_backend=peer_sock, **kw) as stack:
            yield stack, peer
    finally:
        peer.close_all()
        server.close()
        await backend.close()


def settles_then_acks(request_id: str, work_item: dict[str, Any]) -> list[Step]:
    """A well-behaved answer (a redelivered attempt ends the test's item)."""
    return [
        event_frame(request_id, "in_progress"),
        publish_frame(request_id, work_item, 0, "fine", done=True),
        event_frame(request_id, "ack"),
        event_frame(request_id, "done"),
    ]


# -- backend events (§4.4, wire §5.2) -------------------------------------------------------------


class _Settling(TokenStreamer):
    """The backend library's stream, settled as the prompt says: `nak-1500` NAKs with 1.5 s, `nak`
    without a delay, `nak-then-ack` / `ack-then-nak` settle twice; a redelivery streams normally."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, int] = {}

    async def run(self, work_item: Mapping[str, Any], stream: GenerateStream) -> None:
        prompt = str(work_item["generate"]["prompt"])
        self.runs[prompt] = self.runs.get(prompt, 0) + 1
        if self.runs[prompt] > 1:
            await super().run(work_item, stream)
            return
        await stream.chunk("first", done=True, finish_reason="stop")
        if prompt == "nak-1500":
            await stream.nak(delay_ms=1500)
        elif prompt == "nak":
            await stream.nak()
        elif prompt == "nak-then-ack":
            await stream.nak(delay_ms=300)
            await stream.ack()
        elif prompt == "ack-then-nak":
            await stream.ack()
            await stream.nak(delay_ms=1)


async def test_a_backend_nak_settles_with_its_delay_or_the_base_and_the_first_settlement_wins(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4 / wire §5.2: a `nak` event NAKs with its `delay_ms`, or with the base delay without one;
    whichever of `ack` and `nak` comes first is the only settlement JetStream sees."""
    trace = JetStreamTrace(traced_nats_server)
    streamer = _Settling()
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], generator=streamer)
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter) as stack:
        seqs = {prompt: await publish(stack, generate_item(prompt)) for prompt in ("nak-1500", "nak", "nak-then-ack")}
        ack_first = await publish(stack, generate_item("ack-then-nak"))
        # Each NAKed item comes back after its delay and then streams and ACKs normally.
        expected = {"nak-1500": 1_500_000_000, "nak": BASE_NS, "nak-then-ack": 300_000_000}
        for prompt, seq in seqs.items():
            found = await trace.wait_for(POOL_STREAM, seq, lambda f: f.count(ACK) == 1)
            assert found == [PROGRESS, ("nak", expected[prompt]), PROGRESS, ACK], prompt
        assert await trace.wait_for(POOL_STREAM, ack_first, lambda f: ACK in f) == [PROGRESS, ACK]
        await stack.settled_pool()
        assert streamer.runs == {"nak-1500": 2, "nak": 2, "nak-then-ack": 2, "ack-then-nak": 1}


def _progress_script(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
    """Three progress events before the ACK, one after it."""
    return [
        event_frame(request_id, "in_progress"),
        publish_frame(request_id, work_item, 0, "a"),
        event_frame(request_id, "in_progress"),
        event_frame(request_id, "in_progress"),
        publish_frame(request_id, work_item, 1, "b", done=True),
        event_frame(request_id, "ack"),
        event_frame(request_id, "in_progress"),
        event_frame(request_id, "done"),
    ]


def _paced(progress: bool) -> Script:
    """A stream of 4.5 s (twice and more the 2 s ack_wait), with a progress event every 0.5 s or none."""

    def script(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
        steps: list[Step] = []
        for k in range(9 if attempt == 1 else 0):
            if progress:
                steps.append(event_frame(request_id, "in_progress"))
            steps += [publish_frame(request_id, work_item, k, "t"), 0.5]
        end = [publish_frame(request_id, work_item, 9, "", done=True), event_frame(request_id, "ack")]
        return [*steps, *end, event_frame(request_id, "done")]

    return script


async def test_in_progress_events_progress_ack_an_unsettled_item_and_keep_it_past_ack_wait(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4 / §4.5 row 3 / wire §5.2: each `in_progress` before the settlement is one progress ACK
    (`+WPI`) on the item; one after it is ignored. On a durable with a 2 s ack_wait, a 4.5 s stream
    with progress events is never redelivered; the same stream without them is."""
    spec = TopologySpec(pool=POOL, machine_profile=PROFILE, bundle=BUNDLE, worker_id=WORKER)
    admin = await nats.connect(traced_nats_server.url)
    try:
        await ensure_topology(admin.jetstream(), spec)
        info = await admin.jetstream().consumer_info(spec.pool_stream, spec.pool_durable)
        config: ConsumerConfig = info.config
        config.ack_wait = 2.0
        assert config.ack_policy == AckPolicy.EXPLICIT
        await admin.jetstream().add_consumer(spec.pool_stream, config=config)
    finally:
        await admin.close()
    trace = JetStreamTrace(traced_nats_server)
    scripts = {"progress": _progress_script, "kept": _paced(True), "silent": _paced(False)}
    async with peer_stack(traced_nats_server, tmp_path, scripts) as (stack, peer):
        seq = await publish(stack, generate_item("progress"))
        assert await trace.wait_for(POOL_STREAM, seq, lambda f: ACK in f) == [PROGRESS, PROGRESS, PROGRESS, ACK]
        kept = await publish(stack, generate_item("kept"))
        silent = await publish(stack, generate_item("silent"))
        found = await trace.wait_for(POOL_STREAM, kept, lambda f: ACK in f, timeout=20)
        assert found == [PROGRESS] * 9 + [ACK]
        await stack.settled_pool(timeout=20)
        assert peer.count("kept") == 1 and peer.count("progress") == 1
        assert peer.count("silent") == 2  # redelivered at ack_wait: nothing progress-ACKed it
        assert PROGRESS not in trace.settlements(POOL_STREAM, silent)


async def test_an_unknown_event_kind_is_logged_and_ignored(
    traced_nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """§4.4 / wire §5.2: an event of a kind the sidecar does not know is logged and ignored; the
    stream goes on (its chunk is published, its ACK settles the item)."""
    monkeypatch.setattr(generation, "_warn", Throttled(generation.log))  # no earlier test's throttle

    def script(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
        return [
            event_frame(request_id, "in_progress"),
            event_frame(request_id, "heartbeat", error="a kind from a newer backend"),
            publish_frame(request_id, work_item, 0, "after it", done=True),
            event_frame(request_id, "ack"),
            event_frame(request_id, "done"),
        ]

    trace = JetStreamTrace(traced_nats_server)
    async with peer_stack(traced_nats_server, tmp_path, {"unknown": script}) as (stack, peer):
        item = generate_item("unknown")
        seq = await publish(stack, item)
        assert await trace.wait_for(POOL_STREAM, seq, lambda f: ACK in f) == [PROGRESS, ACK]
        await stack.wait_for(lambda: len(chunks_for(stack, item["request_id"])) == 1)
        assert chunks_for(stack, item["request_id"])[0]["text_delta"] == "after it"
        await stack.settled_pool()
        assert peer.count("unknown") == 1
    ignored = [r for r in caplog.records if r.getMessage() == "unknown generation event ignored"]
    assert [getattr(r, "kind", None) for r in ignored] == ["heartbeat"]
    assert not any(r.getMessage() == "generation stream failed" for r in caplog.records)


async def test_a_stream_that_ends_without_a_settlement_is_naked_with_the_base_delay(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4 / wire §5.2: `done` with neither `ack` nor `nak` seen is a NAK with the base delay (the
    backend library ACKs for an adapter that forgot; this peer does not)."""

    def unsettled(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
        if attempt > 1:
            return settles_then_acks(request_id, work_item)
        return [
            event_frame(request_id, "in_progress"),
            publish_frame(request_id, work_item, 0, "all of it", done=True),
            event_frame(request_id, "done"),
        ]

    def only_done(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
        return settles_then_acks(request_id, work_item) if attempt > 1 else [event_frame(request_id, "done")]

    trace = JetStreamTrace(traced_nats_server)
    async with peer_stack(traced_nats_server, tmp_path, {"unsettled": unsettled, "done": only_done}) as (stack, peer):
        first = await publish(stack, generate_item("unsettled"))
        second = await publish(stack, generate_item("done"))
        assert await trace.wait_for(POOL_STREAM, first, lambda f: ACK in f) == [PROGRESS, BASE_NAK, PROGRESS, ACK]
        assert await trace.wait_for(POOL_STREAM, second, lambda f: ACK in f) == [BASE_NAK, PROGRESS, ACK]
        await stack.settled_pool()
        assert peer.count("unsettled") == 2 and peer.count("done") == 2


async def test_a_frame_for_another_request_or_a_response_chunk_fails_the_stream(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """wire §2.2 / §5.2: in a generation stream, a frame with another request id, or a frame that is
    an `ipc_response_chunk_v1`, ends the stream as an error (never reassembled as a chunk, never
    taken as this stream's event): the item is NAKed with the base delay, the ACK that follows on the
    wire is never honoured, and the redelivery streams normally."""

    def foreign(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
        if attempt > 1:
            return settles_then_acks(request_id, work_item)
        return [
            event_frame(request_id, "in_progress"),
            event_frame("w-someone-else", "ack"),
            event_frame(request_id, "ack"),
            event_frame(request_id, "done"),
        ]

    def chunked(request_id: str, work_item: dict[str, Any], attempt: int) -> list[Step]:
        if attempt > 1:
            return settles_then_acks(request_id, work_item)
        body = msgpack.packb({"kind": "ack", "reply_subject": "", "payload": b"", "delay_ms": None, "error": None})
        chunk = {
            "version": 1,
            "request_id": request_id,
            "kind": "ipc_response_chunk_v1",
            "transfer_digest": bytes(32),
            "chunk_index": 0,
            "chunk_count": 1,
            "total_bytes": len(body),
            "payload": body,
        }
        return [
            event_frame(request_id, "in_progress"),
            frame(bytes(msgpack.packb(chunk, use_bin_type=True))),
            event_frame(request_id, "ack"),
            event_frame(request_id, "done"),
        ]

    trace = JetStreamTrace(traced_nats_server)
    async with peer_stack(traced_nats_server, tmp_path, {"foreign": foreign, "chunked": chunked}) as (stack, peer):
        seqs = [await publish(stack, generate_item(prompt)) for prompt in ("foreign", "chunked")]
        for seq in seqs:
            assert await trace.wait_for(POOL_STREAM, seq, lambda f: ACK in f) == [PROGRESS, BASE_NAK, PROGRESS, ACK]
        await stack.settled_pool()
        assert peer.count("foreign") == 2 and peer.count("chunked") == 2


# -- before the stream (§4.4, §14) ----------------------------------------------------------------


async def test_an_unsupported_model_is_naked_with_the_base_delay_before_the_backend_is_asked(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4 / §14 (newer than v0.7.1): a generation for a model the live config marks unsupported is
    NAKed with the base delay and the §13 reason `model_unsupported`, before EnsureModelReady: the
    backend is never asked about it and never streams it. An encode item for it is settled the same
    way (wire-protocol Appendix A)."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter, env=DEBUG_ENV) as stack:
        assert stack.backend is not None
        config = f"sie_id: {MODEL}\nunsupported: true"
        expected = hash_of({MODEL: config})
        assert await notify(stack, doc(model_id=MODEL, model_config=config, bundle_config_hash=expected)) == "applied"
        asked = stack.backend.method_calls["EnsureModelReady"]
        generate_seq = await publish(stack, generate_item("never"))
        encode_seq = await publish(stack, work_item(text="never either"))
        for seq in (generate_seq, encode_seq):
            found = await trace.wait_for(POOL_STREAM, seq, lambda f: len(f) >= 2)  # NAKed, back, NAKed again
            assert set(found) == {BASE_NAK}
        reasons = await naks_by_reason(stack)
        assert reasons.get("model_unsupported", 0) >= 4 and reasons.get("retry", 0) == 0
        assert stack.backend.method_calls["EnsureModelReady"] == asked
        assert stack.backend.method_calls["ProcessGenerate"] == 0 and adapter.generator.streams == 0
        assert adapter.items == 0 and stack.replies == []


class _ReadyFailsOnce(NullAdapter):
    """EnsureModelReady raises once (the backend answers an error envelope: an IPC error for the
    sidecar); after that the model is ready."""

    def __init__(self) -> None:
        super().__init__(dim=8, preloaded_models=[MODEL])
        self.failures = 1

    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the backend cannot say")
        return await super().ensure_ready(model_id)


async def test_an_ensure_model_ready_error_is_naked_with_the_base_delay(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4: EnsureModelReady failing at the IPC level NAKs with the base delay, publishing nothing;
    the redelivery, once the backend answers, streams."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = _ReadyFailsOnce()
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter) as stack:
        item = generate_item("after the error", max_new_tokens=2)
        seq = await publish(stack, item)
        assert await trace.wait_for(POOL_STREAM, seq, lambda f: ACK in f) == [BASE_NAK, PROGRESS, ACK]
        assert adapter.failures == 0 and adapter.generator.streams == 1
        assert [c["seq"] for c in chunks_for(stack, item["request_id"])] == [0, 1, 2]  # the second attempt only
        await stack.settled_pool()


async def test_retry_later_is_naked_with_the_base_delay(traced_nats_server: NatsServer, tmp_path: Path) -> None:
    """§4.4: readiness `retry_later` NAKs with the base delay, every delivery, and publishes nothing."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = NullAdapter(dim=8, retry_later_models=[MODEL])
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter) as stack:
        assert stack.backend is not None
        item = generate_item("later")
        seq = await publish(stack, item)
        found = await trace.wait_for(POOL_STREAM, seq, lambda f: len(f) >= 3)
        assert set(found) == {BASE_NAK}
        assert chunks_for(stack, item["request_id"]) == [] and stack.backend.method_calls["ProcessGenerate"] == 0


async def test_loading_answers_terminal_chunks_acks_and_counts_each_response(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4 / §13: `loading_started`, `loading_in_progress` and `failed` are each answered with their
    terminal chunk and ACKed, and each is one `sie.worker.generation.model_loading.responses` with
    the model, profile, state and outcome `success`."""
    loading, broken = "org/loading", "org/broken"
    trace = JetStreamTrace(traced_nats_server)
    adapter = NullAdapter(dim=8, preloaded_models=[], load_delay_s=600.0, failed_models=[broken])
    env = DEBUG_ENV | {"SIE_METRIC_MODEL_ALLOWLIST": f"{loading},{broken}"}
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter, env=env) as stack:
        await debug_points(stack, "")  # the first read of the state turns recording on
        answers = {}
        for name, model in (("started", loading), ("in_progress", loading), ("failed", broken)):
            item = generate_item(name, model=model)
            seq = await publish(stack, item)
            assert await trace.wait_for(POOL_STREAM, seq, lambda f: len(f) >= 1) == [ACK]
            (chunk,) = chunks_for(stack, item["request_id"])
            answers[name] = chunk["error"]
        assert answers == {
            "started": {"code": "MODEL_LOADING", "message": f"Model '{loading}' is loading; retry later."},
            "in_progress": {"code": "MODEL_LOADING", "message": f"Model '{loading}' is still loading; retry later."},
            "failed": {"code": "MODEL_LOAD_FAILED", "message": f"Model '{broken}' failed to load."},
        }
        points = await debug_points(stack, "sie.worker.generation.model_loading.responses")
        attrs = ("model", "profile", "state", "outcome")
        counted = {tuple(p["attrs"][a] for a in attrs): p["value"] for p in points}
        assert counted == {
            (loading, "default", "loading_started", "success"): 1,
            (loading, "default", "loading_in_progress", "success"): 1,
            (broken, "default", "failed", "success"): 1,
        }
        assert adapter.generator.streams == 0


#: Ten such chunks fit in nats-py's 2 MiB reconnect buffer and leave about 96 KB, less what was
#: queued before: room for a NAK (tens of bytes), none for a terminal chunk carrying BIG_REQUEST_ID.
FLOOD_CHUNK = 200_000
BIG_REQUEST_ID = "big-" + "r" * 300_000


class _Flood(TokenStreamer):
    """Streams one chunk, then, once `go` is set, FLOOD_CHUNK-byte chunks until the sidecar gives the
    stream up (its publishes fail once nats-py's reconnect buffer is full)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.ended = asyncio.Event()

    async def run(self, work_item: Mapping[str, Any], stream: GenerateStream) -> None:
        try:
            await stream.chunk("ready")
            await self.go.wait()
            while True:
                await stream.chunk("x" * FLOOD_CHUNK)
                await asyncio.sleep(0)  # a closed connection makes sends return at once
        finally:
            self.ended.set()


class _StillLoading(NullAdapter):
    """`org/loading` answers `loading_in_progress`, the first time only once the test says so."""

    def __init__(self) -> None:
        super().__init__(dim=8, preloaded_models=[MODEL], generator=_Flood())
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        if model_id != "org/loading":
            return await super().ensure_ready(model_id)
        self.asked.set()
        await self.answer.wait()
        return ReadyResponse(LOADING_IN_PROGRESS)


@pytest.mark.parametrize(("base_s", "nak_ns"), [(0.2, 400_000_000), (10.0, 15_000_000_000)])
async def test_a_loading_in_progress_chunk_that_cannot_be_published_naks_twice_the_base_up_to_15_s(
    traced_nats_server: NatsServer, tmp_path: Path, base_s: float, nak_ns: int
) -> None:
    """§4.4: when the `loading_in_progress` terminal chunk cannot be published, the item is NAKed
    with min(2 x base, 15 s) and counted with outcome `publish_error`. The publish fails for real:
    NATS is away and the sidecar's reconnect buffer is full (a stream of large chunks filled it), so
    the large chunk does not fit while the small NAK still does and reaches JetStream once NATS is back."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = _StillLoading()
    flood = adapter.generator
    assert isinstance(flood, _Flood)
    env = DEBUG_ENV | {"SIE_STREAM_STORAGE": "file", "SIE_NAK_DELAY_S": str(base_s)}
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter, env=env) as stack:
        await debug_points(stack, "")  # the first read of the state turns recording on
        filler = generate_item("flood")
        await publish(stack, filler)
        await stack.wait_for(lambda: len(chunks_for(stack, filler["request_id"])) == 1)
        big = generate_item("big", model="org/loading", request_id=BIG_REQUEST_ID, reply_subject="_INBOX.gw.big")
        big["work_item_id"] = "big.0"
        seq = await publish(stack, big)
        await asyncio.wait_for(adapter.asked.wait(), 10)
        await traced_nats_server.stop(hard=True)
        flood.go.set()
        await asyncio.wait_for(flood.ended.wait(), 20)
        adapter.answer.set()

        async def publish_errors() -> float:
            points = await debug_points(stack, "sie.worker.generation.model_loading.responses")
            return sum(float(p["value"]) for p in points if p["attrs"]["outcome"] == "publish_error")

        deadline = time.monotonic() + 10
        while await publish_errors() < 1:
            assert time.monotonic() < deadline, "the loading answer was not counted as a publish error"
            await asyncio.sleep(0.05)
        points = await debug_points(stack, "sie.worker.generation.model_loading.responses")
        assert [(p["attrs"]["state"], p["attrs"]["outcome"], p["value"]) for p in points] == [
            ("loading_in_progress", "publish_error", 1)
        ]
        await traced_nats_server.start()
        found = await trace.wait_for(POOL_STREAM, seq, lambda f: len(f) >= 1, timeout=20)
        assert found[0] == ("nak", nak_ns)


# -- re-encoding, media keys and the work-item age (§4.4, §5.6, scheduler-and-prep §7.2) -----------


async def test_a_work_item_that_cannot_be_re_encoded_is_an_internal_error_result_and_acked(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.4 / wire §10.1: intake takes a WorkItem with a key it does not know undecoded (here an ext
    key that is no valid Timestamp); the sidecar can not build the re-encoded WorkItem from it, and
    answers a WorkResult `internal_error` ("failed to encode generate work item", never stamped),
    then ACKs: no stream, no redelivery."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter) as stack:
        item = generate_item("odd key", bundle_config_hash="")
        bad_key = Raw(b"\xc7\x03\xff\x00\x00\x00")  # ext 8, 3 bytes, type -1: not a Timestamp
        seq = await publish(stack, item, data=raw_map(*item.items(), (bad_key, 1)).data)
        assert await trace.wait_for(POOL_STREAM, seq, lambda f: len(f) >= 1) == [ACK]
        (result,) = stack.results_for(item["work_item_id"])
        assert result["error_code"] == "internal_error" and result["error"] == "failed to encode generate work item"
        assert EXECUTED_HASH_KEY not in result and adapter.generator.streams == 0
        await stack.settled_pool()


async def test_a_repeated_media_key_is_an_invalid_input_terminal_chunk(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """scheduler-and-prep §7.2: a message with two `images` keys (msgpack would keep the second) is
    INVALID_INPUT naming the field path, then ACK; the backend never sees it."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter) as stack:
        item = generate_item()
        del item["generate"]
        image = {"data": b"\x89PNG", "format": "png"}
        message = raw_map(("role", "user"), ("content", "x"), ("images", [image]), ("images", [image]))
        generate = raw_map(("messages", raw_array(message)), ("max_new_tokens", 2))
        seq = await publish(stack, item, data=raw_map(*item.items(), ("generate", generate)).data)
        assert await trace.wait_for(POOL_STREAM, seq, lambda f: len(f) >= 1) == [ACK]
        (chunk,) = chunks_for(stack, item["request_id"])
        assert chunk["error"] == {"code": "INVALID_INPUT", "message": "generate.messages[0].images: duplicate field"}
        assert adapter.generator.streams == 0


async def test_the_work_item_age_is_recorded_when_a_generation_executes(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§5.6 / §14 (newer than v0.7.1): `sie.worker.work_item.age` (operation `generate`) is recorded
    once per generation that reaches the backend, as now minus the item's timestamp; not for a
    timestamp of 0, nor for an item answered before execution."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(traced_nats_server, tmp_path, adapter=adapter, env=DEBUG_ENV) as stack:
        await debug_points(stack, "")  # the first read of the state turns recording on
        trace = JetStreamTrace(traced_nats_server)

        async def age() -> tuple[int, float]:
            points = await debug_points(stack, "sie.worker.work_item.age")
            (point,) = [p for p in points if p["attrs"].get("operation") == "generate"] or [{"count": 0, "value": 0.0}]
            return int(point["count"]), float(point["value"])

        sent = time.time()
        old = generate_item("old", timestamp=sent - 30.0)
        seq = await publish(stack, old)
        await trace.wait_for(POOL_STREAM, seq, lambda f: ACK in f)
        count, total = await age()
        assert count == 1 and 30.0 <= total < 30.0 + (time.time() - sent) + 1.0
        undated = generate_item("undated", timestamp=0.0)
        invalid = generate_item("bad media")
        invalid["generate"] = {"messages": [{"role": "user", "images": [{"data": "not base64!"}]}]}
        for item in (undated, invalid):
            seq = await publish(stack, item)
            await trace.wait_for(POOL_STREAM, seq, lambda f: ACK in f)
        assert adapter.generator.streams == 2
        assert await age() == (count, total)


# -- shutdown (§15.4 step 6) ----------------------------------------------------------------------


async def test_shutdown_joins_generations_for_15_s_then_cancels_and_naks_the_rest(
    traced_nats_server: NatsServer, tmp_path: Path
) -> None:
    """§15.4 step 6: at SIGTERM a generation that ends soon is waited for and ACKed; one that would
    stream on keeps streaming for the 15 s join, then is cancelled and NAKed with the base delay."""
    trace = JetStreamTrace(traced_nats_server)
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], generator=TokenStreamer(token_delay_s=0.05))
    stack = await start_stack(traced_nats_server, tmp_path, adapter=adapter)
    try:
        arrivals: list[float] = []

        async def on_long(msg: Any) -> None:
            arrivals.append(time.monotonic())

        await stack.nc.subscribe("_INBOX.gw.long-stream", cb=on_long)
        short = generate_item("short", max_new_tokens=40)
        long = generate_item("long", max_new_tokens=100_000, reply_subject="_INBOX.gw.long-stream")
        short_seq, long_seq = await publish(stack, short), await publish(stack, long)
        await stack.wait_for(lambda: len(chunks_for(stack, short["request_id"])) >= 3 and len(arrivals) >= 3)
        stopped = time.monotonic()
        stack.stop.set()
        assert await asyncio.wait_for(asyncio.shield(stack.task), 40) == 0
        exited = time.monotonic() - stopped
        assert await trace.wait_for(POOL_STREAM, short_seq, lambda f: len(f) >= 2) == [PROGRESS, ACK]
        assert chunks_for(stack, short["request_id"])[-1]["finish_reason"] == "length"
        assert await trace.wait_for(POOL_STREAM, long_seq, lambda f: len(f) >= 2) == [PROGRESS, BASE_NAK]
        assert 15.0 <= exited < 15.0 + 8.0, exited  # joined for 15 s, then the bounded rest of the drain
        assert arrivals[-1] - stopped >= 14.0  # it streamed on through the join until it was cancelled
    finally:
        await stack.close()
