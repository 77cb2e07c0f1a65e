# SPDX-License-Identifier: Apache-2.0
"""Intake (sidecar-behaviour §4.1): the verdict for one delivery, without awaiting, and the tombstones
that cancellation consults at every later stage (before payload fetch, after it, before IPC)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .. import wire
from ..logs import Throttled
from ..wire._switch import USING_NATIVE, load, twin
from ..wire.workitem import WorkItem, WorkItemError, decode_work_item
from .admission import Admission, item_admitted
from .delivery import Delivery
from .source import SettleHandle

log = logging.getLogger(__name__)
_warn = Throttled(log)


#: Accepted deliveries by model (arrival order), the NAKs, the drops.
Grouped = tuple[dict[str, list[Delivery]], list[Delivery], list[Delivery]]

#: The native intake of a whole batch (`_native.intake_batch`); None with the twins.
_intake_batch: Callable[..., Any] | None = load("intake").intake_batch if USING_NATIVE else None
#: Its twin (`_twins.intake.intake_batch`): the per-message loop over `Intake._decide`, the intake
#: with the twins and, whatever the selection, whenever a tombstone is set.
_intake_loop: Callable[..., Grouped] = twin("intake").intake_batch

#: Subjects whose model token is remembered (cleared when full; subjects are few per worker).
SUBJECT_CACHE_SIZE = 4096

Verdict = Literal["accept", "nak", "drop"]
ACCEPT: Final = "accept"  # grouped by model and handed on
NAK: Final = "nak"  # malformed subject, undecodable payload, or pool not admitted: NAK with the base delay
DROP: Final = "drop"  # unsafe reply subject or cancelled: ACK-dropped, nothing published


#: The one `Nats-` header a publisher sets itself (JetStream de-duplication); any other marks a
#: message the server copied (mirrors, sources, republish): not work for this worker.
_OWN_NATS_HEADER: Final = "nats-msg-id"


def server_copied(headers: Mapping[str, Any] | None) -> bool:
    """sidecar-behaviour §4.1 row 1 (newer than v0.7.1): a work message with a header beginning
    `Nats-` (case-insensitive) other than `Nats-Msg-Id` was copied by the server (e.g.
    `Nats-Stream-Source`) and is ACK-dropped without a reply. The twin of the native intake's check."""
    if not headers:
        return False
    for name in headers:
        lowered = name.lower() if isinstance(name, str) else ""
        if lowered.startswith("nats-") and lowered != _OWN_NATS_HEADER:
            return True
    return False


def _subject_wins(item: WorkItem, model: str, subject: str) -> None:
    """A payload naming another model than its subject: the subject's model is the one served."""
    _warn.warning(
        "payload model differs from the subject; the subject wins", key=subject, extra={"item": item.work_item_id}
    )
    item.model_id = model


@dataclass(frozen=True, slots=True)
class Verdicts:
    """A pulled batch after intake: accepted deliveries by model (arrival order), the NAKs, the
    drops, and the models whose group is *plain*: all of one operation, encode or score, with no
    options and no offloaded payload (`plain[model]` is that operation). A plain group needs no
    per-item operation split and no payload resolution; any subset of it stays plain."""

    groups: dict[str, list[Delivery]]
    naks: list[Delivery]
    drops: list[Delivery]
    plain: dict[str, str] = field(default_factory=dict)


class Intake:
    """The §4.1 checks and the two tombstone sets (`work_cancel`, `batch_cancel`)."""

    def __init__(self, tombstones: Any = None, batch_tombstones: Any = None) -> None:
        self.tombstones = tombstones if tombstones is not None else wire.TombstoneSet()
        self.batch_tombstones = batch_tombstones if batch_tombstones is not None else wire.BatchTombstones()
        #: The pool admission gate (§8), when the gateway is polled: row 11 checks each item against it.
        self.admission: Admission | None = None
        #: Items NAKed because their `admission_pool` was not admitted (metric reason `pool_not_assigned`).
        self.unadmitted = 0
        self._subjects: dict[str, tuple[str | None, bool]] = {}

    def _subject_info(self, subject: str) -> tuple[str | None, bool]:
        """The model token of a work subject and whether it is worker-direct, remembered per subject
        (a worker sees few of them)."""
        cache = self._subjects
        info = cache.get(subject)
        if info is None:
            info = (wire.model_from_subject(subject), wire.is_worker_direct_subject(subject))
            if len(cache) >= SUBJECT_CACHE_SIZE:
                cache.clear()
            cache[subject] = info
        return info

    def _model_of(self, subject: str) -> str | None:
        return self._subject_info(subject)[0]

    def verdicts(self, messages: Sequence[SettleHandle], release: Callable[[int], None] | None) -> Grouped:
        """`verdict` for a whole pulled batch: the accepted deliveries grouped by model (arrival
        order kept), then those to NAK and those to ACK-drop (`intake` without its hints)."""
        found = self.intake(messages, release)
        return found.groups, found.naks, found.drops

    def intake(self, messages: Sequence[SettleHandle], release: Callable[[int], None] | None) -> Verdicts:
        """The verdicts of a whole pulled batch and, per model, whether its group is plain. The
        subject is looked up once per run of equal subjects and the tombstones are checked for
        emptiness once per batch.

        While both tombstone sets are empty (no per-item cancellation lookup), the native core does
        the whole batch in one call (`_native.intake_batch`); `_twins.intake` is its twin (and gives
        no plain hints: they only let the dispatcher skip checks)."""
        check_cancel = self.any_tombstones()
        rule = self.admission.item_rule() if self.admission is not None else None
        if not check_cancel and _intake_batch is not None:
            found = _intake_batch(messages, self._subject_info, Delivery, WorkItem, release, admission=rule)
            if found is not None:
                groups, naks, drops, notes, plain = found
                for kind, d, detail in notes:
                    self._note(kind, d, detail)
                return Verdicts(groups, naks, drops, plain)
        return Verdicts(*_intake_loop(messages, self._subject_info, self._decide, release, check_cancel, rule))

    def _note(self, kind: str, d: Delivery, detail: str | None) -> None:
        """Log what intake found, native or twin (and make the subject's model win on a mismatch)."""
        subject = d.msg.subject
        if kind == "undecodable":
            _warn.warning("undecodable WorkItem", key=subject, extra={"subject": subject, "error": detail})
        elif kind == "copied":
            _warn.warning("server-copied work message; dropped", key=subject, extra={"subject": subject})
        elif kind == "unsafe":
            item_id = d.item.work_item_id if d.item is not None else None
            _warn.warning("unsafe reply subject; dropped", key=subject, extra={"item": item_id})
        elif kind == "unadmitted":
            self.unadmitted += 1
            _warn.warning(
                "work item's admission pool is not admitted; NAKed",
                key=f"unadmitted:{detail}",
                extra={"admission_pool": detail, "reason": "pool_not_assigned"},
            )
        elif d.item is not None:  # "mismatch"
            _subject_wins(d.item, d.model, subject)

    def verdict(self, msg: SettleHandle, release: Callable[[int], None] | None) -> tuple[Delivery, Verdict]:
        """§4.1 checks for one message, without awaiting: the verdict says how `handle` settles it."""
        model, direct = self._subject_info(msg.subject)
        rule = self.admission.item_rule() if self.admission is not None else None
        return self._decide(msg, model, direct, release, self.any_tombstones(), rule=rule)

    def _decide(
        self,
        msg: SettleHandle,
        model: str | None,
        direct: bool,
        release: Callable[[int], None] | None,
        check_cancel: bool,
        *,
        rule: tuple[bool, str, frozenset[str]] | None = None,
    ) -> tuple[Delivery, Verdict]:
        """The §4.1 rules for one message whose subject gave `model` (None: malformed) and `direct`;
        `check_cancel` is false while both tombstone sets are empty; `rule` is the admission rule.
        The twin intake (`_twins.intake`) calls it for each message of a batch."""
        d = Delivery(msg=msg, worker_direct=direct, release=release)
        if server_copied(getattr(msg, "headers", None)):
            self._note("copied", d, None)
            return d, DROP
        if model is None:
            return d, NAK
        try:
            d.item = item = decode_work_item(msg.data)
        except WorkItemError as exc:
            self._note("undecodable", d, str(exc))
            return d, NAK
        if not wire.is_safe_reply_subject(item.reply_subject):
            self._note("unsafe", d, None)
            return d, DROP
        if check_cancel and item.operation != "generate" and self.cancelled(d):
            return d, DROP
        if rule is not None and not item_admitted(item.admission_pool, rule):  # row 11, generation too
            self._note("unadmitted", d, item.admission_pool)
            return d, NAK
        d.model = model
        if item.model_id != model:
            self._note("mismatch", d, None)
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


__all__ = ["ACCEPT", "DROP", "NAK", "Intake", "Verdict", "Verdicts", "server_copied"]
