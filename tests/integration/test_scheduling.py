# SPDX-License-Identifier: Apache-2.0
"""The scheduler path end to end (scheduler-and-prep §2, §3, §5, §6): items reach the backend in
formed batches under the configured caps, encode items carry the sidecar's PreparedTokens when the
backend's tokenizer matches, and the results are the same as when the backend tokenizes itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from sie_sidecar.backend.minilm import MiniLMAdapter
from sie_sidecar.backend.null import NullAdapter

from .conftest import NatsServer
from .stack import MODEL, running_stack, work_item

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class Recording(NullAdapter):
    """The null adapter, remembering the size of every batch it ran."""

    def __init__(self) -> None:
        super().__init__(dim=8, preloaded_models=[MODEL])
        self.sizes: list[int] = []

    async def run_batch(self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str) -> Any:
        self.sizes.append(len(items))
        return await super().run_batch(model_id, op, items, lora_key)


async def test_formed_batches_respect_the_count_cap(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = Recording()
    env = {"SIE_BATCHER_MAX_BATCH_REQUESTS": "4", "SIE_PULL_LOOP_MAX_OUTSTANDING": "64"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        ids = [await stack.publish(work_item(text=f"text {i}")) for i in range(40)]
        await stack.wait_for(lambda: all(stack.results_for(w) for w in ids))
        await stack.settled_pool()
    assert sum(adapter.sizes) == 40
    assert max(adapter.sizes) <= 4
    assert all(stack.results_for(w)[0]["success"] for w in ids)


class TokenSpy(MiniLMAdapter):
    """The MiniLM adapter, remembering the PreparedTokens each encode item arrived with."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared: dict[str, Any] = {}  # text -> the PreparedTokens it arrived with

    async def run_batch(self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str) -> Any:
        self.prepared.update({item["item"]["text"]: item.get("prepared_tokens") for item in items})
        return await super().run_batch(model_id, op, items, lora_key)


async def test_encode_items_carry_prepared_tokens_and_embed_the_same(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = TokenSpy()
    texts = ["a cat sits on the mat", "stock markets fell sharply", "ünïcödé text ✓"]
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        ids = [await stack.publish(work_item(model=MINILM, text=t)) for t in texts]
        await stack.wait_for(lambda: all(stack.results_for(w) for w in ids), timeout=60)
        await stack.settled_pool()
        replies = [stack.results_for(w)[0] for w in ids]
    assert all(r["success"] for r in replies), replies
    assert sorted(adapter.prepared) == sorted(texts) and all(p is not None for p in adapter.prepared.values())
    model = adapter._model
    assert model is not None
    for text in texts:
        tokens = adapter.prepared[text]
        assert tokens["tokenizer_id"] == model.tokenizer_id
        assert tokens["input_ids"][0] == model.tokenizer.encode(text).ids  # the backend's own ids
    # The vectors equal the backend's own tokenization of the same text.
    for text, reply in zip(texts, replies, strict=True):
        framed = msgpack.unpackb(reply["result_msgpack"])
        got = np.frombuffer(framed["dense"]["values"][b"data"], np.float32)
        np.testing.assert_allclose(got, model.embed([text])[0], rtol=1e-5, atol=1e-6)


async def test_the_live_controller_trace_replays_to_the_same_knobs(nats_server: NatsServer, tmp_path: Path) -> None:
    """SIE_SIDECAR_CONTROLLER_TRACE: the live controller's inputs and knobs, in the §4.7 replay format;
    replaying the file with its recorded config reproduces every knob value."""
    import json

    from sie_sidecar.sched.controller import replay_controller

    trace_dir = tmp_path / "trace"
    env = {"SIE_SIDECAR_CONTROLLER_TRACE": str(trace_dir), "SIE_BATCHER_MAX_BATCH_REQUESTS": "2"}
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        for wave in range(6):
            ids = [await stack.publish(work_item(text=f"t{wave}.{i}")) for i in range(6)]
            await stack.wait_for(lambda ids=ids: all(stack.results_for(w) for w in ids))
        await stack.settled_pool()
    (trace,) = trace_dir.iterdir()
    text = trace.read_text()
    config = next(line for line in text.splitlines() if line.startswith("# config: ")).removeprefix("# config: ")
    steps = [json.loads(line) for line in text.splitlines() if line.startswith('{"event":"step"')]
    assert len(steps) >= 6
    replayed = replay_controller(text, config)
    assert [(r["wait_ms"], r["batch_cost"]) for r in replayed] == [(s["wait_ms"], s["batch_cost"]) for s in steps]


async def test_an_unverifiable_tokenizer_id_still_batches_by_tokens(nats_server: NatsServer, tmp_path: Path) -> None:
    """Issue 11: a backend declaring its tokenizer in upstream's 32-hex form (not a SHA-256 this
    sidecar can verify) gets no PreparedTokens, but the items are still costed by their tokens, so
    every batch keeps to the token budget; counted here with the tokenizer itself at the backend."""
    from tokenizers import Tokenizer

    from sie_sidecar.backend.minilm import find_model_dir

    path = find_model_dir() / "tokenizer.json"
    counter = Tokenizer.from_file(str(path))
    counter.no_padding()  # the file pads to 128; the cost is the real tokens
    batches: list[tuple[int, int, bool]] = []  # (items, tokens, any prepared tokens)

    class Counting(NullAdapter):
        async def run_batch(self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str) -> Any:
            tokens = sum(len(counter.encode(item["item"]["text"]).ids) for item in items)
            batches.append((len(items), tokens, any(item.get("prepared_tokens") for item in items)))
            return await super().run_batch(model_id, op, items, lora_key)

    adapter = Counting(
        dim=8, preloaded_models=[MODEL], tokenizer_path=path, declared_tokenizer_id="ab" * 16, batch_delay_s=0.3
    )
    budget = 40
    env = {"SIE_BATCHER_MAX_BATCH_COST": str(budget)}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        text = " ".join(["word"] * 8)  # 8 words + [CLS] + [SEP]: 10 tokens each
        ids = [await stack.publish(work_item(text=text, item={"text": text})) for _ in range(24)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids), timeout=30.0)
    assert sum(n for n, _, _ in batches) == 24
    assert not any(prepared for _, _, prepared in batches)  # the backend tokenizes them itself
    assert all(tokens <= budget for _, tokens, _ in batches), batches
    assert max(n for n, _, _ in batches) > 1  # items did wait together (else the budget proves nothing)
