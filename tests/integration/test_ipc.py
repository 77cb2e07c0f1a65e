# SPDX-License-Identifier: Apache-2.0
"""IpcClient ↔ BackendServer over a real Unix socket (wire-protocol §1-§4, §6; TV-I1..TV-I5).

Client behaviour that a well-behaved backend never provokes (retries, timeouts, bad frames) is
driven by `RawServer`, a scripted peer; server behaviour that the client never provokes (bad
envelopes, pipelining, no chunk negotiation) is driven by raw frames on a plain connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import stat
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgpack
import numpy as np
import pytest

from sie_sidecar import wire
from sie_sidecar.backend import BackendServer, NullAdapter
from sie_sidecar.backend.config_registry import registry_hash
from sie_sidecar.backend.null import pad_result
from sie_sidecar.backend.server import encode_response
from sie_sidecar.errors import (
    BudgetExceeded,
    ChunkProtocolError,
    DecodeError,
    FrameTooLarge,
    IpcServerError,
    ProtocolError,
)
from sie_sidecar.ipc.client import IpcClient, IpcTimeout, IpcTransportError, observe_ipc
from sie_sidecar.ipc.mux import MuxIpcClient
from sie_sidecar.ipc.requests import run_batch_request
from sie_sidecar.ipc.types import ModelDescriptor, PingResponse, ReadyResponse
from sie_sidecar.telemetry import (
    IPC_ACQUIRE_DURATION,
    IPC_CAPACITY,
    IPC_CHUNK_COUNT,
    IPC_CHUNK_RESERVED,
    IPC_INFLIGHT,
    IPC_RECONSTRUCTED_SIZE,
    IPC_REQUESTS,
    IPC_RESPONSE_CHUNKS,
    Registry,
)
from sie_sidecar.wire.limits import MAX_FRAME, MiB
from sie_sidecar.wire.workitem import decode_work_item

MODEL = "null/model"
NOT_NEGOTIATED = "IPC response exceeds the legacy frame limit; response chunking v1 was not negotiated"

TV_I1_FRAME = bytes.fromhex(
    "00000038"
    "85a776657273696f6e01aa726571756573745f6964a7722d736d616c6ca26f6bc3a4626f647981a576616c756593010203a56572726f72c0"
)
TV_I2_REQUEST = bytes.fromhex(
    "0000002c84a776657273696f6ecd03e7a66d6574686f64a450696e67aa726571756573745f6964a27231a4626f647980"
)
TV_I2_RESPONSE = bytes.fromhex(
    "0000004085a776657273696f6e01aa726571756573745f6964a27231a26f6bc2a4626f6479c0a56572726f72"
    "b7756e737570706f727465642076657273696f6e20393939"
)
TV_I3_FRAME = bytes.fromhex(
    "0000006185a776657273696f6e01a66d6574686f64a450696e67aa726571756573745f6964a3772d31be616363657074735f6970"
    "635f726573706f6e73655f6368756e6b735f7631c3a4626f647981ac74696d657374616d705f6d73cb4045000000000000"
)
TV_I10_BODY = bytes.fromhex("82ac74696d657374616d705f6d73cb405ec00000000000a9776f726b65725f6964a3772d31")


# -- helpers ----------------------------------------------------------------------------------------


def pack(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def payload(op: str, i: int, text: str | None = None, **extra: Any) -> dict[str, Any]:
    """An Encode/Score/ExtractBatchItem with every required field."""
    item: dict[str, Any] = {
        "work_item_id": f"r.{i}",
        "request_id": "r",
        "item_index": i,
        "total_items": 1000,
        "timestamp": 1.0,
    }
    text = f"text number {i}" if text is None else text
    if op == "score":
        item["query_item"] = {"text": text}
        item["score_items"] = [{"text": "alpha", "id": "a"}, {"text": text}]
    else:
        item["item"] = {"text": text, "id": f"id-{i}"}
    item["options"] = None
    item.update(extra)
    return item


def wrapped(op: str, i: int, **extra: Any) -> dict[str, Any]:
    """A RunBatchItem carrying `payload(op, i)` under its op key (other slots nil, as Rust writes)."""
    return {
        "op": op,
        "work_item_id": f"r.{i}",
        "request_id": "r",
        "item_index": i,
        "encode": payload(op, i, **extra) if op == "encode" else None,
        "score": payload(op, i, **extra) if op == "score" else None,
        "extract": payload(op, i, **extra) if op == "extract" else None,
        "traceparent": None,
        "tracestate": None,
    }


def run_batch_body(items: Sequence[dict[str, Any]], *, model: str = MODEL, lora_key: str = "") -> bytes:
    return pack(
        {
            "model_id": model,
            "batch_id": 0,
            "lora_key": lora_key,
            "total_cost": len(items),
            "items": list(items),
            "accepts_batched_f16_multivectors": True,
        }
    )


def envelope(request_id: str, ok: bool, body: Any, error: str | None) -> dict[str, Any]:
    return {"version": 1, "request_id": request_id, "ok": ok, "body": body, "error": error}


class RawConnection:
    """A plain client connection for sending hand-made frames to the backend."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.splitter = wire.FrameSplitter()
        self.pending: list[bytes] = []

    @classmethod
    async def open(cls, path: str) -> RawConnection:
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def request(self, method: str, request_id: str, body: Any, *, accepts: bool = True) -> None:
        await self.send(wire.encode_request(method, request_id, pack(body), accepts))

    async def read_raw(self, n: int) -> bytes:
        """Exactly n bytes (for byte-exact comparisons)."""
        return await asyncio.wait_for(self.reader.readexactly(n), 5.0)

    async def read_body(self) -> bytes:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(1 << 20), 10.0)
            assert data, "connection closed"
            self.pending.extend(bytes(b) for b in self.splitter.feed(data))
        return self.pending.pop(0)

    async def read_response(self) -> dict[str, Any]:
        decoded = msgpack.unpackb(await self.read_body(), raw=False)
        assert isinstance(decoded, dict)
        return decoded

    async def expect_closed(self) -> None:
        """The peer closes without sending anything (TV-I4)."""
        assert await asyncio.wait_for(self.reader.read(), 5.0) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


Respond = Callable[[int, bytes], "list[bytes] | None"]


class RawServer:
    """A scripted backend: `respond(connection_index, request_body)` returns the frame bodies to
    send (`[]` = stay silent) or None to close the connection without answering."""

    def __init__(self, path: str, respond: Respond, *, framed: bool = True) -> None:
        self.path = path
        self.respond = respond
        self.framed = framed  # False: the respond callback returns whole frames (headers included)
        self.requests: list[tuple[int, bytes]] = []  # (connection index, whole request frame)
        self.closed_by_client: list[int] = []
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_unix_server(self._handle, path=self.path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        index = self.connections
        self.connections += 1
        splitter = wire.FrameSplitter()
        try:
            while data := await reader.read(1 << 20):
                for body in splitter.feed(data):
                    self.requests.append((index, wire.encode_frame(body)))
                    frames = self.respond(index, bytes(body))
                    if frames is None:
                        return
                    for frame in frames:
                        writer.write(wire.encode_frame(frame) if self.framed else frame)
                    await writer.drain()
            self.closed_by_client.append(index)
        except ConnectionError:
            self.closed_by_client.append(index)
        finally:
            writer.close()
            self._tasks.discard(task)


def request_id_of(body: bytes) -> str:
    request = msgpack.unpackb(body, raw=False)
    assert isinstance(request, dict)
    return str(request["request_id"])


def ping_reply(request_id: str) -> bytes:
    return encode_response(request_id, True, {"timestamp_ms": 42.0, "worker_id": "raw"}, None)


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def sock_path(sock_dir: str) -> str:
    return os.path.join(sock_dir, "backend.sock")


@pytest.fixture
def adapter() -> NullAdapter:
    return NullAdapter(16, preloaded_models=(MODEL, "b/model"))


@pytest.fixture
async def backend(adapter: NullAdapter, sock_path: str) -> AsyncIterator[BackendServer]:
    server = BackendServer(adapter, sock_path, worker_id="worker-test")
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture(params=["pool", "mux"])
async def client(backend: BackendServer, request: pytest.FixtureRequest) -> AsyncIterator[IpcClient]:
    """Every test of the typed calls runs over both transports (wire-protocol §1.2)."""
    if request.param == "mux":
        ipc: IpcClient = MuxIpcClient(backend.socket_path, request_timeout_s=10.0)
    else:
        ipc = IpcClient(backend.socket_path, pool_size=2, request_timeout_s=10.0)
    try:
        yield ipc
    finally:
        await ipc.close()


@pytest.fixture
async def raw(backend: BackendServer) -> AsyncIterator[RawConnection]:
    conn = await RawConnection.open(backend.socket_path)
    try:
        yield conn
    finally:
        await conn.close()


# -- Ping, EnsureModelReady, WorkerCapabilities ------------------------------------------------------


async def test_ping_reports_worker_and_sorted_loaded_models(client: IpcClient, backend: BackendServer) -> None:
    assert backend.last_ping is None and backend.sidecar_stale
    pong = await client.ping(timestamp_ms=1234.5)
    assert pong == PingResponse(
        timestamp_ms=1234.5,
        worker_id="worker-test",
        ready=True,
        bundle_config_hash="",
        loaded_models=("b/model", MODEL),
    )
    assert backend.last_ping is not None and not backend.sidecar_stale


async def test_first_ping_frame_is_tv_i3(sock_path: str) -> None:
    async with (
        RawServer(sock_path, lambda _, body: [ping_reply(request_id_of(body))]) as server,
        IpcClient(sock_path) as ipc,
    ):
        pong = await ipc.ping(timestamp_ms=42.0)
        await ipc.ping(timestamp_ms=42.0)
    assert server.requests[0] == (0, TV_I3_FRAME)
    assert request_id_of(server.requests[1][1][4:]) == "w-2"
    assert pong.worker_id == "raw" and pong.loaded_models == ()


async def test_ensure_model_ready_loading_sequence(sock_path: str) -> None:
    adapter = NullAdapter(8, load_delay_s=0.2, retry_later_models=["gone"], failed_models=["broken"])
    async with BackendServer(adapter, sock_path, worker_id="w") as _, IpcClient(sock_path) as ipc:
        assert (await ipc.ensure_model_ready("m")).state == "loading_started"
        assert (await ipc.ensure_model_ready("m")) == ReadyResponse("loading_in_progress")
        assert (await ipc.ping()).loading_models == ("m",)
        await asyncio.sleep(0.25)
        ready = await ipc.ensure_model_ready("m")
        assert ready == ReadyResponse(
            "ready", batch_budget=64, descriptor=ModelDescriptor(max_seq_len=512, supports_run_batch=True)
        )
        pong = await ipc.ping()
        assert pong.loaded_models == ("m",) and pong.loading_models == ()
        assert (await ipc.ensure_model_ready("gone")) == ReadyResponse("retry_later")
        assert (await ipc.ensure_model_ready("broken")) == ReadyResponse("failed")


async def test_worker_capabilities_and_generate_cancel(client: IpcClient) -> None:
    caps = wire.decode_body(await client.call("WorkerCapabilities", pack({})))
    assert caps == {  # the null adapter's token streamer serves every loaded model
        "has_generation_models": True,
        "generation_models": ["b/model", MODEL],
        "supported_models": ["b/model", MODEL],
        "loaded_models": ["b/model", MODEL],
    }
    assert wire.decode_body(await client.call("SignalGenerateCancel", pack({"request_id": "x"}))) == {"matched": False}
    with pytest.raises(IpcServerError, match=r"^bad body for ApplyModelConfig: bundle_id is required"):
        await client.call("ApplyModelConfig", pack({}))  # checked before the adapter is asked
    config = f"sie_id: {MODEL}\n"
    apply: dict[str, Any] = {
        "bundle_id": "default",
        "model_id": MODEL,
        "epoch": 3,
        "bundle_config_hash": "h3",
        "profiles_added": [],
        "model_config": config,
    }
    # The null adapter keeps a config registry: the answer carries the hash of what it now holds.
    answer = await client.apply_model_config(apply)
    assert answer.applied and answer.bundle_config_hash == registry_hash("default", {MODEL: config})
    assert (await client.ping()).bundle_config_hash == answer.bundle_config_hash
    refused = await client.apply_model_config(apply | {"model_config": "reject: true"})
    assert not refused.applied and refused.bundle_config_hash == answer.bundle_config_hash
    with pytest.raises(IpcServerError, match="invalid"):
        await client.apply_model_config(apply | {"model_config": "invalid: true"})


async def test_model_config_methods_reach_the_adapters_hooks(sock_path: str) -> None:
    """Issue 11: ApplyModelConfig, ReplaceModelConfigs and SetPinnedModels are checked by the
    library (`bad body for <Method>: <detail>` before any hook runs) and carried out by the
    adapter's hooks; the answers come back in the spec's key order with its defaults."""
    from sie_sidecar.backend.model_config import (
        ApplyModelConfigRequest,
        ConfigApplied,
        PinnedApplied,
        ReplaceModelConfigsRequest,
    )

    seen: list[object] = []

    class Configurable(NullAdapter):
        async def apply_model_config(self, request: ApplyModelConfigRequest) -> ConfigApplied:
            seen.append(request)
            return ConfigApplied(True, "h4", config_version=4, unsupported_models=["z/m", "a/m"])

        async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ConfigApplied:
            seen.append(request)
            return ConfigApplied(True, "h5", config_version=5, applied_models=[m.model_id for m in request.models])

        async def set_pinned_models(self, models: tuple[str, ...]) -> PinnedApplied:
            seen.append(models)
            return PinnedApplied(True, len(models))

    server = BackendServer(Configurable(8), sock_path, worker_id="w")
    await server.start()
    ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=10.0)
    try:
        body = {
            "bundle_id": "default",
            "model_id": MODEL,
            "epoch": 4,
            "bundle_config_hash": "h4",
            "model_config": f"sie_id: {MODEL}\n",
            "bundle_adapters": ["a.b"],
        }
        answer = msgpack.unpackb(await ipc.call("ApplyModelConfig", pack(body)))
        assert list(answer.items()) == [
            ("applied", True),
            ("bundle_config_hash", "h4"),
            ("config_version", 4),
            ("unsupported_models", ["a/m", "z/m"]),
        ]
        assert seen[-1] == ApplyModelConfigRequest("default", MODEL, 4, "h4", f"sie_id: {MODEL}\n", (), ("a.b",))
        snapshot = {"bundle_id": "default", "epoch": 5, "bundle_config_hash": "h5", "models": []}
        answer = msgpack.unpackb(await ipc.call("ReplaceModelConfigs", pack(snapshot)))
        assert answer["applied_models"] == [] and answer["config_version"] == 5  # an empty snapshot is valid
        pinned = msgpack.unpackb(await ipc.call("SetPinnedModels", pack({"models": [MODEL, f"{MODEL}:l4"]})))
        assert pinned == {"applied": True, "pinned_count": 2}
        calls_before = len(seen)
        bad = [
            ("ApplyModelConfig", dict(body, model_config="   "), "model_config must not be blank"),
            ("ApplyModelConfig", dict(body, epoch=-1), "epoch is required and must be an unsigned integer"),
            ("ApplyModelConfig", dict(body, bundle_id=""), "bundle_id must not be empty"),
            ("ApplyModelConfig", dict(body, model_config="sie_id: other/model\n"), "model_id mismatch"),
            ("ApplyModelConfig", dict(body, model_config="- a list\n"), "model_config must be a YAML mapping"),
            ("ApplyModelConfig", dict(body, model_config="a: [unclosed\n"), "model_config is not valid YAML"),
            (
                "ReplaceModelConfigs",
                dict(snapshot, models=[{"model_id": "m/a", "model_config": "sie_id: m/b\n"}]),
                "model_id mismatch: models[0].model_config is for 'm/b', not 'm/a'",
            ),
            ("ReplaceModelConfigs", {k: v for k, v in snapshot.items() if k != "models"}, "models is required"),
            ("ReplaceModelConfigs", dict(snapshot, models=[{"model_id": 1}]), "models[0].model_id is required"),
            ("SetPinnedModels", {"models": [1]}, "models must be an array of strings"),
        ]
        for method, payload, detail in bad:
            with pytest.raises(IpcServerError, match=re.escape(f"bad body for {method}: {detail}")):
                await ipc.call(method, pack(payload))
        assert len(seen) == calls_before  # no hook ran for a malformed body
    finally:
        await ipc.close()
        await server.close()


# -- batches --------------------------------------------------------------------------------------------


async def test_rejected_items_come_first_with_nil_results(client: IpcClient) -> None:
    """Issue 11, as upstream's server answers: the items refused before the model ran come first in
    the outcomes (some callers bind outcomes by position), and an error outcome's `result_msgpack` is
    nil, not an empty bin; a missing `request_id` reads as ""."""
    broken = wrapped("encode", 1) | {"encode": None}  # op encode, but no encode payload
    anonymous = {k: v for k, v in wrapped("encode", 2).items() if k != "request_id"}
    anonymous["encode"] = None
    items = [wrapped("encode", 0), broken, wrapped("encode", 3), anonymous]
    outcomes = msgpack.unpackb(await client.call("RunBatch", run_batch_body(items)))["outcomes"]  # the wire itself
    assert [o["work_item_id"] for o in outcomes] == ["r.1", "r.2", "r.0", "r.3"]
    rejected = outcomes[:2]
    assert all(o["disposition"] == "publish_error_and_ack" and o["result_msgpack"] is None for o in rejected)
    assert rejected[1]["request_id"] == ""
    assert all(o["disposition"] == "publish_and_ack" and o["result_msgpack"] for o in outcomes[2:])


async def test_run_batch_round_trip_256_items(client: IpcClient, adapter: NullAdapter) -> None:
    items = [wrapped("encode", i) for i in range(256)]
    result = await client.run_batch(run_batch_body(items))
    assert [o.work_item_id for o in result.outcomes] == [f"r.{i}" for i in range(256)]
    assert result.batched_f16_multivectors == []
    for i, outcome in enumerate(result.outcomes):
        assert outcome.disposition == "publish_and_ack"
        assert (outcome.request_id, outcome.item_index, outcome.error, outcome.error_code) == ("r", i, None, None)
        expected = wire.frame_dense(adapter.vector(f"text number {i}"), item_id=f"id-{i}")
        assert outcome.result_msgpack == expected
        assert outcome.units == {"input_tokens": 3, "pages": None, "images": None, "audio_ms": None, "pairs": None}
        assert outcome.inference_ms is not None
    assert wire.response_budget().reserved == 0


async def test_run_batch_injects_lora_into_encode_items(client: IpcClient, adapter: NullAdapter) -> None:
    items = [wrapped("encode", 0), wrapped("encode", 1, options={"lora": "own"})]
    result = await client.run_batch(run_batch_body(items, lora_key="batch-lora"))
    by_id = {o.work_item_id: o.result_msgpack for o in result.outcomes}
    assert by_id["r.0"] == wire.frame_dense(adapter.vector("text number 0", "batch-lora"), item_id="id-0")
    assert by_id["r.1"] == wire.frame_dense(adapter.vector("text number 1", "own"), item_id="id-1")


async def test_run_batch_score_and_extract(client: IpcClient, adapter: NullAdapter) -> None:
    score = await client.run_batch(run_batch_body([wrapped("score", 0)], lora_key="ignored"))
    q = adapter.vector("text number 0")
    scores = np.array([np.dot(q, adapter.vector("alpha")), np.dot(q, q)], dtype=np.float32)
    assert score.outcomes[0].result_msgpack == wire.frame_score(scores, ["a", "item-1"])
    assert score.outcomes[0].units is not None and score.outcomes[0].units["pairs"] == 2
    extract = await client.run_batch(run_batch_body([wrapped("extract", 0)]))
    assert extract.outcomes[0].result_msgpack == wire.frame_extract({"entities": []}, "id-0")


async def test_run_batch_item_rejections(client: IpcClient) -> None:
    mixed = await client.run_batch(run_batch_body([wrapped("encode", 0), wrapped("score", 1)]))
    assert [(o.work_item_id, o.disposition, o.error_code) for o in mixed.outcomes] == [
        ("r.0", "publish_error_and_ack", "run_batch_mixed_op"),
        ("r.1", "publish_error_and_ack", "run_batch_mixed_op"),
    ]
    hollow = wrapped("encode", 1)
    hollow["encode"] = None
    partial = await client.run_batch(run_batch_body([wrapped("encode", 0), hollow]))
    codes = {o.work_item_id: (o.disposition, o.error_code) for o in partial.outcomes}
    assert codes == {"r.0": ("publish_and_ack", None), "r.1": ("publish_error_and_ack", "run_batch_invalid_item")}
    assert (await client.run_batch(run_batch_body([]))).outcomes == []


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda b: b["items"][0].update(op="generate"), "items[0].op 'generate' is not one of encode, score, extract"),
        (lambda b: b.pop("lora_key"), "lora_key is required and must be a string"),
        (lambda b: b["items"][0]["encode"].pop("timestamp"), "items[0].encode.timestamp is required"),
        (lambda b: b["items"][0].update(encode=[1]), "items[0].encode must be a map"),
    ],
)
async def test_run_batch_bad_body(client: IpcClient, mutate: Callable[[dict[str, Any]], object], detail: str) -> None:
    body = msgpack.unpackb(run_batch_body([wrapped("encode", 0)]), raw=False)
    mutate(body)
    with pytest.raises(IpcServerError) as info:
        await client.run_batch(pack(body))
    assert info.value.message.startswith(f"bad body for RunBatch: {detail}")
    assert client.open_connections == 1  # a server error keeps the slot


async def test_process_batch_methods(client: IpcClient, adapter: NullAdapter) -> None:
    body = pack({"model_id": MODEL, "items": [payload("encode", 0)], "accepts_batched_f16_multivectors": True})
    encoded = await client.process_batch("ProcessEncodeBatch", body)
    assert encoded.outcomes[0].result_msgpack == wire.frame_dense(adapter.vector("text number 0"), item_id="id-0")
    scored = await client.process_batch("ProcessScoreBatch", pack({"model_id": MODEL, "items": [payload("score", 0)]}))
    assert scored.outcomes[0].disposition == "publish_and_ack"
    body = pack({"model_id": MODEL, "items": [payload("extract", 0)]})
    extracted = await client.process_batch("ProcessExtractBatch", body)
    assert extracted.outcomes[0].result_msgpack == wire.frame_extract({"entities": []}, "id-0")
    with pytest.raises(IpcServerError, match=r"^bad body for ProcessScoreBatch: items\[0\]\.query_item"):
        await client.process_batch("ProcessScoreBatch", pack({"model_id": MODEL, "items": [payload("encode", 0)]}))
    with pytest.raises(ValueError, match="process_batch method"):
        await client.process_batch("RunBatch", body)


async def test_null_adapter_failure_modes(sock_path: str) -> None:
    adapter = NullAdapter(8, error_every=3, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock_path, worker_id="w") as _, IpcClient(sock_path) as ipc:
        result = await ipc.run_batch(run_batch_body([wrapped("encode", i) for i in range(7)]))
        errors = [o.item_index for o in result.outcomes if o.disposition == "publish_error_and_ack"]
        assert errors == [2, 5]
        assert {o.error_code for o in result.outcomes if o.item_index in errors} == {"inference_error"}
        unloaded = await ipc.run_batch(run_batch_body([wrapped("encode", 0)], model="other"))
        assert (unloaded.outcomes[0].disposition, unloaded.outcomes[0].nak_delay_ms) == ("nak_retry", 5000)


async def test_null_adapter_error_every_counts_across_batches(sock_path: str) -> None:
    """Every Nth inferred item fails however the sidecar batches: items sent one per batch (as
    just-in-time dispatch does under load) once all succeeded, because the count restarted per batch."""
    adapter = NullAdapter(8, error_every=2, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock_path, worker_id="w") as _, IpcClient(sock_path) as ipc:
        dispositions: list[str] = []
        for i in range(4):
            result = await ipc.run_batch(run_batch_body([wrapped("encode", i)]))
            dispositions.extend(o.disposition for o in result.outcomes)
        assert dispositions == ["publish_and_ack", "publish_error_and_ack"] * 2
        assert adapter.inferred == 4


def test_pad_result_keeps_msgpack_valid() -> None:
    for value in ({"a": 1}, {f"k{i}": i for i in range(15)}, [1, 2], list(range(20))):
        padded = pad_result(pack(value), 10)
        decoded = msgpack.unpackb(padded, raw=False)
        assert len(decoded) == len(value) + 1
    assert msgpack.unpackb(pad_result(pack({"a": 1}), 3), raw=False) == {"a": 1, "_pad": b"\0\0\0"}


# -- envelope errors (§1.3, §2.2) ----------------------------------------------------------------------


def test_response_encoding_is_tv_i1() -> None:
    body = encode_response("r-small", True, {"value": [1, 2, 3]}, None)
    assert wire.encode_frame(body) == TV_I1_FRAME
    assert wire.encode_response_frames(body, "r-small", accepts_chunks=True) == [body]


async def test_small_response_is_one_legacy_frame(raw: RawConnection) -> None:
    await raw.request("Drain", "r1", {"deadline_ms": 1000}, accepts=True)
    expected = wire.encode_frame(encode_response("r1", True, {"acknowledged": True}, None))
    assert await raw.read_raw(len(expected)) == expected


async def test_unsupported_version_is_tv_i2_and_keeps_the_connection(raw: RawConnection) -> None:
    await raw.send(TV_I2_REQUEST)
    assert await raw.read_raw(len(TV_I2_RESPONSE)) == TV_I2_RESPONSE
    await raw.request("Ping", "r2", {"timestamp_ms": 1.0})
    response = await raw.read_response()
    assert response["ok"] is True and response["request_id"] == "r2"


@pytest.mark.parametrize(
    ("request_map", "reply_id", "error"),
    [
        ({"version": True, "method": "Ping", "request_id": "r", "body": {}}, "r", "unsupported version True"),
        ({"method": "Ping", "request_id": "r", "body": {}}, "r", "unsupported version None"),
        ({"version": 1, "request_id": "r", "body": {}}, "r", "envelope missing fields"),
        ({"version": 1, "method": "Ping", "body": {}}, "", "envelope missing fields"),
        ({"version": 1, "method": "Ping", "request_id": 7, "body": {}}, "", "envelope missing fields"),
        ({"version": 1, "method": "Ping", "request_id": "r", "body": [1]}, "r", "envelope missing fields"),
        ({"version": 1, "method": "Foo", "request_id": "w-17", "body": {}}, "w-17", "unknown method Foo"),
        ({"version": 1, "method": "Ping", "request_id": "r", "body": {}}, "r", "bad body for Ping: timestamp_ms"),
        ({"version": 1, "method": "Ping", "request_id": "r"}, "r", "bad body for Ping: timestamp_ms"),
        ({"version": 1, "method": "EnsureModelReady", "request_id": "r", "body": None}, "r", "bad body for Ensure"),
    ],
)
async def test_envelope_errors(raw: RawConnection, request_map: dict[str, Any], reply_id: str, error: str) -> None:
    await raw.send(wire.encode_frame(pack(request_map)))
    response = await raw.read_response()
    assert list(response) == ["version", "request_id", "ok", "body", "error"]
    assert response["request_id"] == reply_id and response["ok"] is False and response["body"] is None
    assert response["error"].startswith(error)
    if error == "unknown method Foo":  # the example of wire-protocol §2.2, byte for byte
        assert response == envelope("w-17", False, None, "unknown method Foo")


async def test_nil_body_is_an_empty_map(raw: RawConnection) -> None:
    await raw.send(wire.encode_frame(pack({"version": 1, "method": "WorkerCapabilities", "request_id": "r"})))
    response = await raw.read_response()
    assert response["ok"] is True and response["body"]["has_generation_models"] is True  # the null adapter streams


@pytest.mark.parametrize(
    "data",
    [
        bytes.fromhex("00000003ffffff"),  # TV-I4: not msgpack
        wire.encode_frame(pack([1, 2, 3])),  # not a map
        bytes.fromhex("00000000"),  # TV-I5: empty body
        (MAX_FRAME + 1).to_bytes(4, "big"),  # TV-I5: declared over 32 MiB
        wire.encode_frame(b"\x81\xa1a\x01\xc1"),  # trailing garbage byte
    ],
    ids=["tv-i4", "non-map", "empty", "too-large", "trailing"],
)
async def test_protocol_errors_close_the_connection_silently(raw: RawConnection, data: bytes) -> None:
    await raw.send(data)
    await raw.expect_closed()


async def test_socket_is_owner_only(backend: BackendServer) -> None:
    assert stat.S_IMODE(os.stat(backend.socket_path).st_mode) == 0o600


# -- response chunking (§6) -----------------------------------------------------------------------------


async def test_oversized_response_is_chunked_and_reassembled(sock_path: str) -> None:
    budget = wire.response_budget()
    completed = budget.completed
    adapter = NullAdapter(8, oversized_bytes=33 * MiB, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock_path, worker_id="w") as _, IpcClient(sock_path) as ipc:
        ipc.telemetry = telemetry = Registry()
        observe_ipc(telemetry, [ipc])
        result = await ipc.run_batch(run_batch_body([wrapped("encode", i) for i in range(4)]))
        first = msgpack.unpackb(result.outcomes[0].result_msgpack, raw=False)
        assert len(first["_pad"]) == 33 * MiB
        assert result.outcomes[1].result_msgpack == wire.frame_dense(adapter.vector("text number 1"), item_id="id-1")
        assert budget.reserved == 0 and budget.completed == completed + 1
        # §13: one reassembled transfer, its chunk count and size; the budget's totals as exported.
        chunks = telemetry.histogram(IPC_CHUNK_COUNT)
        size = telemetry.histogram(IPC_RECONSTRUCTED_SIZE)
        assert chunks.count == 1 and chunks.sum >= 2 and size.count == 1 and size.sum > 33 * MiB
        points = {(p.name, p.attrs): p.value for p in telemetry.snapshot()}
        assert points[(IPC_RESPONSE_CHUNKS, (("outcome", "completed"),))] == budget.completed
        assert points[(IPC_CHUNK_RESERVED, ())] == 0
        assert points[(IPC_CAPACITY, (("transport", "pool"),))] == ipc.pool_size
        assert points[(IPC_INFLIGHT, (("transport", "pool"),))] == 0
        acquired = telemetry.histogram(IPC_ACQUIRE_DURATION, (("transport", "pool"), ("outcome", "success")))
        assert acquired.count == 1
        # The connection stays in step: the next call on it is an ordinary one.
        assert (await ipc.ping()).worker_id == "w"
        assert ipc.open_connections == 1


async def test_a_request_that_finds_an_idle_slot_records_no_wait(sock_path: str) -> None:
    """§13's acquire duration: a request that finds an idle slot takes it at once and records a
    wait of 0; one that waits for the slot to free (a pool of one, a slow batch ahead) records that
    wait."""
    adapter = NullAdapter(8, batch_delay_s=0.2, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock_path, worker_id="w") as _, IpcClient(sock_path, pool_size=1) as ipc:
        ipc.telemetry = telemetry = Registry()
        body = run_batch_body([wrapped("encode", 0)])
        await asyncio.gather(ipc.run_batch(body), ipc.run_batch(body))
        acquired = telemetry.histogram(IPC_ACQUIRE_DURATION, (("transport", "pool"), ("outcome", "success")))
        assert acquired.count == 2
        assert acquired.min == 0.0  # the first found the slot idle
        assert acquired.max >= 0.15  # the second waited for the first batch


@pytest.mark.parametrize("accepts", [False, 1, "true"])
async def test_oversized_response_without_negotiation_is_an_error(sock_path: str, accepts: object) -> None:
    adapter = NullAdapter(8, oversized_bytes=33 * MiB, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock_path, worker_id="w"):
        conn = await RawConnection.open(sock_path)
        try:
            request = {
                "version": 1,
                "method": "RunBatch",
                "request_id": "big",
                "accepts_ipc_response_chunks_v1": accepts,
                "body": msgpack.unpackb(run_batch_body([wrapped("encode", 0)]), raw=False),
            }
            await conn.send(wire.encode_frame(pack(request)))
            assert await conn.read_response() == envelope("big", False, None, NOT_NEGOTIATED)
        finally:
            await conn.close()


async def test_response_over_the_budget_discards_the_slot(sock_path: str) -> None:
    budget = wire.ResponseBudget(16 * MiB)
    adapter = NullAdapter(8, oversized_bytes=33 * MiB, preloaded_models=[MODEL])
    async with (
        BackendServer(adapter, sock_path, worker_id="w"),
        IpcClient(sock_path, pool_size=1, budget=budget) as ipc,
    ):
        with pytest.raises(BudgetExceeded):
            await ipc.run_batch(run_batch_body([wrapped("encode", 0)]))
        assert ipc.open_connections == 0 and budget.reserved == 0 and budget.budget_rejected == 1
        assert (await ipc.ping()).worker_id == "w"


@pytest.mark.slow
async def test_response_over_the_chunking_bounds_is_an_error(sock_path: str) -> None:
    adapter = NullAdapter(8, oversized_bytes=128 * MiB, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock_path, worker_id="w"), IpcClient(sock_path) as ipc:
        with pytest.raises(IpcServerError) as info:
            await ipc.run_batch(run_batch_body([wrapped("encode", 0)]))
    assert info.value.message == "IPC response exceeds the negotiated response chunking v1 bounds"


async def test_chunk_rule_violation_discards_the_slot(sock_path: str) -> None:
    digest = b"\0" * 32

    def respond(_: int, body: bytes) -> list[bytes]:
        rid = request_id_of(body)
        chunk = {
            "version": 1,
            "request_id": rid,
            "transfer_digest": digest,
            "chunk_index": 1,  # must start at 0
            "chunk_count": 9,
            "total_bytes": 33 * MiB,
            "payload": b"x" * 16,
            "kind": "ipc_response_chunk_v1",
        }
        return [pack(chunk)]

    async with RawServer(sock_path, respond) as server, IpcClient(sock_path, pool_size=1) as ipc:
        with pytest.raises(ChunkProtocolError):
            await ipc.run_batch(run_batch_body([]))
        assert ipc.open_connections == 0 and wire.response_budget().reserved == 0
        await _until(lambda: server.closed_by_client == [0])
        assert len(server.requests) == 1  # not retried


# -- client transport rules (§1.2, §1.4) ---------------------------------------------------------------


async def test_transport_error_is_retried_once_with_identical_bytes(sock_path: str) -> None:
    def respond(index: int, body: bytes) -> list[bytes] | None:
        return None if index == 0 else [ping_reply(request_id_of(body))]

    async with RawServer(sock_path, respond) as server, IpcClient(sock_path, pool_size=2) as ipc:
        pong = await ipc.ping(timestamp_ms=42.0)
    assert pong.worker_id == "raw"
    assert [index for index, _ in server.requests] == [0, 1]
    assert server.requests[0][1] == server.requests[1][1] == TV_I3_FRAME


async def test_a_request_body_goes_out_as_its_own_frame_and_a_retry_sends_identical_bytes(sock_path: str) -> None:
    """The dispatcher's `RequestBody` (its frame written around the body in place) reaches the
    backend as the frame of its bytes would, and the §1.2 retry on another connection resends
    exactly those bytes."""
    request = run_batch_request(MODEL, "encode", [_native_item(0), _native_item(1)], "", 2)

    def respond(index: int, body: bytes) -> list[bytes] | None:
        if index == 0:
            return None
        return [encode_response(request_id_of(body), False, None, "refused")]

    async with RawServer(sock_path, respond) as server, IpcClient(sock_path, pool_size=2) as ipc:
        with pytest.raises(IpcServerError, match="refused"):
            await ipc.run_batch(request)
    assert [index for index, _ in server.requests] == [0, 1]
    first, second = (frame for _, frame in server.requests)
    assert first == second == wire.encode_request("RunBatch", request_id_of(first[4:]), bytes(request), True)
    assert [i["work_item_id"] for i in msgpack.unpackb(first[4:])["body"]["items"]] == ["r.0", "r.1"]


def _native_item(i: int) -> Any:
    """A WorkItem decoded from its payload, as intake hands the dispatcher its items."""
    data = pack(
        {
            "work_item_id": f"r.{i}",
            "request_id": "r",
            "item_index": i,
            "total_items": 2,
            "operation": "encode",
            "model_id": MODEL,
            "pool_name": "default",
            "machine_profile": "l4",
            "reply_subject": "_INBOX.gw.r",
            "item": {"text": f"t{i}"},
        }
    )
    return decode_work_item(data)


async def test_a_retried_request_counts_as_success_after_retry_and_the_next_as_success(sock_path: str) -> None:
    """§13's outcome: the retry is remembered for its own request only, also when the same task
    makes the next one (the marker is compared, not reset, per request)."""

    def respond(index: int, body: bytes) -> list[bytes] | None:
        return None if index == 0 else [ping_reply(request_id_of(body))]

    async with RawServer(sock_path, respond), IpcClient(sock_path, pool_size=2) as ipc:
        ipc.telemetry = telemetry = Registry()
        await ipc.ping()
        await ipc.ping()
    counts = {p.attrs: p.value for p in telemetry.snapshot() if p.name == IPC_REQUESTS}
    assert counts == {
        (("method", "ping"), ("outcome", "success_after_retry")): 1,
        (("method", "ping"), ("outcome", "success")): 1,
    }


async def test_retry_prefers_another_warm_slot(sock_path: str) -> None:
    def respond(_: int, body: bytes) -> list[bytes] | None:
        return None if len(server.requests) == 3 else [ping_reply(request_id_of(body))]

    async with RawServer(sock_path, respond) as server, IpcClient(sock_path, pool_size=2) as ipc:
        await asyncio.gather(ipc.ping(), ipc.ping())  # both slots connected
        await ipc.ping()  # the third request's connection is dropped; the retry uses the other one
        assert ipc.open_connections == 1
    assert server.connections == 2
    assert server.requests[2][0] != server.requests[3][0] and server.requests[2][1] == server.requests[3][1]


async def test_second_transport_error_is_an_ipc_transport_error(sock_path: str) -> None:
    async with RawServer(sock_path, lambda _, __: None) as server, IpcClient(sock_path, pool_size=1) as ipc:
        with pytest.raises(IpcTransportError, match="failed after one retry"):
            await ipc.ping()
        assert ipc.open_connections == 0
    assert len(server.requests) == 2 and server.requests[0][1] == server.requests[1][1]


async def test_missing_socket_is_a_transport_error(sock_path: str) -> None:
    async with IpcClient(sock_path) as ipc:
        with pytest.raises(IpcTransportError) as info:
            await ipc.ping()
    assert isinstance(info.value.__cause__, FileNotFoundError)


async def test_timeout_discards_the_slot_and_is_not_retried(sock_path: str) -> None:
    def respond(index: int, body: bytes) -> list[bytes]:
        return [] if index == 0 else [ping_reply(request_id_of(body))]

    async with (
        RawServer(sock_path, respond) as server,
        IpcClient(sock_path, pool_size=1, request_timeout_s=0.2) as ipc,
    ):
        with pytest.raises(IpcTimeout):
            await ipc.ping()
        assert ipc.open_connections == 0
        await _until(lambda: server.closed_by_client == [0])
        assert len(server.requests) == 1
        assert (await ipc.ping()).worker_id == "raw"  # a fresh connection
        assert server.connections == 2


async def test_ensure_model_ready_uses_its_own_timeout(sock_path: str) -> None:
    async with (
        RawServer(sock_path, lambda _, __: []),
        IpcClient(sock_path, request_timeout_s=5.0, model_ready_timeout_s=0.1) as ipc,
    ):
        with pytest.raises(IpcTimeout, match=r"0\.1 s"):
            await ipc.ensure_model_ready("m")


@pytest.mark.parametrize(
    ("reply", "error", "kept"),
    [
        (lambda rid: pack([1, 2]), DecodeError, False),
        (lambda rid: encode_response("w-999", True, {}, None), ProtocolError, False),
        (lambda rid: encode_response(rid, True, None, None), ProtocolError, False),
        (lambda rid: encode_response(rid, True, {"ready": "yes"}, None), DecodeError, False),
        (lambda rid: pack({**envelope(rid, True, {}, None), "version": 2}), ProtocolError, True),
        (lambda rid: encode_response(rid, False, None, "boom"), IpcServerError, True),
    ],
    ids=["not-a-map", "other-id", "body-missing", "bad-field", "version-mismatch", "server-error"],
)
async def test_which_errors_keep_the_slot(
    sock_path: str, reply: Callable[[str], bytes], error: type[Exception], kept: bool
) -> None:
    async with (
        RawServer(sock_path, lambda _, body: [reply(request_id_of(body))]) as server,
        IpcClient(sock_path, pool_size=1) as ipc,
    ):
        with pytest.raises(error):
            await ipc.ping()
        assert ipc.open_connections == (1 if kept else 0)
        assert len(server.requests) == 1


async def test_declared_frame_over_32_mib_discards_the_slot(sock_path: str) -> None:
    async with (
        RawServer(sock_path, lambda _, __: [(MAX_FRAME + 1).to_bytes(4, "big")], framed=False) as server,
        IpcClient(sock_path, pool_size=1) as ipc,
    ):
        with pytest.raises(FrameTooLarge):
            await ipc.ping()
        assert ipc.open_connections == 0
        await _until(lambda: server.closed_by_client == [0])
        assert len(server.requests) == 1


async def test_oversized_request_writes_nothing(client: IpcClient) -> None:
    with pytest.raises(FrameTooLarge):
        await client.call("RunBatch", pack({"blob": bytes(MAX_FRAME)}))
    assert client.open_connections == 0


async def test_pool_runs_requests_concurrently(client: IpcClient) -> None:
    body = run_batch_body([wrapped("encode", i) for i in range(8)])
    results = await asyncio.gather(*(client.run_batch(body) for _ in range(6)))
    assert all(len(r.outcomes) == 8 for r in results)
    # The pool opened each of its connections; the mux carried all six on its one.
    assert client.open_connections == client.pool_size == (1 if isinstance(client, MuxIpcClient) else 2)


async def test_closed_client_refuses_calls(sock_path: str) -> None:
    adapter = SlowModelAdapter(8, preloaded_models=["slow"])
    async with BackendServer(adapter, sock_path, worker_id="w"):
        ipc = IpcClient(sock_path, pool_size=2)
        await asyncio.gather(ipc.ping(), ipc.ping())
        busy = asyncio.create_task(ipc.run_batch(run_batch_body([wrapped("encode", 0)], model="slow")))
        await asyncio.sleep(0.05)
        await ipc.close()
        assert ipc.open_connections == 1  # the busy one finishes its request first
        assert len((await busy).outcomes) == 1
        assert ipc.open_connections == 0
        with pytest.raises(IpcTransportError, match="closed"):
            await ipc.ping()


def test_client_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="pool_size"):
        IpcClient("/nonexistent", pool_size=0)
    with pytest.raises(ValueError, match="request_timeout_s"):
        IpcClient("/nonexistent", request_timeout_s=0)


# -- draining and heavy tasks --------------------------------------------------------------------------


async def test_drain_refuses_later_batches(client: IpcClient, backend: BackendServer) -> None:
    assert await client.drain(15000) is True
    assert backend.draining and backend.drain_deadline_ms == 15000
    assert await client.drain(2000) and await client.drain(9000)
    assert backend.drain_deadline_ms == 2000  # repeated calls only tighten the cap
    with pytest.raises(IpcServerError) as info:
        await client.run_batch(run_batch_body([wrapped("encode", 0)]))
    assert info.value.message == "draining"
    with pytest.raises(IpcServerError, match=r"^draining$"):
        await client.process_batch("ProcessEncodeBatch", pack({"model_id": MODEL, "items": []}))
    pong = await client.ping()  # cheap methods still answer, and `ready` is health, not drain state
    assert pong.ready is True
    assert await client.probe_draining(MODEL) is True  # the empty-batch probe is how a drain shows


@pytest.mark.parametrize("transport", ["pool", "mux"])
async def test_a_drain_ends_when_the_sidecar_that_asked_has_gone(
    adapter: NullAdapter, sock_path: str, transport: str
) -> None:
    """A sidecar restarted alone (SIGTERM: it sends Drain, then exits) must not leave the backend
    drained for the next one (the chaos rig's rolling_sidecar_restart left 83,929 of 100,000 items
    unserved): once the last connection has closed, batch work is taken again."""
    server = BackendServer(adapter, sock_path, worker_id="worker-test")
    await server.start()
    try:

        def connect() -> IpcClient:
            if transport == "mux":
                return MuxIpcClient(sock_path, request_timeout_s=10.0)
            return IpcClient(sock_path, pool_size=2, request_timeout_s=10.0)

        first, watcher = connect(), connect()
        assert await first.drain(15000) is True and await watcher.ping()
        await first.close()
        await asyncio.sleep(0.2)
        assert server.draining  # another connection (a sidecar still there) keeps it
        await watcher.close()
        await _until(lambda: not server.draining)  # the server's end of a close finishes on its own
        assert server.drain_deadline_ms is None
        second = connect()
        try:
            result = await second.run_batch(run_batch_body([wrapped("encode", 0)]))
            assert [o.work_item_id for o in result.outcomes] == ["r.0"]
        finally:
            await second.close()
    finally:
        await server.close()


async def test_a_drain_stays_with_keep_drain_and_for_the_backends_own(adapter: NullAdapter, sock_path: str) -> None:
    """`--keep-drain` (v0.7.1): a Drain lasts until restart. A drain the backend started itself
    (a graceful restart: the test hook) is never released by a disconnect."""
    server = BackendServer(adapter, sock_path, worker_id="worker-test", release_drain_on_disconnect=False)
    await server.start()
    try:
        ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=10.0)
        assert await ipc.drain(15000) is True
        await ipc.close()
        await _until(lambda: server.open_connections == 0)  # every connection's end has run
        assert server.draining
    finally:
        await server.close()
    own = BackendServer(adapter, sock_path, worker_id="worker-test")
    await own.start()
    try:
        own.drain_for(None)
        ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=10.0)
        assert await ipc.drain(15000) is True  # a Drain on top of the backend's own drain
        await ipc.close()
        await _until(lambda: own.open_connections == 0)
        assert own.draining
    finally:
        await own.close()


class SlowModelAdapter(NullAdapter):
    """Batches of the model "slow" take a while, so a later request can finish first."""

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        if model_id == "slow":
            await asyncio.sleep(0.3)
        return await super().run_batch(model_id, op, items, lora_key)


class BrokenAdapter(NullAdapter):
    """Returns an outcome msgpack cannot carry, or raises, depending on the model."""

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        if model_id == "raises":
            raise RuntimeError("kaput")
        return [{"work_item_id": "r.0", "result_msgpack": object()}]


@pytest.mark.parametrize(("model", "error"), [("raises", "RuntimeError: kaput"), ("unserializable", "TypeError: ")])
async def test_adapter_failures_become_error_envelopes(sock_path: str, model: str, error: str) -> None:
    async with (
        BackendServer(BrokenAdapter(8), sock_path, worker_id="w"),
        IpcClient(sock_path, pool_size=1) as ipc,
    ):
        with pytest.raises(IpcServerError) as info:
            await ipc.run_batch(run_batch_body([wrapped("encode", 0)], model=model))
        assert info.value.message.startswith(error)
        assert (await ipc.ping()).worker_id == "w" and ipc.open_connections == 1


async def test_heavy_requests_answer_out_of_order_on_one_connection(sock_path: str) -> None:
    adapter = SlowModelAdapter(8, preloaded_models=["slow", "fast"])
    async with BackendServer(adapter, sock_path, worker_id="w") as server:
        conn = await RawConnection.open(sock_path)
        try:
            slow = msgpack.unpackb(run_batch_body([wrapped("encode", 0)], model="slow"), raw=False)
            fast = msgpack.unpackb(run_batch_body([wrapped("encode", 1)], model="fast"), raw=False)
            await conn.send(
                wire.encode_request("RunBatch", "a", pack(slow)) + wire.encode_request("RunBatch", "b", pack(fast))
            )
            first, second = await conn.read_response(), await conn.read_response()
            assert (first["request_id"], second["request_id"]) == ("b", "a")
            assert first["body"]["outcomes"][0]["work_item_id"] == "r.1"
            assert second["body"]["outcomes"][0]["work_item_id"] == "r.0"
            # A batch still running when the server closes is cancelled, not leaked.
            await conn.request("RunBatch", "c", slow)
            await _until(lambda: server.in_flight == 1)
        finally:
            await conn.close()
    assert server.in_flight == 0


async def test_backend_subprocess_crash_is_a_transport_error(sock_path: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sie_sidecar.backend.cli",
        "--socket",
        sock_path,
        "--worker-id",
        "child",
        "--dim",
        "8",
        "--preload",
        MODEL,
        "--crash-after-batches",
        "1",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await _until(lambda: os.path.exists(sock_path), timeout=20.0)
        async with IpcClient(sock_path, pool_size=2) as ipc:
            assert (await ipc.ping()).worker_id == "child"
            with pytest.raises(IpcTransportError, match="failed after one retry"):
                await ipc.run_batch(run_batch_body([wrapped("encode", 0)]))
        assert await asyncio.wait_for(proc.wait(), 10.0) == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# -- typed bodies -------------------------------------------------------------------------------------


def test_ping_response_minimal_decode_is_tv_i10() -> None:
    pong = PingResponse.from_body(wire.decode_body(TV_I10_BODY))
    assert pong == PingResponse(timestamp_ms=123.0, worker_id="w-1")
    assert pong.ready is False and pong.bundle_config_hash == "" and pong.loaded_models == ()


@pytest.mark.parametrize(
    ("decode", "body"),
    [
        (PingResponse.from_body, {"ready": 1}),
        (PingResponse.from_body, {"loaded_models": ["a", 1]}),
        (PingResponse.from_body, {"timestamp_ms": True}),
        (ReadyResponse.from_body, {}),
        (ReadyResponse.from_body, {"state": "warming"}),
        (ReadyResponse.from_body, {"state": "ready", "batch_budget": -1}),
        (ReadyResponse.from_body, {"state": "ready", "descriptor": []}),
        (ModelDescriptor.from_body, {"supports_run_batch": "yes"}),
        (ModelDescriptor.from_body, {"max_seq_len": 1.5}),
    ],
)
def test_typed_bodies_reject_bad_types(decode: Callable[[Any], object], body: dict[str, Any]) -> None:
    with pytest.raises(DecodeError):
        decode(body)


def test_typed_bodies_round_trip_and_default() -> None:
    ready = ReadyResponse(
        "ready",
        batch_budget=32,
        descriptor=ModelDescriptor(tokenizer_id="t", output_types=("dense",)),
        max_batch_tokens=7,
    )
    assert ReadyResponse.from_body(wire.decode_body(pack(ready.to_body()))) == ready
    assert ReadyResponse.from_body({"state": "ready", "descriptor": {}}).descriptor == ModelDescriptor()
    assert ReadyResponse.from_body({"state": "ready", "unknown": 1}).batch_budget is None


async def _until(predicate: Callable[[], bool], *, timeout: float = 5.0) -> None:
    """Wait for a condition another task or process brings about."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_backend_subprocess_stops_cleanly_on_sigterm(sock_path: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sie_sidecar.backend.cli",
        "--socket",
        sock_path,
        "--worker-id",
        "child",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await _until(lambda: os.path.exists(sock_path), timeout=20.0)
        async with IpcClient(sock_path) as ipc:
            assert (await ipc.ensure_model_ready(MODEL)).state == "loading_started"
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10.0) == 0
        assert not os.path.exists(sock_path)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_stale_socket_path_is_cleared_and_a_live_one_refused(sock_path: str) -> None:
    """Issue 11: a regular file or a dead socket left at the path is removed at start; a socket
    another running server accepts on is refused, and that server keeps serving."""
    import socket as socket_module

    from sie_sidecar.backend.server import BackendAlreadyRunning

    with open(sock_path, "w") as f:  # a regular file left behind
        f.write("stale")
    first = BackendServer(NullAdapter(8), sock_path, worker_id="first")
    await first.start()
    await first.close()
    dead = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    dead.bind(sock_path)  # a socket nobody listens on (a crashed server's)
    dead.close()
    live = BackendServer(NullAdapter(8), sock_path, worker_id="live")
    await live.start()
    try:
        with pytest.raises(BackendAlreadyRunning, match="another backend is serving"):
            await BackendServer(NullAdapter(8), sock_path, worker_id="intruder").start()
        ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=5.0)
        try:
            assert (await ipc.ping()).worker_id == "live"
        finally:
            await ipc.close()
    finally:
        await live.close()
    os.mkdir(sock_path)
    try:
        with pytest.raises(FileExistsError, match="neither a socket nor a regular file"):
            await BackendServer(NullAdapter(8), sock_path, worker_id="x").start()
    finally:
        os.rmdir(sock_path)


async def test_worker_capabilities_report_what_the_adapter_serves(sock_path: str) -> None:
    """Issue 11: generation models come from the adapter (sorted, deduplicated, with the flag)."""

    class Generative(NullAdapter):
        def generation_models(self) -> list[str]:
            return ["z/gen", "a/gen", "z/gen"]

    server = BackendServer(Generative(8, preloaded_models=[MODEL]), sock_path, worker_id="w")
    await server.start()
    ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=5.0)
    try:
        caps = wire.decode_body(await ipc.call("WorkerCapabilities", pack({})))
        assert caps["has_generation_models"] is True and caps["generation_models"] == ["a/gen", "z/gen"]
        assert caps["loaded_models"] == [MODEL]
    finally:
        await ipc.close()
        await server.close()


async def test_ping_ready_awaits_the_adapters_health_hook(sock_path: str) -> None:
    """Issue 11: Ping's `ready` is the adapter's awaited health (a device check may await)."""
    checks: list[bool] = []

    class Checked(NullAdapter):
        async def health(self) -> bool:
            await asyncio.sleep(0)  # e.g. awaiting a device probe
            checks.append(True)
            return len(checks) < 2

    server = BackendServer(Checked(8), sock_path, worker_id="w")
    await server.start()
    ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=5.0)
    try:
        assert (await ipc.ping()).ready is True
        assert (await ipc.ping()).ready is False  # the device check failed
        assert len(checks) == 2
    finally:
        await ipc.close()
        await server.close()


async def test_a_stop_lets_in_flight_batches_finish_within_the_grace(sock_path: str) -> None:
    """Issue 11: closing the server without a Drain lets a batch in flight finish and answer
    (bounded by `stop_grace_s`), instead of cancelling it; past the bound it is cancelled."""
    for grace, answered in ((5.0, True), (0.05, False)):
        server = BackendServer(
            NullAdapter(8, batch_delay_s=0.3, preloaded_models=[MODEL]), sock_path, worker_id="w", stop_grace_s=grace
        )
        await server.start()
        ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=5.0)
        try:
            call = asyncio.ensure_future(ipc.run_batch(run_batch_body([wrapped("encode", 0)])))
            while not server._heavy:  # the batch is in flight
                await asyncio.sleep(0.01)
            await server.close()
            if answered:
                assert [o.disposition for o in (await call).outcomes] == ["publish_and_ack"]
            else:
                with pytest.raises(Exception):  # noqa: B017 (the connection went away mid-batch)
                    await call
        finally:
            await ipc.close()


def test_batched_f16_buffers_are_checked_before_they_are_sent() -> None:
    """Issue 11, wire-protocol §4.7: the library never sends a buffer the sidecar must refuse."""
    from sie_sidecar.backend.adapter import F16Multivector
    from sie_sidecar.backend.server import batched_f16_output

    good = batched_f16_output(b"\x00" * 24, [F16Multivector("a", 0, 2, 3), F16Multivector("b", 12, 2, 3)])
    assert good["items"][1] == {
        "work_item_id": "b",
        "byte_offset": 12,
        "byte_len": 12,
        "num_tokens": 2,
        "token_dims": 3,
    }
    for buffer, slices, why in [
        (b"\x00" * 3, [], "odd length"),
        (b"\x00" * 12, [F16Multivector("a", 2, 2, 3)], "outside the buffer"),
        (b"\x00" * 12, [F16Multivector("a", 1, 1, 1)], "outside the buffer or odd"),
        (b"\x00" * 24, [F16Multivector("a", 0, 2, 3), F16Multivector("a", 12, 2, 3)], "given twice"),
    ]:
        with pytest.raises(ValueError, match=why):
            batched_f16_output(buffer, slices)


async def test_the_pool_grows_by_an_engine_batched_models_width_once(sock_path: str) -> None:
    """wire-protocol §1.2 (newer than v0.7.1): a model reported with dispatch width > 1 adds that many
    connections (clamped to 1024), once per model; the pool never shrinks, and the extra slots carry
    concurrent batches that a pool of one would have queued."""
    adapter = NullAdapter(8, preloaded_models=(MODEL,), batch_delay_s=0.3)
    server = BackendServer(adapter, sock_path, worker_id="w")
    await server.start()
    ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=10.0)
    try:
        assert ipc.grow_for("engine/a", 1) == 1 and ipc.grow_for("engine/a", None) == 1  # width 1: no growth
        assert ipc.grow_for("engine/a", 3) == 4
        assert ipc.grow_for("engine/a", 8) == 4  # once per model
        assert ipc.grow_for("engine/b", 5000) == 4 + 1024  # clamped
        assert ipc.capacity == ipc.pool_size == 1028
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(*(ipc.run_batch(run_batch_body([wrapped("encode", i)])) for i in range(4)))
        assert loop.time() - started < 0.3 * 3  # concurrent, not one after another on one connection
        assert ipc.open_connections == 4
    finally:
        await ipc.close()
        await server.close()


async def test_a_mux_client_has_no_pool_to_grow(sock_path: str) -> None:
    ipc = MuxIpcClient(sock_path)
    try:
        assert ipc.grow_for("engine/a", 8) == ipc.capacity
    finally:
        await ipc.close()


async def test_the_reference_backend_answers_set_pinned_models(sock_path: str) -> None:
    """wire-protocol §3.5: the reference backend has a pinning hook; pinned configured models start
    loading (a backend keeps its pinned models resident)."""
    adapter = NullAdapter(8, load_delay_s=60.0)
    server = BackendServer(adapter, sock_path, worker_id="w")
    await server.start()
    ipc = IpcClient(sock_path, pool_size=1, request_timeout_s=10.0)
    try:
        answer = msgpack.unpackb(await ipc.call("SetPinnedModels", pack({"models": [MODEL, f"{MODEL}:l4", "b/m"]})))
        assert answer == {"applied": True, "pinned_count": 3}
        assert adapter.pinned == frozenset({MODEL, f"{MODEL}:l4", "b/m"})
        assert set(adapter.loading_models()) == {MODEL, "b/m"}
        assert msgpack.unpackb(await ipc.call("SetPinnedModels", pack({"models": []}))) == {
            "applied": True,
            "pinned_count": 0,
        }
    finally:
        await ipc.close()
        await server.close()
