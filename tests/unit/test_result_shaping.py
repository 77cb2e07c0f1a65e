# SPDX-License-Identifier: Apache-2.0
"""WorkResults from outcomes: raw-output framing, batched f16 slices, timings (wire-protocol §4.6-4.8, §8.1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pytest

from sie_sidecar import wire
from sie_sidecar.errors import RAW_OUTPUT_SHAPE_ERROR
from sie_sidecar.pipeline.replies import (
    batched_f16_slices,
    caller_item_id,
    error_result,
    executed_hash,
    outcome_result,
    queue_ms,
)
from sie_sidecar.wire.workitem import WorkItem


@dataclass
class FakeOutcome:
    """An ItemOutcome-shaped record (shaping is pure; no transport involved)."""

    disposition: str = "publish_and_ack"
    result_msgpack: bytes = b""
    error: str | None = None
    error_code: str | None = None
    inference_ms: float | None = 2.5
    tokenization_ms: float | None = None
    postprocessing_ms: float | None = None
    raw_output: dict[str, Any] | None = None
    units: dict[str, int | None] | None = None
    retry_after_s: int | None = None


@dataclass
class F16Batch:
    values_f16: bytes
    items: list[dict[str, Any]] = field(default_factory=list)


def item(**kw: Any) -> WorkItem:
    base: dict[str, Any] = {
        "work_item_id": "r.0",
        "request_id": "r",
        "item_index": 0,
        "total_items": 1,
        "operation": "encode",
        "model_id": "m",
        "pool_name": "default",
        "machine_profile": "cpu",
        "reply_subject": "_INBOX.gw.r",
    }
    base.update(kw)
    return WorkItem(**base)


def shape(o: FakeOutcome, it: WorkItem | None = None, **kw: Any) -> Any:
    return outcome_result(it or item(), o, worker_id="w-1", worker_direct=False, current_hash=None, **kw)


def test_backend_framed_result_passes_through_unchanged() -> None:
    r = shape(FakeOutcome(result_msgpack=b"\x81\xa1a\x01", raw_output={"dense": {"values": [1.0], "dim": 1}}))
    assert (r.success, r.result_msgpack, r.error, r.error_code) == (True, b"\x81\xa1a\x01", None, None)
    assert (r.processing_ms, r.worker_id, r.payload_fetch_ms) == (0.0, "w-1", None)


def test_raw_dense_is_framed_like_tv_f4_with_the_caller_id_first() -> None:
    r = shape(FakeOutcome(raw_output={"dense": {"values": [1.0, 2.0, 3.0], "dim": 3}}), item(item={"id": "doc-1"}))
    assert r.result_msgpack == wire.frame_dense(np.array([1, 2, 3], np.float32), item_id="doc-1")
    assert list(msgpack.unpackb(r.result_msgpack)) == ["id", "dense"]


def test_raw_dense_normalises_with_a_zero_norm_guard() -> None:
    r = shape(FakeOutcome(raw_output={"dense": {"values": [3.0, 4.0], "dim": 2, "normalize": True}}))
    values = np.frombuffer(msgpack.unpackb(r.result_msgpack)["dense"]["values"][b"data"], np.float32)
    np.testing.assert_allclose(values, [0.6, 0.8], rtol=1e-6)
    r = shape(FakeOutcome(raw_output={"dense": {"values": [0.0, 0.0], "dim": 2, "normalize": True}}))
    assert np.frombuffer(msgpack.unpackb(r.result_msgpack)["dense"]["values"][b"data"], np.float32).tolist() == [0, 0]


def test_raw_score_sparse_and_multivector() -> None:
    r = shape(FakeOutcome(raw_output={"score": {"scores": [0.5, 0.9], "item_ids": ["b", "a"]}}))
    assert r.result_msgpack == wire.frame_score(np.array([0.9, 0.5], np.float32), ["a", "b"])
    r = shape(FakeOutcome(raw_output={"sparse": {"indices": [3, 7], "values": [0.5, 1.5], "dims": 30522}}))
    assert msgpack.unpackb(r.result_msgpack)["sparse"]["dims"] == 30522
    raw = {"multivector": {"values": [1.0, -2.0, 3.5, 0.0], "num_tokens": 2, "token_dims": 2, "dtype": "float16"}}
    tv_f10 = bytes.fromhex(
        "81ab6d756c7469766563746f7284aa746f6b656e5f64696d7302aa6e756d5f746f6b656e7302a56474797065a7666c6f61743136"
        "a676616c75657385c4026e64c3c40474797065a33c6632c4046b696e64c400c4057368617065920202c40464617461c408003c00c000430000"
    )
    assert shape(FakeOutcome(raw_output=raw)).result_msgpack == tv_f10


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"dense": {"values": [1.0, 2.0], "dim": 3}},
        {"dense": {"values": "x", "dim": 1}},
        {"score": {"scores": [1.0], "item_ids": ["a", "b"]}},
        {"sparse": {"indices": [1, 2], "values": [1.0]}},
        {"multivector": {"values_f16": b"\x00\x3c", "num_tokens": 1, "token_dims": 1, "dtype": "float32"}},
        {"multivector": {"values": [1.0], "num_tokens": 2, "token_dims": 1}},
    ],
)
def test_bad_raw_output_becomes_a_shape_error_result(raw: dict[str, Any]) -> None:
    r = shape(FakeOutcome(raw_output=raw))
    assert (r.success, r.result_msgpack, r.error_code) == (False, b"", RAW_OUTPUT_SHAPE_ERROR)
    assert r.error


def test_raw_output_is_ignored_for_error_dispositions() -> None:
    r = shape(
        FakeOutcome(
            disposition="publish_error_and_ack", error="boom", error_code="inference_error", raw_output={"x": 1}
        )
    )
    assert (r.success, r.error, r.error_code, r.result_msgpack) == (False, "boom", "inference_error", b"")


def test_batched_f16_slice_is_framed_like_tv_f11b() -> None:
    buf = bytes.fromhex("003c00c000430000")
    slices = batched_f16_slices(
        [F16Batch(buf, [{"work_item_id": "r.0", "byte_offset": 2, "byte_len": 4, "num_tokens": 1, "token_dims": 2}])]
    )
    r = shape(FakeOutcome(), f16_slice=slices["r.0"])
    assert r.result_msgpack == bytes.fromhex(
        "81ab6d756c7469766563746f7284aa746f6b656e5f64696d7302aa6e756d5f746f6b656e7301a56474797065a7666c6f61743136"
        "a676616c75657385c4026e64c3c40474797065a33c6632c4046b696e64c400c4057368617065920102c40464617461c40400c00043"
    )


@pytest.mark.parametrize(
    "entry",
    [
        {"work_item_id": "r.0", "byte_offset": 1, "byte_len": 2, "num_tokens": 1, "token_dims": 1},
        {"work_item_id": "r.0", "byte_offset": 0, "byte_len": 10, "num_tokens": 5, "token_dims": 1},
        {"work_item_id": "r.0", "byte_offset": 0, "byte_len": 4, "num_tokens": 1, "token_dims": 1},
    ],
)
def test_bad_batched_f16_slices_become_shape_errors(entry: dict[str, Any]) -> None:
    slices = batched_f16_slices([F16Batch(b"\x00" * 8, [entry])])
    r = shape(FakeOutcome(), f16_slice=slices["r.0"])
    assert (r.success, r.error_code) == (False, RAW_OUTPUT_SHAPE_ERROR)
    assert str(r.error).startswith("batched f16 multivector")


def test_duplicate_batched_f16_ids_are_errors() -> None:
    e = {"work_item_id": "r.0", "byte_offset": 0, "byte_len": 2, "num_tokens": 1, "token_dims": 1}
    assert isinstance(batched_f16_slices([F16Batch(b"\x00" * 4, [e, e])])["r.0"], str)


def test_timings_hash_and_ids() -> None:
    it = item(timestamp=100.0, bundle_config_hash="h1", item={"id": b"doc"})
    assert queue_ms(it, now=100.25) == pytest.approx(250.0)
    assert queue_ms(item(), now=5.0) == 0.0
    assert queue_ms(item(timestamp=10.0), now=5.0) == 0.0
    assert executed_hash(it, "h1") == "h1"
    assert executed_hash(it, "h2") is None
    assert executed_hash(item(), "h1") is None
    assert caller_item_id(it) == "doc"
    assert caller_item_id(item(item={"id": 5})) is None
    assert caller_item_id(item(item={"id": b"\xff"})) is None


def test_error_result_has_no_timings() -> None:
    r = error_result(
        item(bundle_config_hash="h"),
        code="bad_operation",
        message="unknown operation",
        worker_id="w",
        worker_direct=True,
        current_hash="h",
    )
    assert (r.success, r.error, r.error_code, r.worker_direct, r.executed_bundle_config_hash) == (
        False,
        "unknown operation",
        "bad_operation",
        True,
        "h",
    )
    assert (r.inference_ms, r.queue_ms, r.processing_ms, r.payload_fetch_ms) == (None, None, None, None)


def test_the_backend_retry_hint_is_passed_through_unchanged() -> None:
    """wire-protocol §4.6 row 14 / §8.1 (newer than v0.7.1): `retry_after_s` goes to the WorkResult."""
    failed = shape(
        FakeOutcome(disposition="publish_error_and_ack", error="busy", error_code="QUEUE_FULL", retry_after_s=9)
    )
    assert (failed.success, failed.retry_after_s) == (False, 9)
    assert shape(FakeOutcome()).retry_after_s is None
