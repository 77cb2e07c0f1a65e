# SPDX-License-Identifier: Apache-2.0
"""Preparation of a model group whose model is ready (§4.2; scheduler-and-prep §7): the group is cut to
the model's batch budget and split by (operation, LoRA key); `load` items are ACKed and unknown
operations answered; then each part's payloads are fetched, media checked, text tokenized and audio
decoded, and the part goes into the model's lane with its costs. What fails here is answered per item;
the rest goes on."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Final

from ..errors import BAD_OPERATION, INVALID_REQUEST, PAYLOAD_ERROR
from ..ipc.requests import encode_item, lora_key
from ..ipc.types import ReadyResponse
from ..payloads import PayloadStore, resolve_items
from ..payloads.resolve import payload_ref_of
from ..prep import RegisteredTokenizer, TokenizerRegistry, encode_cost
from ..prep.audio import prepare_items
from ..prep.media import check_extract_work_item
from ..prep.offload import prepare_off_loop
from ..sched.costs import AUDIO_HARD_BATCH_COST_CAP, extract_cost, runs_alone, score_cost
from ..sched.lane import ModelLane
from ..wire.workitem import WorkItem
from .delivery import Delivery, Settler
from .lanes import ModelLanes
from .outcomes import Outcomes
from .stages import warn
from .sweeps import Sweeper

OVERFLOW_NAK_MS = 100
KNOWN_OPS = ("encode", "score", "extract")
#: The operation that only asks for its model to be loaded (ACKed once ready, no result).
LOAD_OP: Final = "load"


def _inline_text_only(ds: list[Delivery]) -> bool:
    """No extract item (media checks) and no offloaded payload among encode/score items: the one
    test per item that lets `_resolve_payloads` hand the group on untouched."""
    for d in ds:
        item = d.item
        if item is None or item.operation not in ("encode", "score") or payload_ref_of(item) is not None:
            return False
    return True


def _split_by_op(ds: list[Delivery]) -> tuple[dict[tuple[str, str], list[Delivery]], list[Delivery]]:
    """The (operation, LoRA key) groups of a model group, and the items of unknown operations. The
    common case, one known operation and no options anywhere, is one pass without a call per item."""
    first = ds[0].item
    assert first is not None
    op = first.operation
    if op in KNOWN_OPS and all(d.item is not None and d.item.operation == op and not d.item.options for d in ds):
        return {(op, ""): ds}, []
    by_op: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    unknown: list[Delivery] = []
    for d in ds:
        assert d.item is not None
        if d.item.operation in KNOWN_OPS:
            by_op[(d.item.operation, lora_key(d.item))].append(d)
        else:
            unknown.append(d)
    return by_op, unknown


class Preparation:
    """From a ready model's group to items queued in its lane's scheduler."""

    def __init__(
        self,
        outcomes: Outcomes,
        *,
        settler: Settler,
        sweeper: Sweeper,
        lanes: ModelLanes,
        payloads: PayloadStore | None,
    ) -> None:
        self._out = outcomes
        self._settler = settler
        self._sweeper = sweeper
        self._lanes = lanes
        self._payloads = payloads
        self.tokenizers = TokenizerRegistry()

    async def prepare(self, model: str, ds: list[Delivery], ready: ReadyResponse, plain_op: str | None) -> None:
        """`plain_op`: intake found every delivery of the group plain (`Verdicts.plain`), so the
        per-item operation split and payload checks are skipped."""
        budget = self._lanes.budget(model, ready)
        if len(ds) > budget:
            await self._out.nak_all(ds[budget:], OVERFLOW_NAK_MS)
            ds = ds[:budget]
        by_op, unknown = ({(plain_op, ""): ds}, []) if plain_op is not None else _split_by_op(ds)
        if unknown:
            loads = [d for d in unknown if d.item is not None and d.item.operation == LOAD_OP]
            if loads:  # §4.2 (newer than v0.7.1): `load` is answered by the model being ready
                await self._settler.ack_many(loads)
                unknown = [d for d in unknown if not d.settled]
        if unknown:
            await self._out.publish_errors(unknown, BAD_OPERATION, "unknown operation", nak_on_failure=True)
        lane = self._lanes.describe(model, ready)
        tokenizer = (
            await self.tokenizers.register_async(model, ready.descriptor)
            if "encode" in {op for op, _ in by_op}
            else None
        )
        if len(by_op) == 1:
            (op, lora), part = next(iter(by_op.items()))
            await self._enqueue(lane, op, lora, part, tokenizer, plain=plain_op is not None)
        else:
            await asyncio.gather(
                *(self._enqueue(lane, op, lora, part, tokenizer) for (op, lora), part in by_op.items())
            )

    async def _enqueue(
        self,
        lane: ModelLane[Delivery],
        op: str,
        lora: str,
        ds: list[Delivery],
        tokenizer: RegisteredTokenizer | None,
        *,
        plain: bool = False,
    ) -> None:
        """Payloads, media checks, tokenization and audio decoding for one (op, LoRA) group, then into
        the scheduler (`plain`: intake found nothing to fetch or check)."""
        ds = await self._sweeper.drop_cancelled(ds)  # before_payload_fetch
        if not plain:
            ds = await self._resolve_payloads(ds)
            ds = await self._sweeper.drop_cancelled(ds)  # after_payload_fetch
        if not ds:
            return
        if op == "encode":
            if tokenizer is not None:
                items = [d.item for d in ds if d.item is not None]
                prepared = await prepare_off_loop(tokenizer, [encode_item(item) for item in items])
                if tokenizer.sends_tokens:  # else the tokens only cost the items (unverifiable id)
                    for d, p in zip(ds, prepared, strict=True):
                        d.prepared_tokens = p
                costs = [encode_cost(p) for p in prepared]
            else:
                costs = [1] * len(ds)
        elif op == "score":
            costs = [score_cost(item.query_item, item.score_items) for item in (d.item for d in ds) if item is not None]
        else:
            await self._enqueue_extract(lane, op, lora, ds)
            return
        lane.scheduler.submit(op, lora, ds, costs)

    async def _enqueue_extract(self, lane: ModelLane[Delivery], op: str, lora: str, ds: list[Delivery]) -> None:
        """Audio preparation (scheduler-and-prep §7.3, §2.3): decoded audio replaces `audio` in the
        item map and costs its duration in ms, under a 720,000 ms hard cap; a refused item gets its
        own `invalid_request` error and ACK, and the rest go on."""
        decoded: list[tuple[Delivery, WorkItem]] = []
        for d in ds:
            assert d.item is not None  # intake decoded every delivery that reaches a scheduler
            decoded.append((d, d.item))
        preps = await prepare_items([item.item for _, item in decoded])
        refused: dict[str, list[Delivery]] = defaultdict(list)
        kept: list[Delivery] = []
        for (d, item), prep in zip(decoded, preps, strict=True):
            if prep.error is not None:
                refused[prep.error].append(d)
            else:
                if prep.item is not item.item:  # `audio` was taken out: the payload bytes are stale
                    item.item, item.raw = prep.item, None
                d.prepared_audio = prep.prepared
                kept.append(d)
        for message, group in refused.items():
            await self._out.publish_errors(group, INVALID_REQUEST, message, nak_on_failure=True)
        if kept:
            lane.scheduler.submit(
                op,
                lora,
                kept,
                [extract_cost(d.prepared_audio) for d in kept],
                [AUDIO_HARD_BATCH_COST_CAP if d.prepared_audio is not None else None for d in kept],
                alone=[runs_alone(d.prepared_audio) for d in kept],
            )

    async def _resolve_payloads(self, ds: list[Delivery]) -> list[Delivery]:
        """Inline offloaded payloads and check extract media (§4.2, §12; scheduler-and-prep §7.1).

        Each refused item gets its own error result (PAYLOAD_TOO_LARGE, payload_error or the media
        code) and is ACKed once that is published; the rest of the batch goes on.
        """
        if ds and _inline_text_only(ds):
            return ds  # the usual encode/score group: no media to check, nothing to fetch
        refused: list[tuple[Delivery, str, str]] = []
        checked: list[Delivery] = []
        for d in ds:  # inline extract media is checked before any fetch
            assert d.item is not None
            bad = check_extract_work_item(d.item) if d.item.operation == "extract" else None
            if bad is None:
                checked.append(d)
            else:
                refused.append((d, bad.code, bad.message))
        offloaded = [d for d in checked if d.item is not None and payload_ref_of(d.item) is not None]
        if offloaded:
            if self._payloads is None:
                refused += [(d, PAYLOAD_ERROR, "failed to resolve item") for d in offloaded]
            else:
                outcomes = await resolve_items(self._payloads, [d.item for d in offloaded if d.item is not None])
                for d, r in zip(offloaded, outcomes, strict=True):
                    if not r.ok:
                        extra = {"item": r.item.work_item_id, "reason": r.reason}
                        warn.warning("payload fetch failed", key=r.reason, extra=extra)
                        refused.append((d, r.code, r.message))
                        continue
                    d.item, d.payload_fetch_ms = r.item, r.fetch_ms
                    bad = check_extract_work_item(r.item) if r.item.operation == "extract" else None
                    if bad is not None:
                        refused.append((d, bad.code, bad.message))
        if not refused:
            return checked
        for code in dict.fromkeys(code for _, code, _ in refused):
            group = [(d, message) for d, c, message in refused if c == code]
            for message in dict.fromkeys(m for _, m in group):
                await self._out.publish_errors(
                    [d for d, m in group if m == message], code, message, nak_on_failure=True
                )
        gone = {id(d) for d, _, _ in refused}
        return [d for d in checked if id(d) not in gone]
