# SPDX-License-Identifier: Apache-2.0
"""Twins of `_native.delivery_attempts` and `_native.AttemptTally`: JetStream delivery counts, read
from each message's ACK subject (`reply`), grouped as `(attempt, messages)` ascending, plus how many
messages had no ACK subject."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

IMPLEMENTATION = "py"
_PREFIX = "$JS.ACK."


def delivered_count(ack_subject: str) -> int | None:
    """v1 (9 tokens): the 5th; v2 (11 or more, with domain and account hash): the 7th."""
    if not ack_subject.startswith(_PREFIX):
        return None
    tokens = ack_subject.split(".")
    if len(tokens) == 9:
        field = tokens[4]
    elif len(tokens) >= 11:
        field = tokens[6]
    else:
        return None
    if not field or not field.isascii() or not field.isdigit() or len(field) > 20:
        return None
    value = int(field)
    return value if value < 2**64 else None


def delivery_attempts(messages: Iterable[Any]) -> tuple[list[tuple[int, int]], int]:
    counts: Counter[int] = Counter()
    unknown = 0
    for m in messages:
        reply = getattr(m, "reply", None)
        attempt = delivered_count(reply) if isinstance(reply, str) else None
        if attempt is None:
            unknown += 1
        else:
            counts[attempt] += 1
    return sorted(counts.items()), unknown


class AttemptTally:
    """Delivery attempts counted run by run (`add`) and taken at export (`take`)."""

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()
        self._unknown = 0

    def add(self, messages: Iterable[Any]) -> None:
        counts, unknown = delivery_attempts(messages)
        self._counts.update(dict(counts))
        self._unknown += unknown

    def take(self) -> tuple[list[tuple[int, int]], int]:
        taken = sorted(self._counts.items()), self._unknown
        self._counts, self._unknown = Counter(), 0
        return taken


__all__ = ["IMPLEMENTATION", "AttemptTally", "delivered_count", "delivery_attempts"]
