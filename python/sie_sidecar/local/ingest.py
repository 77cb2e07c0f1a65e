# SPDX-License-Identifier: Apache-2.0
"""What the local socket hands to the pipeline (sidecar-behaviour §11): `publish_work` slots as
deliveries of the local `Source`, generation streams as deliveries of `Generations`, and `cancel`
as SignalGenerateCancel. The socket layer (`server`) knows nothing of the pipeline beyond this."""

from __future__ import annotations

import asyncio
from typing import Protocol

from .. import wire
from ..errors import BAD_OPERATION, POOL_ADMISSION_REJECTED_RESULT
from ..pipeline.delivery import Delivery
from ..wire.workitem import WorkItem
from .request import Body, check_items
from .source import LocalReplies, LocalSource, LocalWork, SlotHandle, new_token, slot_error
from .streams import LocalStream


class GenerationRunner(Protocol):
    """`pipeline.generation.Generations`, as the local socket uses it."""

    def start(self, d: Delivery) -> asyncio.Task[None]: ...
    async def cancel(self, request_id: str) -> bool: ...


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

    def _error(self, request_id: str, index: int, code: str, message: str) -> bytes:
        return slot_error(request_id, index, code, message, worker_id=self._worker_id)

    def submit_work(self, body: Body) -> LocalWork:
        """Check and queue a `publish_work` request (`ValueError` for a broken item rule); slots that
        cannot run get their error at once (`generate` → bad_operation, disagreeing pools →
        pool_admission_rejected)."""
        token = new_token()
        slots = check_items(body, token)
        rid = body.request_id
        generate = body.endpoint == "generate"
        subject = "" if generate else self._subject(body.model)
        errors: dict[int, bytes] = {}
        if generate or not all(slots.admitted):
            for n, (index, admitted) in enumerate(zip(slots.indexes, slots.admitted, strict=True)):
                if generate:
                    errors[n] = self._error(rid, index, BAD_OPERATION, "generate is not served by publish_work")
                elif not admitted:
                    message = "admission pool does not match the lane"
                    errors[n] = self._error(rid, index, POOL_ADMISSION_REJECTED_RESULT, message)
        work = LocalWork(len(slots), errors, worker_id=self._worker_id, token=token)
        source = self.source
        handles = [
            SlotHandle(source, work, n, subject=subject, data=data, item_id=f"{rid}.{index}", index=index)
            for n, (data, index) in enumerate(zip(slots.datas, slots.indexes, strict=True))
            if n not in errors
        ]
        self.replies.register(work)
        work.done.add_done_callback(lambda _: self.replies.unregister(work))
        source.put(handles)
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
