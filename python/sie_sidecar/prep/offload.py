# SPDX-License-Identifier: Apache-2.0
"""Tokenize a group without stalling the event loop: big groups go to a worker thread (the tokenizers
library releases the GIL while it encodes, so the loop keeps pulling and publishing meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .tokenize import PreparedTokens, RegisteredTokenizer

#: Below this many items the thread hop costs more than the encoding (~80 µs an item for MiniLM).
INLINE_MAX_ITEMS: Final = 8


async def prepare_off_loop(
    tokenizer: RegisteredTokenizer, items: Sequence[Mapping[str, Any]]
) -> list[PreparedTokens | None]:
    """`tokenizer.prepare(items)`: inline for a few items, in a worker thread otherwise."""
    if len(items) <= INLINE_MAX_ITEMS:
        return tokenizer.prepare(items)
    return await asyncio.to_thread(tokenizer.prepare, items)


__all__ = ["INLINE_MAX_ITEMS", "prepare_off_loop"]
