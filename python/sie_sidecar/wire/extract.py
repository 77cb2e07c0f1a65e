# SPDX-License-Identifier: Apache-2.0
"""Extract results (§11.4): generic msgpack of a small map, shared by the native core and the twin, since
msgpack's own C packer is already the fast path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from ..errors import ShapeError


def frame_extract(result: Mapping[str, Any], item_id: str) -> bytes:
    """The extraction map with `id` set; an existing `id` keeps its position, else it goes last."""
    if not isinstance(item_id, str):
        raise ShapeError("item_id must be a str")
    framed = dict(result)
    framed["id"] = item_id
    try:
        return bytes(msgpack.packb(framed, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ShapeError(f"extract result is not msgpack-encodable: {exc}") from exc


__all__ = ["frame_extract"]
