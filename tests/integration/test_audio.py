# SPDX-License-Identifier: Apache-2.0
"""Audio preparation end to end (scheduler-and-prep §7.3): real nats-server, the real sidecar and the
reference backend over a Unix socket. Decoded audio reaches the backend as `prepared_audio` with
`audio` gone from the item; refused audio is answered `invalid_request` and ACKed; text-only items
are untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack

from sie_sidecar.backend.null import NullAdapter

from ..audio_samples import encoded_av, ffmpeg_frames, frames_of, tone, wav_pcm
from .conftest import NatsServer
from .stack import MODEL, running_stack, work_item


class RecordingAdapter(NullAdapter):
    """The null adapter, remembering every batch item it was handed (after the server's checks)."""

    def __init__(self) -> None:
        super().__init__(dim=8, preloaded_models=[MODEL])
        self.seen: list[dict[str, Any]] = []

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        self.seen.extend(items)
        return await super().run_batch(model_id, op, items, lora_key)


async def test_extract_batch_with_good_bad_and_no_audio(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = RecordingAdapter()
    good_wav = wav_pcm(frames_of(tone(44_100, 1.5), 2), 44_100)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        good = work_item(
            operation="extract",
            request_id="audio-good",
            item={"text": "with audio", "audio": {"data": good_wav, "format": "wav", "sample_rate": 44_100}},
        )
        bad = work_item(
            operation="extract",
            request_id="audio-bad",
            item={"text": "broken audio", "audio": {"data": b"RIFF\x00\x00\x00\x00WAVEnot really", "format": "wav"}},
        )
        text = work_item(operation="extract", request_id="audio-none", item={"text": "no audio here"})
        ids = [await stack.publish(w) for w in (good, bad, text)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids))
        await stack.settled_pool()  # every delivery ACKed, the refused one included

        good_result, bad_result, text_result = (stack.results_for(i)[0] for i in ids)
        assert good_result["success"] is True and text_result["success"] is True
        assert bad_result["success"] is False
        assert bad_result["error_code"] == "invalid_request"
        assert bad_result["error"].startswith("audio")
        assert good_result["units"]["audio_ms"] == 1500  # the backend accepted 1.5 s of audio

        by_request = {item["request_id"]: item for item in adapter.seen}
        assert set(by_request) == {"audio-good", "audio-none"}  # the refused item never reached it
        sent = by_request["audio-good"]
        assert sent["item"] == {"text": "with audio"}  # `audio` removed from the item map
        prepared = sent["prepared_audio"]
        assert prepared["sample_rate"] == 16_000 and prepared["container"] == "wav"
        assert prepared["source_sample_rate"] == 44_100 and prepared["source_channels"] == 2
        assert prepared["source_sample_count"] == 66_150 and prepared["duration_ms"] == 1500
        assert prepared["sample_count"] == 24_000 and len(prepared["pcm_s16le"]) == 48_000
        assert b"RIFF" not in msgpack.packb(sent, use_bin_type=True)  # no compressed bytes over IPC
        plain = by_request["audio-none"]
        assert plain["item"] == {"text": "no audio here"} and plain["prepared_audio"] is None


async def test_offloaded_audio_prepares_like_inline(nats_server: NatsServer, tmp_path: Path) -> None:
    """§10 case 77: an item fetched from the payload store is prepared exactly as the inline one."""
    adapter = RecordingAdapter()
    item = {"text": "stored", "audio": {"data": wav_pcm(frames_of(tone(8_000, 0.5), 1), 8_000), "format": "wav"}}
    store = tmp_path / "payloads"
    store.mkdir()
    (store / "audio_0.bin").write_bytes(msgpack.packb(item, use_bin_type=True))
    env = {"SIE_PAYLOAD_STORE_URL": str(store)}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        inline = work_item(operation="extract", request_id="inline", item=item)
        stored = work_item(operation="extract", request_id="stored", item=None, payload_ref="audio_0.bin")
        ids = [await stack.publish(w) for w in (inline, stored)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids))
        await stack.settled_pool()
        assert all(stack.results_for(i)[0]["success"] is True for i in ids)
        by_request = {seen["request_id"]: seen for seen in adapter.seen}
        assert by_request["inline"]["prepared_audio"] == by_request["stored"]["prepared_audio"]
        assert by_request["stored"]["item"] == {"text": "stored"}
        assert by_request["stored"]["prepared_audio"]["sample_count"] == 8_000


async def test_browser_recordings_in_webm_and_ogg_opus_are_served(nats_server: NatsServer, tmp_path: Path) -> None:
    """What MediaRecorder writes (WebM/Opus) and Ogg/Opus reach the backend as 16 kHz PCM through
    the bundled libopus, answered and ACKed like any other audio."""
    adapter = RecordingAdapter()
    webm = encoded_av(frames_of(tone(48_000, 1.0), 2), 48_000, "webm", "libopus")
    ogg = encoded_av(frames_of(tone(48_000, 0.5), 1), 48_000, "ogg", "libopus")
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        items = [
            work_item(operation="extract", request_id="webm", item={"audio": {"data": webm, "format": "audio/webm"}}),
            work_item(operation="extract", request_id="ogg", item={"audio": {"data": ogg, "format": "ogg"}}),
        ]
        ids = [await stack.publish(w) for w in items]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids))
        await stack.settled_pool()
        assert all(stack.results_for(i)[0]["success"] is True for i in ids)
        by_request = {seen["request_id"]: seen["prepared_audio"] for seen in adapter.seen}
        webm_pcm, ogg_pcm = by_request["webm"], by_request["ogg"]
        assert (webm_pcm["container"], webm_pcm["source_sample_rate"], webm_pcm["source_channels"]) == (
            "webm",
            48_000,
            2,
        )
        assert 48_000 <= webm_pcm["source_sample_count"] <= 48_000 + 5_760  # WebM keeps its end padding
        # FFmpeg's Ogg muxer offsets the granules by the pre-skip: a one-page stream keeps 312 frames.
        assert (ogg_pcm["container"], ogg_pcm["source_sample_count"]) == ("ogg", ffmpeg_frames(ogg))
        assert ogg_pcm["sample_rate"] == 16_000 and len(ogg_pcm["pcm_s16le"]) == 2 * ogg_pcm["sample_count"]
        assert stack.results_for(ids[1])[0]["units"]["audio_ms"] == ogg_pcm["duration_ms"]
