# SPDX-License-Identifier: Apache-2.0
"""Audio preparation for extract items (scheduler-and-prep §7.3): the compressed `audio` of an item
is decoded before IPC and the backend gets a `prepared_audio` PreparedAudioPcm16 map instead
(wire-protocol §4.3), with `audio` removed from the item map.

Classification is cheap and takes no permit: a non-map item or one without `audio` passes through
unchanged; `audio: null` passes through with the key removed; a duplicate `audio` key or a bad
envelope (media.validate_audio: unknown fields, missing or non-binary data, > 24 MiB, format > 32
bytes, bad sample_rate) is that item's error. Every other item takes one of the process's
`SIE_AUDIO_PREP_PERMITS` decode permits (default 1: a worst-case 12-minute 48 kHz decode holds
about 230 MiB) and is decoded on a worker thread by the native `prepare_audio`, which releases the
GIL. A refusal is an error message for that item alone; the dispatcher publishes it as
`invalid_request` and ACKs.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..errors import AudioPrepError
from .media import field, key_name, validate_audio

#: `SIE_AUDIO_PREP_PERMITS` default (sidecar-behaviour §1.2).
DEFAULT_PERMITS: Final = 1
#: The PreparedAudioPcm16 keys, in wire order.
PREPARED_AUDIO_KEYS: Final = (
    "pcm_s16le",
    "sample_rate",
    "sample_count",
    "duration_ms",
    "source_sample_rate",
    "source_sample_count",
    "source_channels",
    "container",
)


class AudioPermits:
    """The process-wide decode limit. One semaphore per event loop (asyncio primitives bind to the
    loop that first waits on them; a process normally runs one loop, tests run many)."""

    def __init__(self, permits: int = DEFAULT_PERMITS) -> None:
        self._permits = max(1, permits)
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def permits(self) -> int:
        return self._permits

    def configure(self, permits: int) -> None:
        """Resize (at start-up, before any decode: semaphores already handed out are dropped)."""
        self._permits = max(1, permits)
        self._by_loop = weakref.WeakKeyDictionary()

    def semaphore(self) -> asyncio.Semaphore:
        """The running loop's semaphore."""
        loop = asyncio.get_running_loop()
        sem = self._by_loop.get(loop)
        if sem is None:
            sem = self._by_loop[loop] = asyncio.Semaphore(self._permits)
        return sem


#: The limit every `prepare_items` call shares; `configure_permits` sizes it from the settings.
PERMITS: Final = AudioPermits()


def configure_permits(permits: int) -> None:
    """Apply `SIE_AUDIO_PREP_PERMITS` (values below 1 count as 1)."""
    PERMITS.configure(permits)


@dataclass(frozen=True, slots=True)
class AudioPrep:
    """One item's outcome: `item` is the map to send (a new map when `audio` was removed, else the
    original object); `prepared` the PreparedAudioPcm16 map when audio was decoded; `error` the
    refusal message (then nothing is sent for the item)."""

    item: Any
    prepared: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class _Decode:
    """An item that needs a permit: its envelope values, already checked."""

    item: Mapping[Any, Any]
    data: bytes | bytearray
    format: str | None
    sample_rate: int | None


def without_audio(item: Mapping[Any, Any]) -> dict[Any, Any]:
    """A new map with every `audio` key (str or bin spelling) left out; the input is not changed."""
    return {k: v for k, v in item.items() if key_name(k) != "audio"}


def classify(item: Any) -> AudioPrep | _Decode:
    """§7.3 classification, without a permit: a final outcome, or the values to decode."""
    if not isinstance(item, Mapping):
        return AudioPrep(item)
    count, audio = field(item, "audio")
    if count == 0:
        return AudioPrep(item)
    if count > 1:
        return AudioPrep(item, error="item.audio: duplicate field")
    if audio is None:
        return AudioPrep(without_audio(item))
    bad = validate_audio(item)
    if bad is not None:
        return AudioPrep(item, error=bad.message)
    _, data = field(audio, "data")
    _, fmt = field(audio, "format")
    _, rate = field(audio, "sample_rate")
    return _Decode(item, data, fmt, rate)


def _prepare_blocking(job: _Decode) -> dict[str, Any]:
    from .._native import prepare_audio  # the extension; no pure-Python twin decodes audio

    prepared: dict[str, Any] = prepare_audio(job.data, job.format, job.sample_rate).to_wire()
    return prepared


async def _decode(job: _Decode) -> AudioPrep:
    async with PERMITS.semaphore():
        try:
            prepared = await asyncio.to_thread(_prepare_blocking, job)
        except AudioPrepError as exc:
            return AudioPrep(job.item, error=str(exc))
        except ImportError:
            return AudioPrep(job.item, error="audio decoding is not available in this build")
    return AudioPrep(without_audio(job.item), prepared=prepared)


async def prepare_items(items: Sequence[Any]) -> list[AudioPrep]:
    """Prepare the audio of extract `item` values, one outcome per item in order. Items without
    audio never wait for a permit; the decodes share the process's permits."""
    outcomes: list[AudioPrep | None] = []
    jobs: list[tuple[int, _Decode]] = []
    for i, item in enumerate(items):
        c = classify(item)
        if isinstance(c, AudioPrep):
            outcomes.append(c)
        else:
            outcomes.append(None)
            jobs.append((i, c))
    if jobs:
        decoded = await asyncio.gather(*(_decode(job) for _, job in jobs))
        for (i, _), outcome in zip(jobs, decoded, strict=True):
            outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


__all__ = [
    "DEFAULT_PERMITS",
    "PERMITS",
    "PREPARED_AUDIO_KEYS",
    "AudioPermits",
    "AudioPrep",
    "classify",
    "configure_permits",
    "prepare_items",
    "without_audio",
]
