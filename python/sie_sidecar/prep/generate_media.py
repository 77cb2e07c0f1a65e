# SPDX-License-Identifier: Apache-2.0
"""Generation media before the backend sees it (wire-protocol §7.4, scheduler-and-prep §7.2): each
message's `images[*].data` (and, newer than v0.7.1, `videos[*].data`) base64 string becomes msgpack
binary, within the limits of at most 16 images and 1 video across all messages and 16 MiB of decoded
bytes shared by all of them. Binary data is taken as it is (an offloaded generate value may carry
it). Anything else is `INVALID_INPUT` for the caller, with an error that names only the field path
(`generate.messages[0].images[1]`), never the data.

`messages`, each message's `images` / `videos` and each entry's `data` / `format` must be unique
keys. A plain msgpack decode keeps the last of a repeated key, so the generation path decodes with
`prep.media.unpack_value`, whose maps remember their repeated keys (`DupDict.duplicate_keys`); a
str and a bin spelling of one name count as a repeat too, as for extract media (§7.1)."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from ..errors import GenerateMediaError
from .media import field

MAX_IMAGES: Final = 16
#: Newer than v0.7.1: at most one video per request, in the images' byte budget.
MAX_VIDEOS: Final = 1
MAX_IMAGE_BYTES: Final = 16 * 1024 * 1024
_KINDS: Final = (("images", MAX_IMAGES), ("videos", MAX_VIDEOS))


def _decoded(data: Any, where: str) -> bytes:
    """One entry's `data` as bytes: non-empty binary as it is, or a trimmed, non-empty standard
    base64 string (its decoded size bounded from its length before decoding)."""
    if isinstance(data, bytes | bytearray):
        if not data:
            raise GenerateMediaError(f"{where}.data is empty")
        return bytes(data)
    if not isinstance(data, str):
        raise GenerateMediaError(f"{where}.data must be a base64 string or binary")
    text = data.strip()
    if not text:
        raise GenerateMediaError(f"{where}.data is empty")
    if len(text) * 3 // 4 > MAX_IMAGE_BYTES:
        raise GenerateMediaError(f"{where}.data exceeds {MAX_IMAGE_BYTES} decoded bytes")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise GenerateMediaError(f"{where}.data is not valid base64") from None
    if not raw:
        raise GenerateMediaError(f"{where}.data is empty")
    return raw


def _unique(m: dict[Any, Any], name: str, path: str) -> None:
    """`GenerateMediaError` when `name` occurs more than once as a key of `m` (§7.2 unique keys)."""
    if field(m, name)[0] > 1:
        raise GenerateMediaError(f"{path}.{name}: duplicate field")


def normalise_generate_images(generate: Any) -> None:
    """Decode every message's image and video data in place; `GenerateMediaError` naming the field
    path on a bad entry, a repeated key or a limit."""
    if generate is None:
        return
    if not isinstance(generate, dict):
        raise GenerateMediaError("generate must be a map")
    _unique(generate, "messages", "generate")
    messages = generate.get("messages")
    if messages is None:
        return
    if not isinstance(messages, list):
        raise GenerateMediaError("generate.messages must be an array")
    counts = {kind: 0 for kind, _ in _KINDS}
    total = 0
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            raise GenerateMediaError(f"generate.messages[{m}] must be a map")
        for kind, limit in _KINDS:
            _unique(message, kind, f"generate.messages[{m}]")
            entries = message.get(kind)
            if entries is None:
                continue
            if not isinstance(entries, list):
                raise GenerateMediaError(f"generate.messages[{m}].{kind} must be an array")
            for i, entry in enumerate(entries):
                where = f"generate.messages[{m}].{kind}[{i}]"
                if not isinstance(entry, dict):
                    raise GenerateMediaError(f"{where} must be a map")
                counts[kind] += 1
                if counts[kind] > limit:
                    raise GenerateMediaError(f"{where}: at most {limit} {kind} per request")
                _unique(entry, "format", where)
                _unique(entry, "data", where)
                fmt = entry.get("format")
                if fmt is not None and not isinstance(fmt, str):
                    raise GenerateMediaError(f"{where}.format must be a string")
                if "data" not in entry:
                    raise GenerateMediaError(f"{where}.data is required")
                raw = _decoded(entry["data"], where)
                total += len(raw)
                if total > MAX_IMAGE_BYTES:  # one budget for every image and video (checked after each)
                    raise GenerateMediaError(f"{where}: media exceed {MAX_IMAGE_BYTES} decoded bytes")
                entry["data"] = raw


__all__ = ["MAX_IMAGES", "MAX_IMAGE_BYTES", "MAX_VIDEOS", "GenerateMediaError", "normalise_generate_images"]
