# SPDX-License-Identifier: Apache-2.0
"""Intake (sidecar-behaviour §4.1): the verdict for one delivery, without awaiting, and the tombstones
that cancellation consults at every later stage (before payload fetch, after it, before IPC)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, Literal

from .. import wire
from ..logs import Throttled
from ..wire.workitem import WorkItemError, decode_work_item
from .delivery import Delivery
from .source import SettleHandle

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: Subjects whose model token is remembered (cleared when full; subjects are few per worker).
SUBJECT_CACHE_SIZE = 4096

Verdict = Literal["accept", "nak", "drop"]
ACCEPT: Final = "accept"  # grouped by model and handed on
NAK: Final = "nak"  # malformed subject or undecodable payload: NAK with the base delay
DROP: Final = "drop"  # unsafe reply subject or cancelled: ACK-dropped, nothing published


class Intake:
    """The §4.1 checks and the two tombstone sets (`work_cancel`, `batch_cancel`)."""

    def __init__(self, tombstones: Any = None, batch_tombstones: Any = None) -> None:
        self.tombstones = tombstones if tombstones is not None else wire.TombstoneSet()
        self.batch_tombstones = batch_tombstones if batch_tombstones is not None else wire.BatchTombstones()
        self._subject_models: dict[str, str | None] = {}

    def _model_of(self, subject: str) -> str | None:
        """The model token of a work subject, remembered per subject (a worker sees few of them)."""
        cache = self._subject_models
        try:
            return cache[subject]
        except KeyError:
            pass
        model = wire.model_from_subject(subject)
        if len(cache) >= SUBJECT_CACHE_SIZE:
            cache.clear()
        cache[subject] = model
        return model

    def verdict(self, msg: SettleHandle, release: Callable[[int], None] | None) -> tuple[Delivery, Verdict]:
        """§4.1 checks for one message, without awaiting: the verdict says how `handle` settles it."""
        subject: str = msg.subject
        d = Delivery(msg=msg, worker_direct=wire.is_worker_direct_subject(subject), release=release)
        model = self._model_of(subject)
        if model is None:
            return d, NAK
        try:
            d.item = item = decode_work_item(msg.data)
        except WorkItemError as exc:
            _warn.warning("undecodable WorkItem", key=subject, extra={"subject": subject, "error": str(exc)})
            return d, NAK
        if not wire.is_safe_reply_subject(item.reply_subject):
            _warn.warning("unsafe reply subject; dropped", key=subject, extra={"item": item.work_item_id})
            return d, DROP
        if item.operation != "generate" and self.any_tombstones() and self.cancelled(d):
            return d, DROP
        if item.model_id != model:
            _warn.warning(
                "payload model differs from the subject; the subject wins",
                key=subject,
                extra={"item": item.work_item_id},
            )
            item.model_id = model
        d.model = model
        return d, ACCEPT

    def any_tombstones(self) -> bool:
        """False while both sets are empty (the usual case), so no item needs a lookup."""
        return bool(len(self.tombstones) or len(self.batch_tombstones))

    def cancelled(self, d: Delivery) -> bool:
        """Whether a decoded delivery's request was cancelled (`work_cancel`, or `batch_cancel` when worker-direct)."""
        item = d.item
        assert item is not None
        if self.tombstones.is_cancelled(item.router_id, item.request_id):
            return True
        return d.worker_direct and bool(self.batch_tombstones.is_cancelled(item.request_id))


__all__ = ["ACCEPT", "DROP", "NAK", "Intake", "Verdict"]
