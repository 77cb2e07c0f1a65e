# SPDX-License-Identifier: Apache-2.0
"""Extract media checks before IPC (scheduler-and-prep §7.1, and the §7.3 audio envelope and size).

Cheap structural checks only: counts, types and byte sizes. Pixel decoding, PDF work and audio
decoding stay elsewhere. A failure is a `MediaError` for that one item (code and message are what
the item's WorkResult carries); the rest of the batch goes on. Messages name field paths and sizes,
never media bytes or unknown keys.

Map keys may be str or UTF-8 bin. `unpack_value` decodes a fetched payload and remembers keys that
were repeated in one map, so "duplicate field" is detected on offloaded items; an inline item has
already been through the WorkItem decoder, where only a str/bin pair of the same name still shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from sie_sidecar.errors import INVALID_INPUT, INVALID_REQUEST

if TYPE_CHECKING:
    from sie_sidecar.wire.workitem import WorkItem

MAX_IMAGES = 16
MAX_MEDIA_BYTES = 16 * 1024 * 1024  # images + document of one item, summed
MAX_AUDIO_BYTES = 24 * 1024 * 1024  # compressed
MAX_AUDIO_FORMAT = 32  # bytes of UTF-8
MAX_SAMPLE_RATE = 2**32 - 1
AUDIO_FIELDS = ("data", "format", "sample_rate")


@dataclass(frozen=True, slots=True)
class MediaError:
    """One item's refusal: publish `code` / `message` as its error result and ACK it."""

    code: str
    message: str


class DupDict(dict[Any, Any]):
    """A decoded map whose keys repeated: the last value won; `duplicate_keys` remembers which."""

    __slots__ = ("duplicate_keys",)

    def __init__(self, pairs: list[tuple[Any, Any]], duplicate_keys: frozenset[Any]) -> None:
        super().__init__(pairs)
        self.duplicate_keys = duplicate_keys


def _pairs_hook(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    seen: set[Any] = set()
    dups: set[Any] = set()
    for key, _ in pairs:
        (dups if key in seen else seen).add(key)
    return DupDict(pairs, frozenset(dups))


def unpack_value(data: bytes | memoryview) -> Any:
    """msgpack → Python with the WorkItem decoder's settings, keeping the duplicate-key evidence."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, object_pairs_hook=_pairs_hook)


def key_name(key: object) -> str | None:
    """A map key as text: str as is, bin when it is UTF-8, anything else None (an unknown field)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def field(m: Mapping[Any, Any], name: str) -> tuple[int, Any]:
    """(how many times `name` occurs as a key, its last value); str and bin spellings both count."""
    count, value = 0, None
    for key, v in m.items():
        if key_name(key) == name:
            count, value = count + 1, v
    duplicates = getattr(m, "duplicate_keys", ())
    count += sum(1 for key in duplicates if key_name(key) == name)
    return count, value


class _Refused(Exception):
    """Internal: the first rule an item breaks."""


def _media_bytes(entry: Any, path: str) -> int:
    """One image or the document: a map with unique `data` (non-empty bin) and `format` (str/nil)."""
    if not isinstance(entry, Mapping):
        raise _Refused(f"{path} must be a map")
    n_data, data = field(entry, "data")
    n_format, fmt = field(entry, "format")
    if n_data > 1:
        raise _Refused(f"{path}.data: duplicate field")
    if n_format > 1:
        raise _Refused(f"{path}.format: duplicate field")
    if not isinstance(data, bytes | bytearray) or not data:
        raise _Refused(f"{path}.data must be non-empty binary")
    if fmt is not None and not isinstance(fmt, str):
        raise _Refused(f"{path}.format must be a string or null")
    return len(data)


def _add(total: int, size: int) -> int:
    total += size
    if total > MAX_MEDIA_BYTES:
        raise _Refused(f"item media too large: {total} bytes (limit {MAX_MEDIA_BYTES})")
    return total


def _check_images_document(item: Any) -> None:
    if not isinstance(item, Mapping):
        raise _Refused("item must be a map")
    n_images, images = field(item, "images")
    n_document, document = field(item, "document")
    if n_images > 1:
        raise _Refused("item.images: duplicate field")
    if n_document > 1:
        raise _Refused("item.document: duplicate field")
    total = 0
    if images is not None:
        if not isinstance(images, list | tuple):
            raise _Refused("item.images must be an array")
        if len(images) > MAX_IMAGES:
            raise _Refused(f"item.images: too many images ({len(images)}, limit {MAX_IMAGES})")
        for i, image in enumerate(images):
            total = _add(total, _media_bytes(image, f"item.images[{i}]"))
    if document is not None:
        _add(total, _media_bytes(document, "item.document"))


def validate_extract_media(item: Any) -> MediaError | None:
    """§7.1 on an extract `item` value: None when acceptable, else an `INVALID_INPUT` error."""
    try:
        _check_images_document(item)
    except _Refused as exc:
        return MediaError(INVALID_INPUT, str(exc))
    return None


def _check_audio(item: Any) -> None:
    if not isinstance(item, Mapping):
        return  # not ours to refuse: §7.3 passes non-maps through (§7.1 already refused them)
    n_audio, audio = field(item, "audio")
    if n_audio > 1:
        raise _Refused("item.audio: duplicate field")
    if audio is None:
        return  # absent or null: nothing to prepare
    if not isinstance(audio, Mapping):
        raise _Refused("item.audio must be a map")
    for key in (*audio.keys(), *getattr(audio, "duplicate_keys", ())):
        if key_name(key) not in AUDIO_FIELDS:
            raise _Refused("item.audio: unknown field")  # the key itself may be huge or hostile: not echoed
    values: dict[str, Any] = {}
    for name in AUDIO_FIELDS:
        count, values[name] = field(audio, name)
        if count > 1:
            raise _Refused(f"item.audio.{name}: duplicate field")
    data = values["data"]
    if data is None:
        raise _Refused("item.audio.data is required")
    if not isinstance(data, bytes | bytearray):
        raise _Refused("item.audio.data must be binary")
    if not data:
        raise _Refused("item.audio.data is empty")
    if len(data) > MAX_AUDIO_BYTES:
        raise _Refused(f"item.audio.data too large: {len(data)} bytes (limit {MAX_AUDIO_BYTES})")
    fmt = values["format"]
    if fmt is not None and (not isinstance(fmt, str) or len(fmt.encode("utf-8", "surrogatepass")) > MAX_AUDIO_FORMAT):
        raise _Refused(f"item.audio.format must be a string of at most {MAX_AUDIO_FORMAT} bytes or null")
    rate = values["sample_rate"]
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or not 0 < rate <= MAX_SAMPLE_RATE):
        raise _Refused("item.audio.sample_rate must be a positive integer that fits u32, or null")


def validate_audio(item: Any) -> MediaError | None:
    """§7.3 envelope and compressed-size rules (no decoding): None, or an `invalid_request` error."""
    try:
        _check_audio(item)
    except _Refused as exc:
        return MediaError(INVALID_REQUEST, str(exc))
    return None


def check_extract_item(item: Any) -> MediaError | None:
    """Images and document first (`INVALID_INPUT`), then audio (`invalid_request`), as §5.3 step 7 orders them."""
    return validate_extract_media(item) or validate_audio(item)


def check_extract_work_item(work: WorkItem) -> MediaError | None:
    """The media checks for one extract WorkItem; an item still offloaded is checked after its fetch.

    Call it before the payload fetch (inline items) and again on the item `resolve_items` returned
    (fetched items have their payload inlined and `payload_ref` cleared).
    """
    if work.payload_ref is not None:
        return None
    return check_extract_item(work.item)


__all__ = [
    "MAX_AUDIO_BYTES",
    "MAX_IMAGES",
    "MAX_MEDIA_BYTES",
    "DupDict",
    "MediaError",
    "check_extract_item",
    "check_extract_work_item",
    "field",
    "key_name",
    "unpack_value",
    "validate_audio",
    "validate_extract_media",
]
