# SPDX-License-Identifier: Apache-2.0
"""Item costs for the batch former (scheduler-and-prep §2): tokens for encode, a character proxy for
score, audio milliseconds for extract (1 without decoded audio). Computed once at enqueue, never
sent over IPC (except as RunBatch.total_cost)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

SCORE_MEDIA_COST: Final = 1024
#: The non-adaptive cost ceiling of any batch formed while a prepared-audio extract item is pending
#: (§2.3, §1.2 step 5): 12 minutes of audio, in milliseconds.
AUDIO_HARD_BATCH_COST_CAP: Final = 720_000
_U64_MAX: Final = (1 << 64) - 1
_MEDIA_KEYS: Final = ("audio", "video", "document")


def _get(item: Mapping[Any, Any], key: str) -> tuple[bool, Any]:
    """A map key as msgpack str or UTF-8 bin."""
    if key in item:
        return True, item[key]
    raw = key.encode()
    if raw in item:
        return True, item[raw]
    return False, None


def _chars(item: Mapping[Any, Any]) -> int:
    for key in ("text", "content"):  # `content` is the alias, read only when `text` is absent
        present, value = _get(item, key)
        if present:
            return len(value) if isinstance(value, str) else 0
    return 0


def side_cost(item: Any) -> int:
    """Characters plus 1024 per image and per present audio, video or document input."""
    if not isinstance(item, Mapping):
        return 0
    media = 0
    present, images = _get(item, "images")
    if present and isinstance(images, list):
        media += len(images)
    for key in _MEDIA_KEYS:
        present, value = _get(item, key)
        media += int(present and value is not None)
    return _chars(item) + SCORE_MEDIA_COST * media


def score_cost(query: Any, documents: Sequence[Any] | None) -> int:
    """max(1, Σ over documents of (side_cost(query) + side_cost(document))), saturating at u64."""
    if not documents:
        return 1
    q = side_cost(query)
    return max(1, min(_U64_MAX, sum(q + side_cost(d) for d in documents)))


def extract_cost(prepared_audio: Mapping[str, Any] | None) -> int:
    """§2.3: the decoded audio's `duration_ms` when the sidecar prepared audio for the item, else 1."""
    if prepared_audio is None:
        return 1
    duration = prepared_audio.get("duration_ms")
    if isinstance(duration, bool) or not isinstance(duration, int) or duration < 1:
        return 1
    return duration


#: §2.3 (newer than v0.7.1): prepared audio longer than 30 s at 16 kHz runs alone.
RUNS_ALONE_SAMPLES = 480_000


def runs_alone(prepared_audio: Mapping[str, Any] | None) -> bool:
    """§2.3 (newer than v0.7.1): an extract item whose prepared audio has more than 480,000 samples
    (30 s at 16 kHz) never shares a batch."""
    if prepared_audio is None:
        return False
    samples = prepared_audio.get("sample_count")
    return isinstance(samples, int) and not isinstance(samples, bool) and samples > RUNS_ALONE_SAMPLES


__all__ = [
    "AUDIO_HARD_BATCH_COST_CAP",
    "RUNS_ALONE_SAMPLES",
    "SCORE_MEDIA_COST",
    "extract_cost",
    "runs_alone",
    "score_cost",
    "side_cost",
]
