# SPDX-License-Identifier: Apache-2.0
"""What the local socket hands to the pipeline (sidecar-behaviour §11): `publish_work` slots as
deliveries of the local `Source`, generation streams as deliveries of `Generations`, and `cancel`
as SignalGenerateCancel. The socket layer (`server`) knows nothing of the pipeline beyond this."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import msgpack

from .. import wire
from ..errors import BAD_OPERATION, POOL_ADMISSION_REJECTED_RESULT, WorkItemError
from ..pipeline.delivery import Delivery
from ..wire.types import WorkResult
from ..wire.workitem import WorkItem, decode_work_item
from .request import Body, admitted
from .source import LocalReplies, LocalSource, LocalWork, SlotHandle
from .streams import LocalStream


class GenerationRunner(Protocol):
    """`pipeline.generation.Generations`, as the local socket uses it."""

    def start(self, d: Delivery) -> asyncio.Task[None]: ...
    async def cancel(self, request_id: str) -> bool: ...


def _pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


class LocalPipeline:
    """Binds local requests to the pipeline of this process."""

    def __init__(
        self,
        *,
        source: LocalSource,
        replies: LocalReplies,
        generations: GenerationRunner,
        worker_id: str,
        pool: str,
        machine_profile: str,
        bundle: str,
    ) -> None:
        self.source = source
        self.replies = replies
        self.generations = generations
        self._worker_id = worker_id
        self._lane = (pool, machine_profile, bundle)
        self._subjects: dict[str, str] = {}

    def _subject(self, model: str) -> str:
        """The worker-direct subject a NATS delivery of this model would have (§4.1 reads it)."""
        subject = self._subjects.get(model)
        if subject is None:
            pool, profile, bundle = self._lane
            subject = wire.worker_direct_subject(pool, profile, bundle, model, self._worker_id)
            if wire.model_from_subject(subject) != model:
                raise ValueError(f"model id {model!r} does not survive the subject token mapping")
            if len(self._subjects) < 4096:
                self._subjects[model] = subject
        return subject

    def _error(self, item: dict[str, Any], code: str, message: str) -> bytes:
        result = WorkResult(
            work_item_id=str(item.get("work_item_id", "")),
            request_id=str(item.get("request_id", "")),
            item_index=int(item.get("item_index", 0)),
            success=False,
            error=message,
            error_code=code,
            worker_id=self._worker_id,
            worker_direct=True,
        )
        return bytes(wire.encode_work_result(result))

    def submit_work(self, body: Body, items: list[dict[str, Any]]) -> LocalWork:
        """Queue a checked `publish_work` request; slots that cannot run get their error at once
        (`generate` → bad_operation, disagreeing pools → pool_admission_rejected)."""
        runnable: list[bytes | None] = []
        errors: dict[int, bytes] = {}
        subject = "" if body.endpoint == "generate" else self._subject(body.model)
        for slot, item in enumerate(items):
            if body.endpoint == "generate":
                errors[slot] = self._error(item, BAD_OPERATION, "generate is not served by publish_work")
                runnable.append(None)
            elif not admitted(body, item):
                errors[slot] = self._error(
                    item, POOL_ADMISSION_REJECTED_RESULT, "admission pool does not match the lane"
                )
                runnable.append(None)
            else:
                runnable.append(b"")
        work = LocalWork(runnable, worker_id=self._worker_id)
        for slot, encoded in errors.items():
            work.results[slot] = encoded
        handles: list[SlotHandle] = []
        for slot, item in enumerate(items):
            if runnable[slot] is None:
                continue
            item["reply_subject"] = work.reply_subject(slot)
            data = _pack(item)
            try:
                decode_work_item(data)
            except WorkItemError as exc:
                raise ValueError(f"item {slot}: {exc}") from None
            handles.append(
                SlotHandle(
                    self.source,
                    work,
                    slot,
                    subject=subject,
                    data=data,
                    item_id=item["work_item_id"],
                    index=item["item_index"],
                )
            )
        self.replies.register(work)
        work.done.add_done_callback(lambda _: self.replies.unregister(work))
        self.source.put(handles)
        return work

    def forget(self, work: LocalWork) -> None:
        work.abandon()
        self.replies.unregister(work)

    def start_stream(self, stream: LocalStream, item: WorkItem) -> asyncio.Task[None]:
        """Run a generation stream through `Generations`, its chunks routed back to `stream`."""
        subject = stream.reply_subject
        self.replies.register_stream(subject, stream.on_chunk)
        d = Delivery(msg=stream, worker_direct=True, item=item, model=item.model_id)
        task = self.generations.start(d)
        task.add_done_callback(lambda _: self.replies.unregister_stream(subject))
        return task

    async def cancel(self, request_id: str) -> bool:
        return await self.generations.cancel(request_id)


__all__ = ["GenerationRunner", "LocalPipeline"]
