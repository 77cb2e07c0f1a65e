# SPDX-License-Identifier: Apache-2.0
"""Audio preparation (scheduler-and-prep §7.3): `prepare_audio` on 10 s WAV clips, decode through
quantised 16 kHz PCM, in one thread. Each case records `audio_s` and the real-time factor
`realtime_x` (audio seconds per second of preparation, from the median) in `extra_info`.

Measured on the 2-core development machine (release build, medians of 20 rounds, three runs):

| clip | median | real-time factor |
|---|---|---|
| 10 s, 44.1 kHz stereo 16-bit (down-mix + FFT resample to 16 kHz) | 3.3-3.5 ms | ~3,000x |
| 10 s, 16 kHz mono 16-bit (no resampling) | 0.63-0.66 ms | ~15,000x |

So one permit prepares a 12-minute 44.1 kHz stereo recording in about a quarter of a second; the
single default permit bounds memory (the upstream figure is ~230 MiB for a worst-case decode; less
here, because the resampler is fed packet by packet), not throughput.
"""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar._native import prepare_audio

SECONDS = 10.0


def _wav(rate: int, channels: int) -> bytes:
    t = np.arange(int(rate * SECONDS)) / rate
    mono = 0.5 * np.sin(2 * np.pi * 440.0 * t) + 0.1 * np.sin(2 * np.pi * 3_000.0 * t)
    frames = np.repeat(mono[:, None], channels, axis=1)
    if channels == 2:
        frames[:, 1] *= 0.5  # distinct channels, so the down-mix does real work
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((frames * 32767).astype("<i2").tobytes())
    return buf.getvalue()


@pytest.mark.parametrize(
    ("rate", "channels"),
    [pytest.param(44_100, 2, id="44k1-stereo-resampled"), pytest.param(16_000, 1, id="16k-mono")],
)
def test_prepare_wav_10s(benchmark: BenchmarkFixture, rate: int, channels: int) -> None:
    data = _wav(rate, channels)
    benchmark.group = "audio: prepare_audio, 10 s WAV"
    result = benchmark.pedantic(prepare_audio, args=(data, "wav", rate), rounds=20, warmup_rounds=2)
    assert result.sample_count == 160_000 and result.duration_ms == 10_000
    benchmark.extra_info["audio_s"] = SECONDS
    assert benchmark.stats is not None
    benchmark.extra_info["realtime_x"] = round(SECONDS / benchmark.stats.stats.median)
