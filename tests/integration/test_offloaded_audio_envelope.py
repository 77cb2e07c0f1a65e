# SPDX-License-Identifier: Apache-2.0
"""Scheduler-and-prep §10 case 72: the largest audio an extract item may carry (24 MiB compressed),
offloaded to the payload store as a msgpack item, fits the payload envelope (34 MiB + 64 KiB) with
less than 1 KiB of msgpack around the audio bytes; fetched by the real sidecar from a real local
store, it is prepared and answered. One byte more is fetched too (the envelope takes it) and then
refused by the audio limit, re-applied after the fetch (§7.1)."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import msgpack
import numpy as np
import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.payloads.store import PAYLOAD_ENVELOPE_LIMIT
from sie_sidecar.prep.media import MAX_AUDIO_BYTES

from .conftest import NatsServer
from .stack import MODEL, running_stack, work_item

pytestmark = pytest.mark.timeout(120)

RATE, CHANNELS, SAMPLE_BYTES = 48_000, 2, 2
WAV_HEADER_BYTES = 44


def _wav_of_size(size: int) -> bytes:
    """A 48 kHz stereo 16-bit WAV of exactly `size` bytes (a slow sweep, so it is not silence)."""
    frames = (size - WAV_HEADER_BYTES) // (CHANNELS * SAMPLE_BYTES)
    assert WAV_HEADER_BYTES + frames * CHANNELS * SAMPLE_BYTES == size
    t = np.arange(frames, dtype=np.float64) / RATE
    mono = (0.4 * 32767 * np.sin(2 * np.pi * (220 + 2 * t) * t)).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(CHANNELS)
        w.setsampwidth(SAMPLE_BYTES)
        w.setframerate(RATE)
        w.writeframes(np.repeat(mono[:, None], CHANNELS, axis=1).tobytes())
    wav = buf.getvalue()
    assert len(wav) == size
    return wav


def _stored_item(audio: bytes) -> bytes:
    """The offloaded item as the gateway writes it: msgpack, the audio as binary."""
    return bytes(msgpack.packb({"audio": {"data": audio, "format": "wav"}}, use_bin_type=True))


async def test_the_largest_offloaded_audio_fits_the_envelope_and_is_served(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    largest = _wav_of_size(MAX_AUDIO_BYTES)
    blob = _stored_item(largest)
    assert len(blob) - len(largest) < 1024  # the msgpack around the audio: well under 1 KiB
    assert len(blob) <= PAYLOAD_ENVELOPE_LIMIT
    store = tmp_path / "payloads"
    store.mkdir()
    (store / "largest.bin").write_bytes(blob)
    (store / "over.bin").write_bytes(_stored_item(largest + b"\0"))  # one byte past the audio limit
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    env = {"SIE_PAYLOAD_STORE_URL": f"file://{store}"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        ids = [
            await stack.publish(work_item(operation="extract", item=None, payload_ref=ref))
            for ref in ("largest.bin", "over.bin")
        ]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids), timeout=60)
        await stack.settled_pool()
        served, refused = (stack.results_for(i)[0] for i in ids)
    frames = (MAX_AUDIO_BYTES - WAV_HEADER_BYTES) // (CHANNELS * SAMPLE_BYTES)
    assert served["success"] is True
    assert served["units"]["audio_ms"] == -(-frames * 1000 // RATE)  # all 131 s of it reached the backend
    assert served["payload_fetch_ms"] > 0
    assert (refused["success"], refused["error_code"]) == (False, "invalid_request")
    assert refused["error"] == f"item.audio.data too large: {MAX_AUDIO_BYTES + 1} bytes (limit {MAX_AUDIO_BYTES})"
    assert adapter.items == 1
