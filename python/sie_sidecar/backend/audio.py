# SPDX-License-Identifier: Apache-2.0
"""The backend's acceptance of a `prepared_audio` PreparedAudioPcm16 (wire-protocol §4.3,
scheduler-and-prep §7.3 [P]): the server refuses an extract item whose decoded audio breaks a rule,
as that item's `INVALID_INPUT` error, before the adapter sees it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

TARGET_RATE: Final = 16_000
MAX_DURATION_MS: Final = 720_000
#: 12 minutes at 16 kHz plus 2048 samples of resampler slack.
MAX_SAMPLE_COUNT: Final = MAX_DURATION_MS * 16 + 2048
MIN_SOURCE_RATE: Final = 8_000
MAX_SOURCE_RATE: Final = 48_000
CONTAINERS: Final = frozenset({"wav", "mp3", "flac", "ogg", "m4a", "webm"})
_UINT_KEYS: Final = (
    "sample_rate",
    "sample_count",
    "duration_ms",
    "source_sample_rate",
    "source_sample_count",
    "source_channels",
)


def _uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def prepared_audio_error(item: Mapping[str, Any]) -> str | None:
    """None when the extract item's `prepared_audio` is absent or acceptable, else why not."""
    pa = item.get("prepared_audio")
    if pa is None:
        return None
    if not isinstance(pa, Mapping):
        return "prepared_audio must be a map"
    inner = item.get("item")
    if isinstance(inner, Mapping) and "audio" in inner:
        return "prepared_audio given but item.audio was not removed"
    pcm = pa.get("pcm_s16le")
    if not isinstance(pcm, bytes | bytearray | memoryview):
        return "prepared_audio.pcm_s16le must be binary"
    for key in _UINT_KEYS:
        if not _uint(pa.get(key)):
            return f"prepared_audio.{key} must be an unsigned integer"
    count, rate, ms = pa["sample_count"], pa["source_sample_rate"], pa["duration_ms"]
    source_count = pa["source_sample_count"]
    if pa["sample_rate"] != TARGET_RATE:
        return f"prepared_audio.sample_rate must be {TARGET_RATE}"
    if not 0 < count <= MAX_SAMPLE_COUNT:
        return f"prepared_audio.sample_count must be in 1..{MAX_SAMPLE_COUNT}"
    if len(pcm) != 2 * count:
        return "prepared_audio.pcm_s16le length must be 2 x sample_count"
    if not MIN_SOURCE_RATE <= rate <= MAX_SOURCE_RATE:
        return f"prepared_audio.source_sample_rate must be in {MIN_SOURCE_RATE}..{MAX_SOURCE_RATE}"
    if source_count == 0:
        return "prepared_audio.source_sample_count must be positive"
    if pa["source_channels"] not in (1, 2):
        return "prepared_audio.source_channels must be 1 or 2"
    if not 0 < ms <= MAX_DURATION_MS:
        return f"prepared_audio.duration_ms must be in 1..{MAX_DURATION_MS}"
    if ms != (source_count // rate) * 1000 + -(-(source_count % rate) * 1000 // rate):
        return "prepared_audio.duration_ms does not match the source samples"
    container = pa.get("container")
    if not isinstance(container, str) or container not in CONTAINERS:
        return "prepared_audio.container is not a known container"
    return None


__all__ = ["CONTAINERS", "MAX_SAMPLE_COUNT", "prepared_audio_error"]
