# SPDX-License-Identifier: Apache-2.0
"""Twin of `_native.intake_batch` (`pipeline.intake.Intake.intake`): the verdicts of a pulled batch,
one message at a time (sidecar-behaviour §4.1).

The native intake applies the §4.1 rules to a whole batch in one call while no tombstone is set.
This loop asks `decide` (the per-message rules, `Intake._decide`, handed in with the delivery class,
the notes and the tombstones it needs) for each message's delivery and verdict, looks the subject up
once per run of equal subjects, and groups the accepted deliveries by model in arrival order. It is
the path with the twins and, whatever the selection, whenever a tombstone is set (the native intake
checks none). It gives no plain hints: they only let the dispatcher skip checks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

IMPLEMENTATION = "py"

#: `decide`'s verdicts (`pipeline.intake`'s): grouped by model, NAKed; anything else is dropped.
ACCEPT: Final = "accept"
NAK: Final = "nak"

#: `(model | None, worker_direct)` of a subject.
SubjectInfo = Callable[[str], tuple[str | None, bool]]


class Decide(Protocol):
    """The §4.1 rules for one message whose subject gave `model` (None: malformed) and `direct`: its
    delivery and verdict (`pipeline.intake.Intake._decide`)."""

    def __call__(
        self,
        msg: Any,
        model: str | None,
        direct: bool,
        release: Any,
        check_cancel: bool,
        /,
        *,
        rule: tuple[bool, str, frozenset[str]] | None = None,
    ) -> tuple[Any, str]: ...


def intake_batch(  # noqa: PLR0917 (the pipeline's call, positional like the native one)
    messages: Iterable[Any],
    subject_info: SubjectInfo,
    decide: Decide,
    release: Any,
    check_cancel: bool,
    admission: tuple[bool, str, frozenset[str]] | None = None,
) -> tuple[dict[str, list[Any]], list[Any], list[Any]]:
    """`(groups, naks, drops)`: the accepted deliveries by model (arrival order kept), those to NAK
    and those to ACK-drop. `check_cancel` (false while both tombstone sets are empty) and `admission`
    (the pool admission rule of §4.1 row 11, None without a gateway) are passed on to `decide`."""
    groups: dict[str, list[Any]] = {}
    naks: list[Any] = []
    drops: list[Any] = []
    last_subject: str | None = None
    model: str | None = None
    direct = False
    for msg in messages:
        subject = msg.subject
        if subject != last_subject:
            model, direct = subject_info(subject)
            last_subject = subject
        d, verdict = decide(msg, model, direct, release, check_cancel, rule=admission)
        if verdict == ACCEPT:
            group = groups.get(d.model)
            if group is None:
                groups[d.model] = [d]
            else:
                group.append(d)
        elif verdict == NAK:
            naks.append(d)
        else:
            drops.append(d)
    return groups, naks, drops


__all__ = ["ACCEPT", "IMPLEMENTATION", "NAK", "Decide", "SubjectInfo", "intake_batch"]
