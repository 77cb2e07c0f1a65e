# SPDX-License-Identifier: Apache-2.0
"""Generation (sidecar-behaviour §4.4, §14; wire-protocol §5): each `generate` delivery runs as its
own task, never scheduled or batched, holding its pull permit until it is settled.

In order: the unsupported-model check (NAK base, §13 reason `model_unsupported`), EnsureModelReady
on the model's child (loading and failure answered with the terminal chunk of TV-G1, then ACK), the
WorkItem decoded for re-encoding (repeated keys kept detectable for the media rules; an item that
cannot be decoded is the re-encode failure: `internal_error` result, ACK), the offloaded payload
fetched and inlined, base64 images normalised to binary, then, under the execution barrier's
shared side for the whole stream, the hash gate, the WorkItem re-encoded in the sidecar's order, and
ProcessGenerate on a fresh connection. Its events drive the delivery: `publish` goes to the item's
reply subject (the executed hash stamped last when the item carries one), `ack` / `nak` settle (the
first wins), `in_progress` progress-ACKs, `done` ends it, other kinds are logged and ignored; a
stream that ends or fails unsettled is NAKed with the base delay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import (
    BACKEND_UNAVAILABLE,
    BUNDLE_CONFIG_MISMATCH,
    INTERNAL_ERROR,
    INVALID_INPUT,
    MODEL_LOAD_FAILED,
    MODEL_LOADING,
    PAYLOAD_TOO_LARGE,
    RETRY_LATER,
    TRANSPORT_FAILURE,
    DecodeError,
    GenerateMediaError,
    PayloadError,
)
from ..ipc.types import FAILED, LOADING_IN_PROGRESS, LOADING_STARTED, READY, GenerateEvent, ReadyResponse
from ..logs import Throttled
from ..payloads import PayloadStore
from ..prep.generate_media import normalise_generate_images
from ..prep.media import unpack_value
from ..telemetry import GENERATION_LOADING_RESPONSES, WORK_ITEM_AGE, Registry
from ..wire.generation import encode_sidecar_work_item, stamp_executed_hash, terminal_chunk
from .config_gate import ConfigState
from .delivery import Delivery, Settler
from .outcomes import Outcomes
from .replies import error_result

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: `loading_in_progress` whose terminal chunk could not be published: NAK min(2 x base, 15 s).
LOADING_NAK_CAP_MS = 15_000
#: §13's NATS reason for a NAK of an item whose model is unsupported here (newer than v0.7.1).
MODEL_UNSUPPORTED = "model_unsupported"


class GenerateClient(Protocol):
    """The backend child a model is placed on, as generation uses it."""

    @property
    def reported_hash(self) -> str | None: ...

    def generate(
        self, model_id: str, work_item_msgpack: bytes, *, frame_timeout_s: float = ...
    ) -> AsyncIterator[GenerateEvent]: ...


class GenerateBackend(Protocol):
    async def ensure_model_ready(self, model_id: str) -> ReadyResponse: ...
    async def client_for(self, model_id: str) -> Any: ...
    async def signal_generate_cancel(self, request_id: str) -> bool: ...


class ChunkSink(Protocol):
    """Raw NATS Core publishes (`bus.publisher.Publisher.publish_raw`): True when handed to the connection."""

    async def publish_raw(self, subject: str, payload: bytes) -> bool: ...


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    worker_id: str
    nak_delay_ms: int = 5000
    frame_timeout_s: float = 300.0


class _StreamFailed(Exception):
    """The stream cannot go on (bad publish event, publish failure): NAK if unsettled."""


class Generations:
    """Runs the generation tasks and joins them at shutdown (§15.4 step 6)."""

    def __init__(
        self,
        settings: GenerationSettings,
        *,
        backend: GenerateBackend,
        sink: ChunkSink,
        settler: Settler,
        outcomes: Outcomes,
        config: ConfigState,
        payloads: PayloadStore | None = None,
    ) -> None:
        self._s = settings
        self._backend = backend
        self._sink = sink
        self._settler = settler
        self._out = outcomes
        self._config = config
        self._payloads = payloads
        self._tasks: set[asyncio.Task[None]] = set()
        self.streams = 0
        #: Where `sie.worker.generation.model_loading.responses` is recorded (§13); None: metrics off.
        self.telemetry: Registry | None = None

    @property
    def active(self) -> int:
        return len(self._tasks)

    def start(self, d: Delivery) -> asyncio.Task[None]:
        """Run one generate delivery in its own task (its permit comes back when it is settled)."""
        task = asyncio.create_task(self._run(d), name="generate")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def join(self, timeout_s: float) -> None:
        """Wait for the running generations (bounded); the rest are cancelled and NAK their items."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def cancel(self, request_id: str) -> bool:
        """`cancel.{router}.{request}`: SignalGenerateCancel to every backend child (§14)."""
        try:
            return await self._backend.signal_generate_cancel(request_id)
        except Exception as exc:
            _warn.warning("SignalGenerateCancel failed", key="cancel", extra={"error": repr(exc)})
            return False

    # -- one generation -----------------------------------------------------------------------

    async def _run(self, d: Delivery) -> None:
        base = self._s.nak_delay_ms
        try:
            await self._serve(d)
        except Exception as exc:  # cancellation (shutdown) passes through; the NAK below still runs
            _warn.warning("generation failed", key="generate", extra={"error": repr(exc)})
            if not d.settled:
                await self._refuse(d, TRANSPORT_FAILURE, f"generation failed: {exc}", nak_ms=base)
        finally:
            if not d.settled:
                await self._settler.nak(d, base)

    async def _refuse(self, d: Delivery, code: str, message: str, *, nak_ms: int, reason: str = "retry") -> None:
        """A delivery the sidecar cannot run: NAKed with `nak_ms` (§13 reason `reason`) on NATS; a local
        stream (whose handle can `refuse`) ends with `"CODE: message"` instead (§11: no broker to
        redeliver it)."""
        refuse = getattr(d.msg, "refuse", None)
        if refuse is None:
            await self._settler.nak(d, nak_ms, reason)
            return
        await refuse(code, message)
        await self._settler.drop(d)

    async def _terminal(self, d: Delivery, code: str, message: str, *, nak_ms: int) -> str:
        """Publish the TV-G1 terminal chunk, then ACK; NAK with `nak_ms` when the publish fails. An
        empty reply subject publishes nothing and ACKs. A local stream gets the code as its error.
        Returns §13's outcome: `success`, `publish_error` or `ack_error`."""
        item = d.item
        assert item is not None
        if hasattr(d.msg, "refuse"):
            await self._refuse(d, code, message, nak_ms=nak_ms)
            return "success"
        if item.reply_subject and not await self._sink.publish_raw(
            item.reply_subject, terminal_chunk(item.work_item_id, item.request_id, code, message)
        ):
            await self._settler.nak(d, nak_ms)
            return "publish_error"
        failed = self._settler.counts.settle_errors
        await self._settler.ack(d)
        return "ack_error" if self._settler.counts.settle_errors > failed else "success"

    def _loading_response(self, model: str, state: str, outcome: str) -> None:
        """`sie.worker.generation.model_loading.responses` for one terminal loading answer."""
        if self.telemetry is not None:
            attrs = (*self._config.catalog.model_attrs(model), ("state", state), ("outcome", outcome))
            self.telemetry.add(GENERATION_LOADING_RESPONSES, 1, attrs)

    def _record_age(self, timestamp: float) -> None:
        """§5.6: `sie.worker.work_item.age` at the generation's execution commit (metrics on,
        timestamp > 0)."""
        if self.telemetry is not None and timestamp > 0:
            age = max(0.0, time.time() - timestamp)
            self.telemetry.histogram(WORK_ITEM_AGE, (("operation", "generate"),)).record(age)

    async def _internal_error(self, d: Delivery, message: str) -> None:
        item = d.item
        assert item is not None
        if hasattr(d.msg, "refuse"):
            await self._refuse(d, INTERNAL_ERROR.upper(), message, nak_ms=self._s.nak_delay_ms)
            return
        result = error_result(
            item,
            code=INTERNAL_ERROR,
            message=message,
            worker_id=self._s.worker_id,
            worker_direct=d.worker_direct,
            current_hash=None,  # never stamped on synthetic generation errors (§6.1)
        )
        await self._out.publish_and_settle([(d, result)], nak_on_failure=True)

    async def _serve(self, d: Delivery) -> None:
        base = self._s.nak_delay_ms
        item = d.item
        assert item is not None
        model = item.model_id
        if not self._config.supports(model):  # first, before the backend is asked anything (§14)
            message = f"model '{model}' is not supported here"
            await self._refuse(d, BACKEND_UNAVAILABLE, message, nak_ms=base, reason=MODEL_UNSUPPORTED)
            return
        try:
            ready = await self._backend.ensure_model_ready(model)
        except Exception as exc:
            _warn.warning("EnsureModelReady failed", key=model, extra={"model": model, "error": repr(exc)})
            await self._refuse(d, BACKEND_UNAVAILABLE, f"EnsureModelReady failed: {exc}", nak_ms=base)
            return
        if ready.state == LOADING_STARTED:
            outcome = await self._terminal(d, MODEL_LOADING, f"Model '{model}' is loading; retry later.", nak_ms=base)
            self._loading_response(model, "loading_started", outcome)
            return
        if ready.state == LOADING_IN_PROGRESS:
            message = f"Model '{model}' is still loading; retry later."
            outcome = await self._terminal(d, MODEL_LOADING, message, nak_ms=min(2 * base, LOADING_NAK_CAP_MS))
            self._loading_response(model, "loading_in_progress", outcome)
            return
        if ready.state == FAILED:
            outcome = await self._terminal(d, MODEL_LOAD_FAILED, f"Model '{model}' failed to load.", nak_ms=base)
            self._loading_response(model, "failed", outcome)
            return
        if ready.state != READY:  # retry_later
            await self._refuse(d, RETRY_LATER, f"model '{model}' cannot take work now", nak_ms=base)
            return
        try:
            # Repeated keys stay detectable (the media rules refuse them); only generation pays for it.
            doc = unpack_value(d.msg.data)
        except Exception as exc:  # intake skips a key it does not know undecoded (a bad ext key, say)
            log.warning("generate work item could not be decoded for re-encoding", extra={"error": repr(exc)})
            await self._internal_error(d, "failed to encode generate work item")  # wire §10.1
            return
        if item.payload_ref and not await self._inline_payload(d, doc, item.payload_ref):
            return
        try:
            normalise_generate_images(doc.get("generate"))
        except GenerateMediaError as exc:
            await self._terminal(d, INVALID_INPUT, str(exc), nak_ms=base)
            return
        await self._stream(d, doc, model)

    async def _inline_payload(self, d: Delivery, doc: dict[str, Any], ref: str) -> bool:
        """Fetch the offloaded `generate` value into `doc`; False when the delivery was settled."""
        if self._payloads is None:
            await self._settler.nak(d, self._s.nak_delay_ms)
            return False
        try:
            blob = await self._payloads.fetch(ref)
        except PayloadError as exc:
            if exc.too_large:
                await self._terminal(d, PAYLOAD_TOO_LARGE, "generate payload is too large", nak_ms=self._s.nak_delay_ms)
            else:
                await self._settler.nak(d, self._s.nak_delay_ms)
            return False
        try:
            doc["generate"] = unpack_value(blob)
        except Exception:
            await self._internal_error(d, "failed to decode offloaded generate payload")  # wire §10.1
            return False
        doc["payload_ref"] = None
        return True

    async def _stream(self, d: Delivery, doc: dict[str, Any], model: str) -> None:
        base = self._s.nak_delay_ms
        item = d.item
        assert item is not None
        pinned = item.bundle_config_hash
        async with self._config.barrier.shared():  # held until the stream ends (§14)
            if self._config.gate((item,)) is None:  # `on_refused` is called: the reconciler looks now
                await self._refuse(
                    d, BUNDLE_CONFIG_MISMATCH, "the item's bundle config is not the advertised one", nak_ms=base
                )
                return
            try:
                body = encode_sidecar_work_item(doc)
            except Exception as exc:
                log.warning("generate work item could not be re-encoded", extra={"error": repr(exc)})
                await self._internal_error(d, "failed to encode generate work item")  # wire §10.1
                return
            client = await self._backend.client_for(model)
            if pinned and not self._config.executes_on(client.reported_hash):
                message = "the backend does not attest the advertised bundle config"
                await self._refuse(d, BUNDLE_CONFIG_MISMATCH, message, nak_ms=base)
                return
            self._record_age(item.timestamp)
            self.streams += 1
            events = client.generate(model, body, frame_timeout_s=self._s.frame_timeout_s)
            try:
                async for event in events:
                    if event.kind == "done":
                        break
                    await self._on_event(d, event, pinned)
            except _StreamFailed as exc:
                _warn.warning("generation stream failed", key=model, extra={"model": model, "error": str(exc)})
            finally:
                close: Callable[[], Any] | None = getattr(events, "aclose", None)
                if close is not None:
                    await close()

    async def _on_event(self, d: Delivery, event: GenerateEvent, pinned: str) -> None:
        item = d.item
        assert item is not None
        kind = event.kind
        if kind == "publish":
            reply = event.reply_subject
            if not reply.strip() or reply != item.reply_subject:
                raise _StreamFailed("publish event with an empty or foreign reply subject")
            try:
                payload = stamp_executed_hash(event.payload, pinned)
            except DecodeError as exc:
                raise _StreamFailed(str(exc)) from None
            if not await self._sink.publish_raw(reply, payload):
                raise _StreamFailed("chunk publish failed")
        elif kind in ("ack", "nak", "in_progress") and d.settled:
            # Over NATS the first settlement wins and later ones are ignored (§4.4). A local stream
            # (TV-G3) takes exactly one: a second ack, a progress or a NAK is a protocol error.
            if hasattr(d.msg, "refuse"):
                raise _StreamFailed(f"backend {kind} after the item was settled")
        elif kind == "ack":
            await self._settler.ack(d)
        elif kind == "nak":
            delay = event.delay_ms if event.delay_ms is not None else self._s.nak_delay_ms
            await self._settler.nak(d, delay)
        elif kind == "in_progress":
            await self._settler.progress(d)
        else:
            _warn.warning("unknown generation event ignored", key=kind, extra={"kind": kind})


__all__ = ["ChunkSink", "GenerateBackend", "GenerationSettings", "Generations"]
