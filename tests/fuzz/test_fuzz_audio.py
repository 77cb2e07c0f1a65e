# SPDX-License-Identifier: Apache-2.0
"""Fuzz audio preparation: random bytes, container magics with random tails and mutations of valid
streams give a `PreparedAudio` or an `AudioPrepError`, nothing else, with bounded memory."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar._native import PreparedAudio, prepare_audio
from sie_sidecar.errors import AudioPrepError

from ..audio_samples import frames_of, tone, wav_float, wav_pcm
from .strategies import mutated

pytestmark = pytest.mark.fuzz
FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

MAGICS = [
    b"RIFF\x24\x00\x00\x00WAVEfmt ",
    b"fLaC",
    b"OggS\x00\x02",
    b"\x1a\x45\xdf\xa3",
    b"\x00\x00\x00\x20ftypM4A ",
    b"ID3\x04\x00\x00",
    b"\xff\xfb\x90\x64",
]
SEEDS = [
    wav_pcm(frames_of(tone(16_000, 0.02), 1), 16_000),
    wav_pcm(frames_of(tone(44_100, 0.01), 2), 44_100, 3),
    wav_pcm(frames_of(tone(8_000, 0.02), 1), 8_000, 1),
    wav_float(frames_of(tone(48_000, 0.01), 2), 48_000),
]
#: Opus in Ogg and WebM (PyAV's FFmpeg + libopus): the Opus header parser and libopus behind the
#: demuxers. Committed fixtures, so the fuzz runs where PyAV is missing too.
OPUS_FIXTURES = Path(__file__).resolve().parents[2] / "native" / "audio" / "tests" / "fixtures"
OPUS_SEEDS = [
    (OPUS_FIXTURES / name).read_bytes()
    for name in ("tone_mono_48k.opus", "tone_stereo_48k.webm", "tone_mono_48k_opus.m4a")
]
#: Peak RSS may grow at most this much over a whole fuzz run: a header that claims gigabytes must
#: not get them (the inputs here are a few KiB).
RSS_GROWTH_LIMIT_KIB = 512 * 1024


def _peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _check(data: bytes, fmt: str | None = None, rate: int | None = None) -> None:
    try:
        p = prepare_audio(data, fmt, rate)
    except AudioPrepError as exc:
        assert str(exc)
        return
    assert isinstance(p, PreparedAudio)
    assert len(p.pcm_s16le) == 2 * p.sample_count
    assert 0 < p.duration_ms <= 720_000 and p.sample_count <= 720_000 * 16 + 2048
    assert 8_000 <= p.source_sample_rate <= 48_000 and p.source_channels in (1, 2)
    assert p.container in {"wav", "mp3", "flac", "ogg", "m4a", "webm"}


@pytest.fixture(scope="module")
def rss_budget() -> object:
    start = _peak_rss_kib()
    yield start
    assert _peak_rss_kib() - start < RSS_GROWTH_LIMIT_KIB


@FIXTURE
@given(data=st.binary(max_size=4096))
def test_random_bytes(rss_budget: object, data: bytes) -> None:
    _check(data)


@FIXTURE
@given(magic=st.sampled_from(MAGICS), tail=st.binary(max_size=4096))
def test_magic_with_random_tail(rss_budget: object, magic: bytes, tail: bytes) -> None:
    _check(magic + tail)


@FIXTURE
@given(data=st.sampled_from(SEEDS).flatmap(mutated))
def test_mutated_wav(rss_budget: object, data: bytes) -> None:
    _check(data)


@FIXTURE
@given(data=st.sampled_from(OPUS_SEEDS).flatmap(mutated))
def test_mutated_opus(rss_budget: object, data: bytes) -> None:
    _check(data)


@FIXTURE
@given(
    data=st.sampled_from(SEEDS),
    fmt=st.one_of(st.none(), st.text(max_size=40)),
    rate=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
def test_declared_values(rss_budget: object, data: bytes, fmt: str | None, rate: int | None) -> None:
    _check(data, fmt, rate)


def test_hostile_lengths_in_headers(rss_budget: object) -> None:
    """Chunk, atom and element sizes that claim gigabytes: refused without allocating them."""
    fmt = b"fmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x10\x00"
    cases = [
        b"RIFF\xff\xff\xff\xffWAVE" + fmt + b"LIST\xf0\xff\xff\xffINFOISFT\xe0\xff\xff\xff" + bytes(64),
        b"RIFF\xff\xff\xff\xffWAVE" + b"fmt \xf0\xff\xff\xff" + bytes(64),
        b"\x00\x00\x00\x18ftypM4A \x00\x00\x00\x00M4A isom"
        + b"\xff\xff\xff\xf0moov"
        + b"\x00\x00\x00\x10stts\x00\x00\x00\x00\xff\xff\xff\xff",
        b"\x1a\x45\xdf\xa3\x01\xff\xff\xff\xff\xff\xff\xff" + bytes(64),
        b"fLaC\x04\xff\xff\xff" + bytes(64),
        b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f" + bytes(64),
    ]
    for data in cases:
        with pytest.raises(AudioPrepError):
            prepare_audio(data)


def test_noise_decodes_or_is_refused(rss_budget: object) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        _check(wav_pcm(rng.uniform(-1, 1, size=(int(rng.integers(1, 3000)), 1)), 16_000))
