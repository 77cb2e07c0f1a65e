# SPDX-License-Identifier: Apache-2.0
"""Write the Opus fixtures the Rust audio crate's tests read (native/audio/tests/fixtures/).

Made with PyAV, which bundles FFmpeg with libopus: what a browser's MediaRecorder (WebM) or an Ogg
encoder writes. Committed, because `cargo test` runs without Python; rerun this script to remake
them (`python -m tests.make_opus_fixtures`), then rerun `cargo test -p sie-audio`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.audio_samples import encoded_av, tone

FIXTURES = Path(__file__).resolve().parent.parent / "native" / "audio" / "tests" / "fixtures"


def fixtures() -> dict[str, bytes]:
    """Name -> bytes: one second of tone, mono and stereo, in Ogg, WebM and MP4, at 48 and 16 kHz."""
    mono = tone(48_000, 1.0)[:, None]
    # Left 440 Hz, right 880 Hz: the down-mix must average them.
    stereo = np.stack([tone(48_000, 1.0, amp=0.4), tone(48_000, 1.0, freq=880.0, amp=0.4)], axis=1)
    return {
        "tone_mono_48k.opus": encoded_av(mono, 48_000, "ogg", "libopus"),
        "tone_stereo_48k.webm": encoded_av(stereo, 48_000, "webm", "libopus"),
        "tone_mono_16k.opus": encoded_av(tone(16_000, 1.0)[:, None], 16_000, "ogg", "libopus"),
        "tone_mono_48k.webm": encoded_av(mono, 48_000, "webm", "libopus"),
        # MP4's `dOps` box stores the header big-endian: the parser must read it so.
        "tone_mono_48k_opus.m4a": encoded_av(mono, 48_000, "mp4", "libopus"),
    }


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, data in fixtures().items():
        (FIXTURES / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
