# SPDX-License-Identifier: Apache-2.0
"""The two §13 histograms of payload transfer (sidecar-behaviour §13): `sie.worker.result.chunk.size`
and `sie.worker.payload.fetch.duration`, read back through a real OTLP/HTTP receiver from the real
sidecar over a real nats-server, with the reference backend on its Unix socket and a real local
payload store. Their counts and sums are checked against what the gateway side received."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter

from .conftest import NatsServer
from .otlp_receiver import otlp_receiver
from .stack import MODEL, ROUTER, running_stack, work_item

pytestmark = pytest.mark.timeout(60)

LANE = "default|cpu|default"


def _env(url: str) -> dict[str, str]:
    return {
        "SIE_METRICS_ENABLED": "true",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "200",
        "SIE_OTEL_LANE": LANE,
    }


def _attrs(point: Any) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def _buckets(values: list[int], bounds: list[float]) -> list[int]:
    """OTLP explicit-bucket counts: bucket i holds the values in (bounds[i-1], bounds[i]]."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[next((i for i, bound in enumerate(bounds) if value <= bound), len(bounds))] += 1
    return counts


async def test_every_published_result_chunk_is_one_chunk_size_sample(nats_server: NatsServer, tmp_path: Path) -> None:
    """A result the null adapter pads to 3 MiB leaves as chunk messages (NATS max_payload is 1 MiB);
    the histogram has one sample per chunk message, of its size in bytes; a result refused whole
    adds none."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], oversized_bytes=3 * 1024 * 1024)
    chunk_sizes: list[int] = []
    assembler = wire.ResultChunkAssembler()
    assembled: list[tuple[str, bytes]] = []
    async with otlp_receiver() as receiver:
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=_env(receiver.url)) as stack:

            async def on_reply(msg: Any) -> None:
                decoded = msgpack.unpackb(msg.data)
                if isinstance(decoded, dict) and decoded.get("kind") == "result_chunk_v1":
                    chunk_sizes.append(len(msg.data))
                    done = assembler.feed(msg.data)
                    if done is not None:
                        assembled.append(done)

            await stack.nc.subscribe(f"_INBOX.{ROUTER}.>", cb=on_reply)
            wid = await stack.publish(work_item())
            await stack.wait_for(lambda: len(assembled) == 1, timeout=20)
            # Padded too, but refused whole (it takes no chunks): no chunk, no sample.
            refused = await stack.publish(work_item(accepts_result_chunks=False))
            await stack.wait_for(lambda: len(stack.results_for(refused)) == 1, timeout=20)
            await stack.settled_pool()
        assert assembled[0][0] == wid and len(chunk_sizes) >= 4  # 3 MiB in chunks of at most 1 MiB
        assert stack.results_for(refused)[0]["error_code"] == "PAYLOAD_TOO_LARGE"
        metrics = receiver.last_metrics()
        histogram = metrics["sie.worker.result.chunk.size"]
        assert histogram.unit == "By"
        (point,) = histogram.histogram.data_points
        assert _attrs(point) == {"lane": LANE}  # §13: no attributes of its own
        assert point.count == len(chunk_sizes) and point.sum == sum(chunk_sizes)
        assert list(point.bucket_counts) == _buckets(chunk_sizes, list(point.explicit_bounds))
        assert max(chunk_sizes) <= 1024 * 1024
        (published,) = metrics["sie.worker.result.chunks.published"].sum.data_points
        assert published.as_double == len(chunk_sizes)


async def test_every_payload_fetch_is_one_fetch_duration_sample_by_outcome(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Three offloaded items against a real local store: two found, one missing. The histogram has
    one sample per fetch, under the fetch's outcome and reason, each no longer than the whole wait
    for its reply, and it agrees with `sie.worker.payload.fetches`."""
    store = tmp_path / "payloads"
    store.mkdir()
    for name in ("a.msgpack", "b.msgpack"):
        (store / name).write_bytes(msgpack.packb({"text": f"from {name}"}))
    async with otlp_receiver() as receiver:
        env = _env(receiver.url) | {"SIE_PAYLOAD_STORE_URL": f"file://{store}"}
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            started = time.monotonic()
            ids = [
                await stack.publish(work_item(item=None, payload_ref=ref))
                for ref in ("a.msgpack", "b.msgpack", "missing.msgpack")
            ]
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
            waited_s = time.monotonic() - started
            await stack.settled_pool()
        assert [stack.results_for(w)[0]["success"] for w in ids] == [True, True, False]
        metrics = receiver.last_metrics()
        histogram = metrics["sie.worker.payload.fetch.duration"]
        assert histogram.unit == "s"
        durations = {(_attrs(p)["outcome"], _attrs(p)["reason"]): p for p in histogram.histogram.data_points}
        assert set(durations) == {("success", "none"), ("error", "not_found")}
        assert durations[("success", "none")].count == 2 and durations[("error", "not_found")].count == 1
        for point in durations.values():
            assert next(iter(_attrs(point))) == "lane"
            assert 0 < point.sum < waited_s and sum(point.bucket_counts) == point.count
        fetches = {
            (_attrs(p)["outcome"], _attrs(p)["reason"]): p.as_double
            for p in metrics["sie.worker.payload.fetches"].sum.data_points
        }
        assert fetches == {key: float(point.count) for key, point in durations.items()}
