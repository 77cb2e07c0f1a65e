# SPDX-License-Identifier: Apache-2.0
"""Conformance kit for an IPC backend (wire-protocol §1-4): transcripts written from the spec, sent
as raw frames over the backend's Unix socket, every response field checked.

Why: a team swapping either half of a pod needs to know that their backend answers what a sidecar
sends, method by method, without a sidecar or NATS in the loop. Each check sends one request frame
(4-byte big-endian length + msgpack envelope) and checks the envelope (the five keys, in order) and
the body's required fields, types and rules; the model must be one the backend serves.

The same checks run two ways. `frames` (the default) writes the envelopes itself, so it proves the
backend against the spec alone. `client` sends the same request bodies through the sidecar's own IPC
client (its pool, envelope and response-chunk handling) and decodes every answer with the sidecar's
typed decoders as well (PingResponse, ReadyResponse, BatchOutcome): it proves the two halves of a
pod agree, not only each half against the spec.

Run it against any backend: `python -m sie_sidecar.tools.conformance --socket PATH [--model ID]
[--via frames|client]` prints pass/fail per check and exits 1 when any fails. `Drain` is checked last
and leaves the backend draining (for a few seconds at most: the request asks for a 1 s deadline).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgpack

from .. import wire
from ..errors import IpcServerError
from ..ipc.client import IpcClient
from ..ipc.types import PingResponse, ReadyResponse

ENVELOPE_KEYS = ["version", "request_id", "ok", "body", "error"]
READY_STATES = {"ready", "loading_started", "loading_in_progress", "retry_later", "failed"}
DISPOSITIONS = {"publish_and_ack", "publish_error_and_ack", "nak_retry"}


class Failed(Exception):
    """A check's expectation was not met (the message says which)."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


@dataclass
class Response:
    ok: bool
    body: Any
    error: str | None


class Caller(Protocol):
    """What a check sends its requests through."""

    async def call(self, method: str, body: Any, *, accepts_chunks: bool = False) -> Response: ...
    async def close(self) -> None: ...


class Connection:
    """One raw connection: whole frames out, whole frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float) -> None:
        self._reader, self._writer, self._timeout_s = reader, writer, timeout_s
        self._ids = 0

    @classmethod
    async def open(cls, path: str, timeout_s: float = 30.0) -> Connection:
        reader, writer = await asyncio.open_unix_connection(path, limit=64 << 20)
        return cls(reader, writer, timeout_s)

    async def call(self, method: str, body: Any, *, accepts_chunks: bool = False) -> Response:
        """Send a request; the response envelope must echo its id and carry the five keys in order."""
        self._ids += 1
        request_id = f"conf-{self._ids}"
        envelope = {
            "version": 1,
            "method": method,
            "request_id": request_id,
            "accepts_ipc_response_chunks_v1": accepts_chunks,
            "body": body,
        }
        payload = msgpack.packb(envelope, use_bin_type=True)
        self._writer.write(struct.pack(">I", len(payload)) + payload)
        await self._writer.drain()
        head = await asyncio.wait_for(self._reader.readexactly(4), self._timeout_s)
        raw = await asyncio.wait_for(self._reader.readexactly(struct.unpack(">I", head)[0]), self._timeout_s)
        got = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        expect(isinstance(got, dict), "the response frame is not a msgpack map")
        expect(list(got) == ENVELOPE_KEYS, f"envelope keys {list(got)} are not {ENVELOPE_KEYS} in order")
        expect(got["version"] == 1 and got["request_id"] == request_id, "version or request_id not echoed")
        expect(isinstance(got["ok"], bool), "ok is not a bool")
        if got["ok"]:
            expect(isinstance(got["body"], dict), "ok=true without a body map")
        else:
            expect(isinstance(got["error"], str) and bool(got["error"]), "ok=false without an error string")
        return Response(got["ok"], got["body"], got["error"])

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


#: The sidecar's typed decoder for each method's response body (the client path runs them too).
_TYPED: dict[str, Callable[[bytes], object]] = {
    "Ping": lambda raw: PingResponse.from_body(msgpack.unpackb(raw, raw=False)),
    "EnsureModelReady": lambda raw: ReadyResponse.from_body(msgpack.unpackb(raw, raw=False)),
    "RunBatch": wire.decode_batch_outcome,
    "ProcessEncodeBatch": wire.decode_batch_outcome,
    "ProcessScoreBatch": wire.decode_batch_outcome,
    "ProcessExtractBatch": wire.decode_batch_outcome,
}


class ClientCaller:
    """The checks' requests through the sidecar's `IpcClient` (which always offers response chunks),
    every answer decoded by the sidecar's typed decoder as well as checked field by field."""

    def __init__(self, client: IpcClient) -> None:
        self._client = client

    @classmethod
    async def open(cls, path: str, timeout_s: float = 30.0) -> ClientCaller:
        return cls(IpcClient(path, pool_size=1, request_timeout_s=timeout_s, model_ready_timeout_s=timeout_s))

    async def call(self, method: str, body: Any, *, accepts_chunks: bool = False) -> Response:
        try:
            raw = await self._client.call(method, msgpack.packb(body, use_bin_type=True))
        except IpcServerError as exc:
            return Response(False, None, exc.message)
        typed = _TYPED.get(method)
        if typed is not None:
            try:
                typed(raw)
            except Exception as exc:
                raise Failed(f"the sidecar's decoder refused the {method} answer: {type(exc).__name__}: {exc}") from exc
        got = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        expect(isinstance(got, dict), "the response body is not a msgpack map")
        return Response(True, got, None)

    async def close(self) -> None:
        await self._client.close()


def _item(op: str, i: int, model_text: str = "conformance") -> dict[str, Any]:
    payload: dict[str, Any] = {
        "work_item_id": f"conf.{i}",
        "request_id": "conf",
        "item_index": i,
        "total_items": 2,
        "timestamp": 1.0,
    }
    if op == "score":
        payload |= {"query_item": {"text": "query"}, "score_items": [{"text": "a", "id": "a"}, {"text": "b"}]}
    else:
        payload["item"] = {"text": f"{model_text} {i}"}
    if op == "extract":
        payload["labels"] = ["thing"]
    return payload


def _check_outcomes(body: Any, items: int) -> None:
    expect(isinstance(body.get("outcomes"), list), "outcomes is not an array")
    outcomes = body["outcomes"]
    expect(len(outcomes) == items, f"{len(outcomes)} outcomes for {items} items")
    ids = set()
    for o in outcomes:
        expect(isinstance(o, dict), "an outcome is not a map")
        for key, kind in (("work_item_id", str), ("request_id", str), ("item_index", int), ("disposition", str)):
            expect(isinstance(o.get(key), kind), f"outcome {key} missing or not {kind.__name__}")
        expect(o["disposition"] in DISPOSITIONS, f"unknown disposition {o['disposition']!r}")
        if o["disposition"] == "publish_and_ack":
            result = o.get("result_msgpack")
            expect(isinstance(result, bytes) or o.get("raw_output") is not None, "a success without a result")
        ids.add(o["work_item_id"])
    expect(ids == {f"conf.{i}" for i in range(items)}, "outcomes do not bind to the items sent")


Check = Callable[[Caller, str], Awaitable[None]]


async def check_ping(c: Caller, model: str) -> None:
    r = await c.call("Ping", {"timestamp_ms": 1234.5})
    expect(r.ok, f"Ping failed: {r.error}")
    expect(r.body.get("timestamp_ms") == 1234.5, "timestamp_ms not echoed")
    expect(isinstance(r.body.get("worker_id", ""), str), "worker_id is not a str")
    expect(isinstance(r.body.get("ready", False), bool), "ready is not a bool")
    loaded = r.body.get("loaded_models", [])
    expect(isinstance(loaded, list) and loaded == sorted(loaded), "loaded_models is not a sorted array")


async def check_ensure_model_ready(c: Caller, model: str) -> None:
    for _ in range(600):  # up to a minute for a load
        r = await c.call("EnsureModelReady", {"model_id": model})
        expect(r.ok, f"EnsureModelReady failed: {r.error}")
        state = r.body.get("state")
        expect(state in READY_STATES, f"unknown state {state!r}")
        if state == "ready":
            budget = r.body.get("batch_budget")
            expect(budget is None or (isinstance(budget, int) and budget >= 0), "batch_budget is not a uint")
            descriptor = r.body.get("descriptor")
            expect(descriptor is None or isinstance(descriptor, dict), "descriptor is not a map")
            return
        expect(state in {"loading_started", "loading_in_progress"}, f"model {model} is {state}")
        await asyncio.sleep(0.1)
    raise Failed(f"model {model} never became ready")


async def check_worker_capabilities(c: Caller, model: str) -> None:
    r = await c.call("WorkerCapabilities", {})
    expect(r.ok, f"WorkerCapabilities failed: {r.error}")
    for key in ("generation_models", "supported_models", "loaded_models"):
        value = r.body.get(key, [])
        expect(isinstance(value, list) and value == sorted(value), f"{key} is not a sorted array")
    expect(isinstance(r.body.get("has_generation_models", False), bool), "has_generation_models is not a bool")


def _run_batch_body(model: str, op: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    wrapped = [
        {
            "op": op,
            "work_item_id": p["work_item_id"],
            "request_id": p["request_id"],
            "item_index": p["item_index"],
            "encode": p if op == "encode" else None,
            "score": p if op == "score" else None,
            "extract": p if op == "extract" else None,
            "traceparent": None,
            "tracestate": None,
        }
        for p in items
    ]
    return {
        "model_id": model,
        "batch_id": 1,
        "lora_key": "",
        "total_cost": len(items),
        "items": wrapped,
        "accepts_batched_f16_multivectors": False,
    }


async def check_run_batch(c: Caller, model: str) -> None:
    r = await c.call("RunBatch", _run_batch_body(model, "encode", [_item("encode", 0), _item("encode", 1)]))
    expect(r.ok, f"RunBatch failed: {r.error}")
    _check_outcomes(r.body, 2)


async def check_run_batch_score(c: Caller, model: str) -> None:
    r = await c.call("RunBatch", _run_batch_body(model, "score", [_item("score", 0), _item("score", 1)]))
    expect(r.ok, f"RunBatch (score) failed: {r.error}")
    _check_outcomes(r.body, 2)


async def check_run_batch_extract(c: Caller, model: str) -> None:
    r = await c.call("RunBatch", _run_batch_body(model, "extract", [_item("extract", 0), _item("extract", 1)]))
    expect(r.ok, f"RunBatch (extract) failed: {r.error}")
    _check_outcomes(r.body, 2)


async def check_mixed_run_batch_is_refused_per_item(c: Caller, model: str) -> None:
    """One op per RunBatch: a mixed batch gets an error outcome for every item, not a failed call."""
    r = await c.call("RunBatch", _run_batch_body(model, "encode", [_item("encode", 0)]) | mixed_items(model))
    expect(r.ok, f"a mixed RunBatch failed the whole call: {r.error}")
    _check_outcomes(r.body, 2)
    expect(
        all(o["disposition"] == "publish_error_and_ack" for o in r.body["outcomes"]),
        "a mixed RunBatch was not refused item by item",
    )


def mixed_items(model: str) -> dict[str, Any]:
    encode = _run_batch_body(model, "encode", [_item("encode", 0)])["items"]
    score = _run_batch_body(model, "score", [_item("score", 1)])["items"]
    return {"items": encode + score, "total_cost": 2}


async def check_process_encode_batch(c: Caller, model: str) -> None:
    r = await c.call("ProcessEncodeBatch", {"model_id": model, "items": [_item("encode", 0), _item("encode", 1)]})
    expect(r.ok, f"ProcessEncodeBatch failed: {r.error}")
    _check_outcomes(r.body, 2)


async def check_unknown_method(c: Caller, model: str) -> None:
    r = await c.call("NoSuchMethod", {})
    expect(not r.ok and r.error == "unknown method NoSuchMethod", f"got {r.error!r}")


async def check_bad_body(c: Caller, model: str) -> None:
    r = await c.call("EnsureModelReady", {"model_id": 7})
    expect(not r.ok and (r.error or "").startswith("bad body for EnsureModelReady: "), f"got {r.error!r}")


async def check_signal_generate_cancel(c: Caller, model: str) -> None:
    r = await c.call("SignalGenerateCancel", {"request_id": "conf-unknown"})
    expect(r.ok and isinstance(r.body.get("matched"), bool), f"got {r.error or r.body!r}")


async def check_model_config_methods(c: Caller, model: str) -> None:
    """Each answers its response shape, or a typed error (not `unknown method`): all 13 are known.
    ProcessGenerate with an empty body is refused before any stream starts, so one answer comes."""
    for method in ("ApplyModelConfig", "ReplaceModelConfigs", "SetPinnedModels", "ProcessGenerate"):
        r = await c.call(method, {})
        expect(r.ok or not (r.error or "").startswith("unknown method"), f"{method} is unknown to the backend")


async def check_empty_run_batch(c: Caller, model: str) -> None:
    """§4.1: empty `items` → empty outcomes (a sidecar asks this way whether the backend is draining)."""
    r = await c.call("RunBatch", _run_batch_body(model, "encode", []))
    expect(r.ok, f"an empty RunBatch failed: {r.error}")
    expect(r.body.get("outcomes") == [], f"an empty RunBatch answered outcomes {r.body.get('outcomes')!r}")


async def check_drain(c: Caller, model: str) -> None:
    """§3.9: batch work (an empty batch too) is refused with `draining`; Ping still answers, and its
    `ready` stays the backend's health (a drain is not reported there)."""
    before = await c.call("Ping", {"timestamp_ms": 1.0})
    r = await c.call("Drain", {"deadline_ms": 1000})
    expect(r.ok and isinstance(r.body.get("acknowledged", False), bool), f"got {r.error or r.body!r}")
    refused = await c.call("RunBatch", _run_batch_body(model, "encode", [_item("encode", 0)]))
    expect(not refused.ok and refused.error == "draining", f"a batch after Drain got {refused.error or 'ok'!r}")
    empty = await c.call("RunBatch", _run_batch_body(model, "encode", []))
    expect(not empty.ok and empty.error == "draining", f"an empty batch after Drain got {empty.error or 'ok'!r}")
    after = await c.call("Ping", {"timestamp_ms": 2.0})
    expect(after.ok, f"Ping after Drain failed: {after.error}")
    ready = before.body.get("ready", False), after.body.get("ready", False)
    expect(ready[0] == ready[1], f"Ping's ready went {ready[0]} → {ready[1]} on Drain (it is health, not drain state)")


CHECKS: list[tuple[str, Check]] = [
    ("Ping", check_ping),
    ("EnsureModelReady", check_ensure_model_ready),
    ("WorkerCapabilities", check_worker_capabilities),
    ("RunBatch", check_run_batch),
    ("RunBatch empty", check_empty_run_batch),
    ("RunBatch score", check_run_batch_score),
    ("RunBatch extract", check_run_batch_extract),
    ("RunBatch mixed ops", check_mixed_run_batch_is_refused_per_item),
    ("ProcessEncodeBatch", check_process_encode_batch),
    ("unknown method", check_unknown_method),
    ("bad body", check_bad_body),
    ("SignalGenerateCancel", check_signal_generate_cancel),
    ("model config methods", check_model_config_methods),
    ("Drain (last: leaves the backend draining)", check_drain),
]


Via = Literal["frames", "client"]


async def run_checks(
    socket_path: str, model: str, checks: Sequence[tuple[str, Check]] = CHECKS, *, via: Via = "frames"
) -> list[tuple[str, str | None]]:
    """(name, None when it passed, else why it failed) for every check, in order, on one connection
    (`frames`: raw envelopes; `client`: the sidecar's IPC client and decoders)."""
    results: list[tuple[str, str | None]] = []
    conn: Caller = await (Connection.open(socket_path) if via == "frames" else ClientCaller.open(socket_path))
    try:
        for name, check in checks:
            try:
                await check(conn, model)
                results.append((name, None))
            except Failed as exc:
                results.append((name, str(exc)))
            except Exception as exc:  # a protocol break (closed connection, garbage frame)
                results.append((name, f"{type(exc).__name__}: {exc}"))
    finally:
        await conn.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", required=True, help="the backend's Unix socket path")
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="a model it serves")
    parser.add_argument(
        "--via",
        choices=["frames", "client"],
        default="frames",
        help="frames: raw envelopes written from the spec; client: the sidecar's own IPC client and decoders",
    )
    args = parser.parse_args(argv)
    results = asyncio.run(run_checks(args.socket, args.model, via=args.via))
    for name, failure in results:
        print(f"{'pass' if failure is None else 'FAIL'}  {name}" + ("" if failure is None else f": {failure}"))
    failed = sum(failure is not None for _, failure in results)
    print(f"{len(results) - failed}/{len(results)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
