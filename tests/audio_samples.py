# SPDX-License-Identifier: Apache-2.0
"""Audio fixtures built in memory: WAV with Python's `wave` module (or by hand for IEEE float), and
FLAC / Ogg / MP3 / M4A / WebM through soundfile and PyAV when they are installed."""

from __future__ import annotations

import io
import struct
import wave
from typing import Any, cast

import numpy as np
import numpy.typing as npt


def tone(rate: int, seconds: float, *, freq: float = 440.0, amp: float = 0.5) -> npt.NDArray[np.float64]:
    """A sine wave, `seconds` long at `rate`."""
    t = np.arange(round(rate * seconds)) / rate
    return amp * np.sin(2 * np.pi * freq * t)


def frames_of(signal: npt.NDArray[np.float64], channels: int) -> npt.NDArray[np.float64]:
    """(frames, channels): the same signal on every channel, or the array as given when 2-D."""
    if signal.ndim == 2:
        return signal
    return np.repeat(signal[:, None], channels, axis=1)


def wav_pcm(frames: npt.NDArray[np.float64], rate: int, sampwidth: int = 2) -> bytes:
    """Integer PCM WAV (8-bit unsigned, 16/24/32-bit signed) of `frames` (frames x channels, [-1, 1])."""
    frames = np.atleast_2d(frames.T).T if frames.ndim == 1 else frames
    channels = frames.shape[1]
    scale = float(1 << (8 * sampwidth - 1))
    ints = np.clip(np.round(frames * scale), -scale, scale - 1).astype(np.int64)
    if sampwidth == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    else:
        little = ints.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :sampwidth]
        raw = little.tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(sampwidth)
        w.setframerate(rate)
        w.writeframes(raw)
    return buf.getvalue()


def wav_float(frames: npt.NDArray[np.float64], rate: int) -> bytes:
    """IEEE float32 WAV (format tag 3), which the `wave` module can not write."""
    frames = np.atleast_2d(frames.T).T if frames.ndim == 1 else frames
    channels = frames.shape[1]
    data = frames.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def encoded(frames: npt.NDArray[np.float64], rate: int, fmt: str, subtype: str) -> bytes:
    """FLAC / OGG / MP3 bytes through soundfile (libsndfile); callers skip when it is missing."""
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, frames, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def encoded_av(frames: npt.NDArray[np.float64], rate: int, container: str, codec: str) -> bytes:
    """M4A (AAC) or WebM (Vorbis, Opus) bytes through PyAV (FFmpeg); callers skip when it is missing."""
    import av

    channels = frames.shape[1] if frames.ndim == 2 else 1
    layout = "stereo" if channels == 2 else "mono"
    planar = np.ascontiguousarray(frames_of(frames, channels).T.astype(np.float32))
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = cast(Any, out.add_stream(codec, rate=rate, layout=layout))  # an AudioStream
        if codec == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def ffmpeg_frames(data: bytes) -> int:
    """Frames FFmpeg (through PyAV) decodes from `data`'s first audio stream: the oracle for how
    much of an Opus stream is real audio once priming and end padding are trimmed."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        stream = container.streams.audio[0]
        return sum(int(frame.samples) for frame in container.decode(stream))


def pcm(prepared_pcm: bytes) -> npt.NDArray[np.int16]:
    """A PreparedAudio's `pcm_s16le` as int16 samples."""
    return np.frombuffer(prepared_pcm, dtype="<i2")


__all__ = ["encoded", "encoded_av", "ffmpeg_frames", "frames_of", "pcm", "tone", "wav_float", "wav_pcm"]
