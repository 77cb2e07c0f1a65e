# SPDX-License-Identifier: Apache-2.0
"""Audio preparation for extract items (scheduler-and-prep §7.3, §2.3): the native decoder, the
asyncio side (classification, permits), the RunBatch body and the backend's acceptance rules."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest

from sie_sidecar._native import PreparedAudio, prepare_audio
from sie_sidecar.backend.audio import MAX_SAMPLE_COUNT, prepared_audio_error
from sie_sidecar.errors import AudioPrepError
from sie_sidecar.ipc.requests import extract_item, per_op_body, run_batch_body
from sie_sidecar.prep import audio as audio_prep
from sie_sidecar.prep.audio import PREPARED_AUDIO_KEYS, AudioPermits, classify, prepare_items, without_audio
from sie_sidecar.prep.media import DupDict
from sie_sidecar.sched.costs import AUDIO_HARD_BATCH_COST_CAP, extract_cost
from sie_sidecar.wire.workitem import WorkItem

from ..audio_samples import encoded, encoded_av, ffmpeg_frames, frames_of, pcm, tone, wav_float, wav_pcm

MiB = 1024 * 1024


def expected_len(frames: int, rate: int) -> int:
    return -(-frames * 16_000 // rate)


def duration(frames: int, rate: int) -> int:
    return (frames // rate) * 1000 + -(-(frames % rate) * 1000 // rate)


# -- the native decoder ---------------------------------------------------------------------------


@pytest.mark.parametrize("sampwidth", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("rate", [8_000, 16_000, 44_100, 48_000])
def test_wav_integer_pcm(rate: int, channels: int, sampwidth: int) -> None:
    signal = tone(rate, 0.25)
    p = prepare_audio(wav_pcm(frames_of(signal, channels), rate, sampwidth), "wav", rate)
    assert isinstance(p, PreparedAudio)
    assert (p.container, p.sample_rate, p.source_sample_rate) == ("wav", 16_000, rate)
    assert (p.source_channels, p.source_sample_count) == (channels, len(signal))
    assert p.duration_ms == 250
    assert p.sample_count == expected_len(len(signal), rate) == 4000
    assert len(p.pcm_s16le) == 2 * p.sample_count and isinstance(p.pcm_s16le, bytes)
    peak = int(np.abs(pcm(p.pcm_s16le)).max())
    assert abs(peak - 16_384) <= (300 if sampwidth == 1 else 120)  # amplitude 0.5 survives


def test_wav_float_and_clamping() -> None:
    p = prepare_audio(wav_float(np.array([[1.5], [-3.0], [1.0], [0.25]]), 16_000))
    assert pcm(p.pcm_s16le).tolist() == [32_767, -32_768, 32_767, 8_192]
    stereo = frames_of(tone(44_100, 0.5), 2)
    p = prepare_audio(wav_float(stereo, 44_100), "audio/wav")
    assert (p.source_channels, p.sample_count, p.duration_ms) == (2, 8000, 500)


def test_mono_16k_pcm_round_trips_exactly() -> None:
    values = (np.arange(5000) * 37 % 65_536 - 32_768).astype("<i2")
    p = prepare_audio(wav_pcm(values[:, None] / 32768.0, 16_000))
    assert np.array_equal(pcm(p.pcm_s16le), values)


def test_stereo_is_averaged() -> None:
    x = tone(16_000, 0.1, amp=0.8)
    silent = prepare_audio(wav_pcm(np.stack([x, -x], axis=1), 16_000))
    assert int(np.abs(pcm(silent.pcm_s16le)).max()) <= 1
    mixed = prepare_audio(wav_pcm(np.array([[0.5, 0.25], [-1.0, 0.0], [0.5, 0.5]]), 16_000))
    assert pcm(mixed.pcm_s16le).tolist() == [12_288, -16_384, 16_384]


def test_quantisation_error_is_at_most_one_step() -> None:
    x = tone(16_000, 0.2, freq=123.0, amp=0.9)
    p = prepare_audio(wav_float(x[:, None], 16_000))
    assert np.abs(pcm(p.pcm_s16le) - np.clip(np.round(x * 32768), -32768, 32767)).max() <= 1


@pytest.mark.parametrize(("rate", "frames"), [(8_000, 8_000), (8_000, 1), (44_100, 1601), (48_000, 31), (11_025, 4410)])
def test_resampled_length_and_duration(rate: int, frames: int) -> None:
    p = prepare_audio(wav_pcm(tone(rate, frames / rate)[:, None], rate))
    assert p.source_sample_count == frames
    assert p.sample_count == expected_len(frames, rate)  # exact: ceil(frames x 16000 / rate)
    assert p.duration_ms == duration(frames, rate) == math.ceil(frames * 1000 / rate)


def test_eight_khz_tone_keeps_its_pitch() -> None:
    p = prepare_audio(wav_pcm(tone(8_000, 1.0, freq=250.0)[:, None], 8_000))
    s = pcm(p.pcm_s16le)[1000:15_000].astype(np.int32)
    crossings = int(np.count_nonzero(np.diff(np.signbit(s))))
    assert 430 <= crossings <= 445  # 500 a second, over 0.875 s


def test_duration_examples_of_section_2_3() -> None:
    for n, ms in [(1, 1), (1600, 100), (1601, 101)]:
        p = prepare_audio(wav_pcm(np.zeros((n, 1)), 16_000))
        assert (p.duration_ms, p.sample_count) == (ms, n)


@pytest.mark.parametrize(
    ("data", "fmt", "rate", "message"),
    [
        (b"", None, None, "audio data is empty"),
        (b"just some text, not audio", None, None, "unsupported audio container"),
        (b"\x89PNG\r\n\x1a\n" + bytes(64), None, None, "unsupported audio container"),
        (wav_pcm(np.zeros((100, 1)), 16_000), "mp3", None, "does not match the wav container"),
        (wav_pcm(np.zeros((100, 1)), 16_000), "opus", None, "does not match the wav container"),
        (wav_pcm(np.zeros((100, 1)), 16_000), None, 44_100, "declared audio sample_rate 44100"),
        (wav_pcm(np.zeros((100, 1)), 16_000), None, 0, "sample_rate must be positive"),
        (wav_pcm(np.zeros((100, 1)), 16_000), "w" * 33, None, "audio format is 33 bytes long"),
        (wav_pcm(np.zeros((100, 1)), 7_999), None, None, "7999 Hz is outside 8000-48000 Hz"),
        (wav_pcm(np.zeros((100, 1)), 48_001), None, None, "48001 Hz is outside"),
        (wav_pcm(np.zeros((100, 3)), 16_000), None, None, "audio has 3 channels"),
        (wav_pcm(np.zeros((0, 1)), 16_000), None, None, "no audio frames decoded"),
        (wav_pcm(np.zeros((1000, 1)), 16_000)[:-100], None, None, "audio data is truncated"),
        (wav_pcm(np.zeros((1000, 1)), 16_000)[:30], None, None, "audio"),
        (b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk", None, None, "audio"),
        (b"fLaC" + bytes(200), None, None, "audio"),
        (b"OggS" + bytes(200), None, None, "audio"),
        (b"ID3\x04\x00\x00\x00\x00\x00\x10" + bytes(300), None, None, "audio"),
        (b"\xff\xfb" + bytes(300), None, None, "audio"),
        (b"\x1a\x45\xdf\xa3" + bytes(300), None, None, "audio"),
        (b"\x00\x00\x00\x18ftypM4A " + bytes(300), None, None, "audio"),
    ],
)
def test_refusals(data: bytes, fmt: str | None, rate: int | None, message: str) -> None:
    with pytest.raises(AudioPrepError, match=message) as info:
        prepare_audio(data, fmt, rate)
    assert isinstance(info.value, ValueError)


def test_limits_of_size_and_length() -> None:
    too_large = wav_pcm(np.zeros((10, 1)), 16_000)
    too_large += bytes(24 * MiB + 1 - len(too_large))
    with pytest.raises(AudioPrepError, match=r"too large: 25165825 bytes \(limit 25165824\)"):
        prepare_audio(too_large)
    limit = 8_000 * 720  # 12 minutes of 8-bit mono at 8 kHz: 5.5 MiB
    exact = prepare_audio(wav_pcm(np.zeros((limit, 1)), 8_000, 1))
    assert (exact.duration_ms, exact.sample_count) == (720_000, 11_520_000) and exact.sample_count <= MAX_SAMPLE_COUNT
    with pytest.raises(AudioPrepError, match="longer than 720000 ms"):
        prepare_audio(wav_pcm(np.zeros((limit + 1, 1)), 8_000, 1))


def test_argument_types() -> None:
    data = wav_pcm(np.zeros((10, 1)), 16_000)
    assert prepare_audio(bytearray(data)).sample_count == 10  # any buffer (copied first)
    assert prepare_audio(memoryview(data), None, None).source_sample_count == 10
    with pytest.raises(TypeError):
        prepare_audio("not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        prepare_audio(data, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        prepare_audio(data, None, True)
    with pytest.raises(AudioPrepError, match="fits u32"):
        prepare_audio(data, None, -1)
    with pytest.raises(AudioPrepError, match="fits u32"):
        prepare_audio(data, None, 2**32)


def test_to_wire_and_repr() -> None:
    p = prepare_audio(wav_pcm(np.zeros((160, 1)), 16_000))
    wire = p.to_wire()
    assert tuple(wire) == PREPARED_AUDIO_KEYS
    assert wire["pcm_s16le"] is p.pcm_s16le  # shared, not copied
    assert wire == {
        "pcm_s16le": bytes(320),
        "sample_rate": 16_000,
        "sample_count": 160,
        "duration_ms": 10,
        "source_sample_rate": 16_000,
        "source_sample_count": 160,
        "source_channels": 1,
        "container": "wav",
    }
    assert "pcm" not in repr(p) and "sample_count=160" in repr(p)


def test_decoding_releases_the_gil() -> None:
    data = wav_pcm(tone(44_100, 120.0)[:, None], 44_100)  # two minutes to resample
    done = threading.Event()
    result: list[PreparedAudio] = []

    def work() -> None:
        result.append(prepare_audio(data))
        done.set()

    ticks = 0
    started = time.perf_counter()
    thread = threading.Thread(target=work)
    thread.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.0005)
    thread.join()
    elapsed = time.perf_counter() - started
    assert result[0].sample_count == 1_920_000
    # While the decode ran, this thread kept running (it could not with the GIL held).
    if elapsed > 0.02:
        assert ticks >= 5, (ticks, elapsed)


# -- other containers (soundfile's libsndfile, PyAV's FFmpeg) ---------------------------------------


@pytest.mark.parametrize(
    ("fmt", "subtype", "container"), [("FLAC", "PCM_16", "flac"), ("FLAC", "PCM_24", "flac"), ("OGG", "VORBIS", "ogg")]
)
@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (44_100, 2), (48_000, 2), (8_000, 1)])
def test_soundfile_containers(fmt: str, subtype: str, container: str, rate: int, channels: int) -> None:
    pytest.importorskip("soundfile")
    signal = tone(rate, 1.0)
    p = prepare_audio(encoded(frames_of(signal, channels), rate, fmt, subtype), container, rate)
    assert (p.container, p.source_sample_rate, p.source_channels) == (container, rate, channels)
    assert p.source_sample_count == len(signal)
    assert (p.duration_ms, p.sample_count) == (1000, 16_000)
    assert abs(int(np.abs(pcm(p.pcm_s16le)).max()) - 16_384) < 1200  # lossy codecs ring a little


@pytest.mark.parametrize(("rate", "channels"), [(16_000, 1), (44_100, 2), (48_000, 1)])
def test_mp3(rate: int, channels: int) -> None:
    pytest.importorskip("soundfile")
    signal = tone(rate, 1.0)
    data = encoded(frames_of(signal, channels), rate, "MP3", "MPEG_LAYER_III")
    p = prepare_audio(data, "audio/mpeg")
    assert (p.container, p.source_sample_rate, p.source_channels) == ("mp3", rate, channels)
    assert p.source_sample_count == len(signal)  # gapless: encoder delay and padding trimmed
    assert p.duration_ms == 1000
    with pytest.raises(AudioPrepError, match="does not match the mp3 container"):
        prepare_audio(data, "flac")


def test_rate_or_layout_changing_mid_stream_is_refused() -> None:
    pytest.importorskip("soundfile")
    mono_44k = encoded(frames_of(tone(44_100, 0.5), 1), 44_100, "MP3", "MPEG_LAYER_III")
    mono_48k = encoded(frames_of(tone(48_000, 0.5), 1), 48_000, "MP3", "MPEG_LAYER_III")
    stereo_44k = encoded(frames_of(tone(44_100, 0.5), 2), 44_100, "MP3", "MPEG_LAYER_III")
    for spliced in (mono_44k + mono_48k, mono_44k + stereo_44k):
        with pytest.raises(AudioPrepError):
            prepare_audio(spliced)
    chained = encoded(tone(44_100, 0.5)[:, None], 44_100, "OGG", "VORBIS") + encoded(
        tone(48_000, 0.5)[:, None], 48_000, "OGG", "VORBIS"
    )
    with pytest.raises(AudioPrepError, match="channel layout changed mid-stream"):
        prepare_audio(chained)


def test_ogg_opus_from_libsndfile_decodes_at_48_khz() -> None:
    """libsndfile's Ogg/Opus (another encoder than FFmpeg's): pre-skip and the end granule trim
    it to exactly the frames encoded, at Opus's own 48 kHz."""
    pytest.importorskip("soundfile")
    data = encoded(tone(48_000, 0.5)[:, None], 48_000, "OGG", "OPUS")
    p = prepare_audio(data, "ogg")
    assert (p.container, p.source_sample_rate, p.source_channels) == ("ogg", 48_000, 1)
    assert p.source_sample_count == 24_000 and p.duration_ms == 500
    assert p.sample_count == expected_len(24_000, 48_000) == 8_000


def test_truncated_flac_is_refused() -> None:
    pytest.importorskip("soundfile")
    data = encoded(tone(16_000, 1.0)[:, None], 16_000, "FLAC", "PCM_16")
    with pytest.raises(AudioPrepError):
        prepare_audio(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("container_format", "codec", "container", "rate", "channels"),
    [("ipod", "aac", "m4a", 16_000, 1), ("mp4", "aac", "m4a", 44_100, 2), ("webm", "vorbis", "webm", 44_100, 2)],
)
def test_pyav_containers(container_format: str, codec: str, container: str, rate: int, channels: int) -> None:
    pytest.importorskip("av")
    signal = tone(rate, 1.0)
    data = encoded_av(frames_of(signal, channels), rate, container_format, codec)
    p = prepare_audio(data, container)
    assert (p.container, p.source_sample_rate, p.source_channels) == (container, rate, channels)
    # AAC and FFmpeg's Vorbis keep their encoder priming: up to a few frames more than the source.
    assert len(signal) <= p.source_sample_count <= len(signal) + 4096
    assert p.sample_count == expected_len(p.source_sample_count, rate)
    assert p.duration_ms == duration(p.source_sample_count, rate)


@pytest.mark.parametrize(
    ("container_format", "container", "declared", "rate", "channels"),
    [
        ("webm", "webm", "audio/webm", 48_000, 1),  # what MediaRecorder writes in Chrome and Firefox
        ("webm", "webm", "webm", 16_000, 2),
        ("ogg", "ogg", "audio/ogg", 24_000, 2),
        ("mp4", "m4a", "audio/mp4", 48_000, 1),  # MP4's dOps header is big-endian
    ],
)
def test_opus_decodes_through_libopus(
    container_format: str, container: str, declared: str, rate: int, channels: int
) -> None:
    """Opus in each container the demuxers know: always 48 kHz (Opus's own rate, whatever rate
    was encoded), down-mixed and resampled to 16 kHz like every other codec."""
    pytest.importorskip("av")
    signal = tone(rate, 1.0)
    data = encoded_av(frames_of(signal, channels), rate, container_format, "libopus")
    p = prepare_audio(data, declared)
    assert (p.container, p.source_sample_rate, p.source_channels) == (container, 48_000, channels)
    # Ogg trims to the granule exactly; WebM and MP4 keep at most one packet of end padding.
    padding = 0 if container == "ogg" else 5_760
    assert 48_000 <= p.source_sample_count <= 48_000 + padding
    assert p.sample_count == expected_len(p.source_sample_count, 48_000)
    assert p.duration_ms == duration(p.source_sample_count, 48_000)
    samples = pcm(p.pcm_s16le).astype(np.float64) / 32768
    middle = samples[2_000:14_000]
    assert abs(np.sqrt(np.mean(middle**2)) - 0.5 / np.sqrt(2)) < 0.03
    rising = np.count_nonzero((middle[:-1] < 0) & (middle[1:] >= 0))
    assert abs(rising * 16_000 / len(middle) - 440) < 5


@pytest.mark.parametrize("seconds", [0.25, 0.5, 1.0, 1.5, 3.3])
def test_ogg_opus_keeps_exactly_the_frames_ffmpeg_decodes(seconds: float) -> None:
    """Pre-skip and the end granule, read as FFmpeg reads them, for both FFmpeg's and libsndfile's
    Ogg/Opus (a stream of one page and of several)."""
    pytest.importorskip("av")
    pytest.importorskip("soundfile")
    signal = tone(48_000, seconds)[:, None]
    for data in (encoded_av(signal, 48_000, "ogg", "libopus"), encoded(signal, 48_000, "OGG", "OPUS")):
        assert prepare_audio(data, "ogg").source_sample_count == ffmpeg_frames(data)


def test_opus_refusals_follow_the_common_rules() -> None:
    pytest.importorskip("av")
    data = encoded_av(tone(48_000, 0.2)[:, None], 48_000, "webm", "libopus")
    with pytest.raises(AudioPrepError, match="does not match the webm container"):
        prepare_audio(data, "ogg")
    with pytest.raises(AudioPrepError, match="sample_rate 16000 does not match the decoded rate 48000"):
        prepare_audio(data, "webm", 16_000)  # Opus decodes at 48 kHz, so 16 kHz is a mismatch
    with pytest.raises(AudioPrepError):
        prepare_audio(data[: len(data) // 3] + bytes(200), "webm")


# -- classification and the asyncio side ------------------------------------------------------------

GOOD_WAV = wav_pcm(tone(16_000, 0.1)[:, None], 16_000)


def test_classification_passes_through_without_a_permit() -> None:
    text = {"text": "hi"}
    assert classify(text).item is text  # the very object: nothing to prepare
    assert classify("not a map").item == "not a map"
    nulled = {"text": "hi", "audio": None}
    out = classify(nulled)
    assert isinstance(out, audio_prep.AudioPrep)
    assert out.ok and out.item == {"text": "hi"} and "audio" in nulled  # a new map; input untouched
    assert classify({b"audio": None, "x": 1}).item == {"x": 1}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (DupDict([("audio", {"data": GOOD_WAV}), ("audio", None)], frozenset({"audio"})), "duplicate field"),
        ({"audio": {"data": GOOD_WAV}, b"audio": None}, "item.audio: duplicate field"),
        ({"audio": b"RIFF"}, "item.audio must be a map"),
        ({"audio": {"data": GOOD_WAV, "channels": 2}}, "item.audio: unknown field"),
        ({"audio": {"data": "UklGRg=="}}, "item.audio.data must be binary"),
        ({"audio": {"data": GOOD_WAV, "format": "x" * 33}}, "at most 32 bytes"),
        ({"audio": {"data": GOOD_WAV, "sample_rate": 0}}, "sample_rate must be a positive integer"),
    ],
)
def test_envelope_errors(item: Any, message: str) -> None:
    out = classify(item)
    assert isinstance(out, audio_prep.AudioPrep) and out.error is not None and message in out.error


async def test_prepare_items() -> None:
    good = {"text": "t", "audio": {"data": GOOD_WAV, "format": "wav", "sample_rate": 16_000}}
    bin_keys = {b"audio": {b"data": GOOD_WAV, b"format": None}}
    bad = {"audio": {"data": b"RIFF....WAVEnonsense"}}
    text = {"text": "only text"}
    out = await prepare_items([good, bad, text, bin_keys, {"audio": None}])
    assert [o.ok for o in out] == [True, False, True, True, True]
    assert out[0].item == {"text": "t"} and "audio" in good  # the original is not changed
    assert out[0].prepared is not None and tuple(out[0].prepared) == PREPARED_AUDIO_KEYS
    assert out[0].prepared["duration_ms"] == 100 and out[0].prepared["sample_count"] == 1600
    assert out[1].error is not None and out[1].error.startswith("audio")
    assert out[2].item is text and out[2].prepared is None
    assert out[3].item == {} and out[3].prepared is not None
    assert out[4].item == {} and out[4].prepared is None
    assert without_audio({"audio": 1, b"audio": 2, "a": 3}) == {"a": 3}


async def test_only_real_audio_waits_for_a_permit() -> None:
    sem = audio_prep.PERMITS.semaphore()
    await sem.acquire()  # hold the process's only permit
    try:
        ready = await asyncio.wait_for(prepare_items([{"text": "x"}, {"audio": None}, "x"]), 1.0)
        assert [o.ok for o in ready] == [True, True, True]
        waiting = asyncio.create_task(prepare_items([{"audio": {"data": GOOD_WAV}}]))
        await asyncio.sleep(0.1)
        assert not waiting.done()
    finally:
        sem.release()
    (done,) = await asyncio.wait_for(waiting, 5.0)
    assert done.prepared is not None


async def test_permits_limit_concurrent_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    permits = AudioPermits(2)
    monkeypatch.setattr(audio_prep, "PERMITS", permits)
    running, peak = 0, 0
    lock = threading.Lock()
    real = audio_prep._prepare_blocking

    def counting(job: Any) -> dict[str, Any]:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        try:
            return real(job)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(audio_prep, "_prepare_blocking", counting)
    out = await prepare_items([{"audio": {"data": GOOD_WAV}} for _ in range(6)])
    assert all(o.ok for o in out) and peak == 2
    permits.configure(0)
    assert permits.permits == 1


# -- costs, request bodies, backend acceptance -----------------------------------------------------


def test_extract_cost() -> None:
    assert extract_cost(None) == 1
    assert extract_cost({"duration_ms": 1234}) == 1234
    assert extract_cost({"duration_ms": 0}) == 1
    assert AUDIO_HARD_BATCH_COST_CAP == 720_000


def _work_item(item: Any) -> WorkItem:
    return WorkItem(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        total_items=1,
        operation="extract",
        model_id="m",
        pool_name="p",
        machine_profile="c",
        reply_subject="_INBOX.x",
        item=item,
    )


async def test_request_bodies_carry_prepared_audio_and_no_compressed_bytes() -> None:
    (prep,) = await prepare_items([{"text": "t", "audio": {"data": GOOD_WAV}}])
    work = _work_item(prep.item)
    body = extract_item(work, 0.0, prep.prepared)
    assert body["prepared_audio"] is prep.prepared and "audio" not in body["item"]
    assert extract_item(work)["prepared_audio"] is None
    for frame in (
        run_batch_body("m", "extract", [work], "", 100, prepared_audio=[prep.prepared]),
        per_op_body("m", "extract", [work], prepared_audio=[prep.prepared]),
    ):
        assert b"RIFF" not in frame and b"WAVE" not in frame  # §10 case 77
        decoded = msgpack.unpackb(frame, raw=False)
        items = decoded["items"]
        sent = items[0]["extract"] if "extract" in items[0] else items[0]
        assert prep.prepared is not None and sent["prepared_audio"]["pcm_s16le"] == prep.prepared["pcm_s16le"]
        assert prepared_audio_error(sent) is None


def _good_prepared() -> dict[str, Any]:
    return {
        "pcm_s16le": bytes(3200),
        "sample_rate": 16_000,
        "sample_count": 1600,
        "duration_ms": 100,
        "source_sample_rate": 44_100,
        "source_sample_count": 4410,
        "source_channels": 2,
        "container": "wav",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample_rate": 8000}, "sample_rate must be 16000"),
        ({"pcm_s16le": bytes(3199)}, "length must be 2 x sample_count"),
        ({"pcm_s16le": "text"}, "pcm_s16le must be binary"),
        ({"sample_count": 0, "pcm_s16le": b""}, "sample_count must be in"),
        ({"sample_count": MAX_SAMPLE_COUNT + 1}, "sample_count must be in"),
        ({"duration_ms": 720_001}, "duration_ms must be in"),
        ({"duration_ms": 99}, "does not match the source samples"),
        ({"source_sample_rate": 96_000}, "source_sample_rate must be in"),
        ({"source_sample_count": 0}, "source_sample_count must be positive"),
        ({"source_channels": 3}, "source_channels must be 1 or 2"),
        ({"container": "opus"}, "container is not a known container"),
        ({"container": ["wav"]}, "container is not a known container"),
        ({"duration_ms": True}, "must be an unsigned integer"),
        ({"source_channels": -1}, "must be an unsigned integer"),
    ],
)
def test_backend_refuses_bad_prepared_audio(change: dict[str, Any], message: str) -> None:
    assert prepared_audio_error({"item": {}, "prepared_audio": _good_prepared()}) is None
    error = prepared_audio_error({"item": {}, "prepared_audio": {**_good_prepared(), **change}})
    assert error is not None and message in error


def test_backend_prepared_audio_shape() -> None:
    assert prepared_audio_error({"item": {"text": "x"}}) is None
    assert prepared_audio_error({"item": {}, "prepared_audio": None}) is None
    assert prepared_audio_error({"item": {}, "prepared_audio": [1]}) == "prepared_audio must be a map"
    both = {"item": {"audio": {"data": b"x"}}, "prepared_audio": _good_prepared()}
    assert prepared_audio_error(both) == "prepared_audio given but item.audio was not removed"
