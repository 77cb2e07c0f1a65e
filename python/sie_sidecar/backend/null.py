# SPDX-License-Identifier: Apache-2.0
"""A model-free adapter: deterministic vectors and switchable failure modes.

The sidecar's behaviour is mostly about what happens around inference (loading, per-item errors,
oversized responses, a backend that dies), so the null adapter makes each of those reproducible on
a laptop. Vectors depend only on the item text (and the LoRA), so results can be checked exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

import msgpack
import numpy as np
import numpy.typing as npt

from .. import wire
from ..errors import INFERENCE_ERROR
from ..ipc.types import FAILED, LOADING_IN_PROGRESS, LOADING_STARTED, READY, RETRY_LATER, ModelDescriptor, ReadyResponse
from ..prep.tokenize import tokenizer_id_of
from .adapter import Adapter, outcome_for, unit_counts
from .config_registry import ModelConfigRegistry
from .generation import GenerateStream, TokenStreamer
from .model_config import ApplyModelConfigRequest, ConfigApplied, PinnedApplied, ReplaceModelConfigsRequest

#: Redelivery delay for items of a model that is not loaded (the Python backend's SIE_NAK_DELAY_S).
NOT_LOADED_NAK_MS: Final = 5000
#: Key of the padding entry `oversized_bytes` adds to a result map.
PAD_KEY: Final = "_pad"
#: Tokens the cost model charges an untokenized text on top of its words ([CLS] and [SEP]).
SPECIAL_TOKENS: Final = 2
#: The cost model's defaults (issue 4): a batch costs 2 ms plus 2 µs per token.
DEFAULT_BATCH_TIME_A_MS: Final = 2.0
DEFAULT_BATCH_TIME_B_US: Final = 2.0

# SplitMix64 constants (Steele, Lea and Flood, 2014); numpy's uint64 array arithmetic wraps modulo 2**64.
_GOLDEN: Final = np.uint64(0x9E3779B97F4A7C15)
_MIX1: Final = np.uint64(0xBF58476D1CE4E5B9)
_MIX2: Final = np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31 = (np.uint64(n) for n in (11, 27, 30, 31))
_TWO_POW_M52: Final = 2.0**-52


def _positive_int(name: str, value: int, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _non_negative_number(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == float("inf"):
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return float(value)


def text_of(item: object) -> str:
    """The text an item carries (`item.text`), "" when there is none."""
    if isinstance(item, Mapping):
        text = item.get("text")
        if isinstance(text, str):
            return text
    return ""


def _text_tokens(text: str) -> int:
    return len(text.split()) + SPECIAL_TOKENS


def item_tokens(op: str, item: Mapping[str, Any]) -> int:
    """Tokens the cost model charges one batch item: the sidecar's PreparedTokens when it sent them
    (the sum of the `input_ids` rows, normally one: the same count the sidecar's scheduler costs the
    item at), else the whitespace word count plus [CLS]/[SEP] of every text the item carries."""
    prepared = item.get("prepared_tokens")
    if isinstance(prepared, Mapping):
        rows = prepared.get("input_ids")
        if isinstance(rows, list | tuple) and rows and all(isinstance(row, list | tuple) for row in rows):
            return sum(len(row) for row in rows)
    if op == "score":
        docs = item.get("score_items") or []
        return _text_tokens(text_of(item.get("query_item"))) + sum(_text_tokens(text_of(doc)) for doc in docs)
    return _text_tokens(text_of(item.get("item")))


class NullAdapter(Adapter):
    """Serves any model id with deterministic dense vectors (float32, L2-normalised).

    Loading: the first EnsureModelReady of a model answers `loading_started`, later ones
    `loading_in_progress` until `load_delay_s` has passed since that first call, then `ready`
    (models in `preloaded_models` are ready from the start). Failure modes: `retry_later_models`
    and `failed_models` answer those states for ever; `error_every=N` turns every Nth item the
    adapter infers (counted across batches, so how the sidecar batches cannot hide it) into an
    `inference_error`; `oversized_bytes` pads the first result of each batch so the
    response exceeds that size; `crash_after_batches=N` ends the process (`os._exit(1)`) when the
    Nth batch arrives; `batch_delay_s` makes every batch take that long. Items of a model that is
    not loaded are NAKed (`nak_retry`).

    Cost model (for scheduling benchmarks): with `batch_time_a_ms` or `batch_time_b_us_per_token`
    set, a batch of a loaded model occupies a simulated device for `a + b x (sum of item_tokens)`,
    and batches run on it one at a time, in arrival order (a GPU runs one forward at a time; two
    concurrent sleeps would double its capacity under the sidecar's pipelining). The reported
    `inference_ms` is that device time, so the sidecar's controller calibrates on it. Completion is
    scheduled on a device timeline rather than after each sleep, so timer overshoot adds latency
    but does not erode capacity. `tokenizer_path` makes the descriptor name a tokenizer (and its
    SHA-256 id, or `declared_tokenizer_id` instead), so the sidecar tokenizes and costs items by
    tokens; `batch_log` appends one JSON line per simulated batch (`t_s` monotonic completion time,
    `items`, `tokens`, `device_ms`, `queued_ms`) for benchmarks that need batch sizes and device
    utilisation.
    `supports_run_batch=False` makes it a per-op backend, as one from before RunBatch (the server
    answers RunBatch with `unknown method RunBatch`); `with_descriptor=False` answers `ready`
    without a model descriptor. Model configs (ApplyModelConfig, ReplaceModelConfigs) go to a
    `ModelConfigRegistry` whose hash Ping reports; `config_apply_delay_s` makes each write take that
    long (for tests of config changes racing batches).
    """

    def __init__(
        self,
        dim: int = 384,
        *,
        load_delay_s: float = 0.0,
        retry_later_models: Iterable[str] = (),
        failed_models: Iterable[str] = (),
        error_every: int = 0,
        error_retry_after_s: int | None = None,
        dispatch_width: int | None = None,
        oversized_bytes: int = 0,
        cached_results: bool = False,
        crash_after_batches: int = 0,
        supports_run_batch: bool = True,
        with_descriptor: bool = True,
        batch_budget: int = 64,
        preloaded_models: Iterable[str] = (),
        batch_delay_s: float = 0.0,
        batch_time_a_ms: float = 0.0,
        batch_time_b_us_per_token: float = 0.0,
        tokenizer_path: str | os.PathLike[str] | None = None,
        declared_tokenizer_id: str | None = None,
        batch_log: str | os.PathLike[str] | None = None,
        config_apply_delay_s: float = 0.0,
        generator: TokenStreamer | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.dim = _positive_int("dim", dim, minimum=1)
        if isinstance(load_delay_s, bool) or not isinstance(load_delay_s, int | float) or not load_delay_s >= 0:
            raise ValueError(f"load_delay_s must be a non-negative number, got {load_delay_s!r}")
        self.load_delay_s = float(load_delay_s)
        self.retry_later_models = frozenset(retry_later_models)
        self.failed_models = frozenset(failed_models)
        self.error_every = _positive_int("error_every", error_every)
        #: The `retry_after_s` hint each injected error carries (newer than v0.7.1; None: none).
        self.error_retry_after_s = error_retry_after_s
        #: `max_concurrent_dispatch` in the descriptor (an engine that batches on its own, newer than
        #: v0.7.1); and how many batches ran at once at most.
        self.dispatch_width = dispatch_width
        self.running = 0
        self.most_running = 0
        self.oversized_bytes = _positive_int("oversized_bytes", oversized_bytes)
        #: Every encode item gets one result framed at start (a fixed vector, no item id): a backend
        #: that costs next to nothing, for benches that measure the sidecar alone (issue 30).
        self.cached_results = bool(cached_results)
        self._cached_result: bytes | None = None
        self.crash_after_batches = _positive_int("crash_after_batches", crash_after_batches)
        self.supports_run_batch = bool(supports_run_batch)
        self.with_descriptor = bool(with_descriptor)
        self.batch_budget = _positive_int("batch_budget", batch_budget, minimum=1)
        if isinstance(batch_delay_s, bool) or not isinstance(batch_delay_s, int | float) or not batch_delay_s >= 0:
            raise ValueError(f"batch_delay_s must be a non-negative number, got {batch_delay_s!r}")
        self.batch_delay_s = float(batch_delay_s)
        self.batch_time_a_ms = _non_negative_number("batch_time_a_ms", batch_time_a_ms)
        self.batch_time_b_us_per_token = _non_negative_number("batch_time_b_us_per_token", batch_time_b_us_per_token)
        self.tokenizer_path: str | None = None
        self.tokenizer_id: str | None = None
        if tokenizer_path is not None:
            path = Path(tokenizer_path).resolve()
            self.tokenizer_id = tokenizer_id_of(path.read_bytes())  # fails at start, not on the first ready
            self.tokenizer_path = str(path)
        if declared_tokenizer_id is not None:
            self.tokenizer_id = declared_tokenizer_id  # e.g. upstream's 32-hex form, which no sidecar here verifies
        self._batch_log: IO[str] | None = (
            None if batch_log is None else open(batch_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        )
        self._clock = clock
        self._sleep = sleep
        self.configs = ModelConfigRegistry()
        #: Generation (wire-protocol §5): a deterministic token streamer, for every loaded model.
        self.generator = generator if generator is not None else TokenStreamer(tokenizer_path=tokenizer_path)
        self.config_apply_delay_s = _non_negative_number("config_apply_delay_s", config_apply_delay_s)
        self._config_writing = 0
        self.batches_during_config_write = 0
        self.items_on_wrong_hash = 0
        self._device_free_at = float("-inf")  # when the simulated device finishes its queued batches
        self.tokens = 0
        self.device_s = 0.0
        self._loaded: set[str] = set(preloaded_models) - self.retry_later_models - self.failed_models
        self._loading: dict[str, float] = {}
        #: The pinned ids SetPinnedModels last set (wire-protocol §3.5).
        self.pinned: frozenset[str] = frozenset()
        self.batches = 0
        self.inferred = 0  # items that reached inference, the count error_every steps through
        self.items = 0
        #: SplitMix64 increments per column: (column + 1) x the golden-ratio constant, modulo 2**64.
        self._columns = (np.arange(1, self.dim + 1, dtype=np.uint64) * _GOLDEN).astype(np.uint64)

    # -- readiness ----------------------------------------------------------------------------

    def _promote(self) -> None:
        """Loads whose delay has passed are finished, whether or not anyone asked yet."""
        now = self._clock()
        for model, started in list(self._loading.items()):
            if now - started >= self.load_delay_s:
                del self._loading[model]
                self._loaded.add(model)

    def descriptor(self, model_id: str) -> ModelDescriptor:
        return ModelDescriptor(
            tokenizer_path=self.tokenizer_path,
            tokenizer_id=self.tokenizer_id,
            max_seq_len=512,
            supports_run_batch=self.supports_run_batch,
            max_concurrent_dispatch=self.dispatch_width,
        )

    @property
    def cost_model(self) -> bool:
        """Whether batches take simulated device time (`batch_time_a_ms` or `_b_us_per_token` set)."""
        return self.batch_time_a_ms > 0 or self.batch_time_b_us_per_token > 0

    def batch_time_s(self, tokens: int) -> float:
        """The cost model's law: a + b x tokens, in seconds."""
        return self.batch_time_a_ms * 1e-3 + self.batch_time_b_us_per_token * 1e-6 * tokens

    async def _occupy_device(self, op: str, items: list[dict[str, Any]]) -> float:
        """Queue the batch on the simulated device and sleep until it is done; its device time (ms)."""
        tokens = sum(item_tokens(op, item) for item in items)
        busy = self.batch_time_s(tokens)
        now = self._clock()
        start = max(now, self._device_free_at)
        self._device_free_at = done = start + busy
        self.tokens += tokens
        self.device_s += busy
        await self._sleep(done - now)
        if self._batch_log is not None:
            record = {
                "t_s": done,
                "items": len(items),
                "tokens": tokens,
                "device_ms": busy * 1e3,
                "queued_ms": (start - now) * 1e3,
            }
            self._batch_log.write(json.dumps(record, separators=(",", ":")) + "\n")
        return busy * 1e3

    async def aclose(self) -> None:
        """Close the batch log (if any) when the server closes."""
        if self._batch_log is not None:
            self._batch_log.close()
            self._batch_log = None

    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        if model_id in self.failed_models:
            return ReadyResponse(FAILED)
        if model_id in self.retry_later_models:
            return ReadyResponse(RETRY_LATER)
        if model_id not in self._loaded and model_id not in self._loading:
            self._loading[model_id] = self._clock()
            return ReadyResponse(LOADING_STARTED)
        self._promote()
        if model_id in self._loading:
            return ReadyResponse(LOADING_IN_PROGRESS)
        descriptor = self.descriptor(model_id) if self.with_descriptor else None
        return ReadyResponse(READY, batch_budget=self.batch_budget, descriptor=descriptor)

    def loaded_models(self) -> Sequence[str]:
        self._promote()
        return sorted(self._loaded)

    def loading_models(self) -> Sequence[str]:
        self._promote()
        return sorted(self._loading)

    def supported_models(self) -> Sequence[str]:
        return sorted(self._loaded | set(self._loading))

    # -- generation ---------------------------------------------------------------------------

    def generation_models(self) -> Sequence[str]:
        return self.loaded_models()

    async def generate(self, model_id: str, work_item: Mapping[str, Any], stream: GenerateStream) -> None:
        self._promote()
        if model_id not in self._loaded:
            await stream.nak_envelope("model_not_loaded")
            await stream.ack()
            return
        await self.generator.run(work_item, stream)

    # -- model configuration ------------------------------------------------------------------

    def bundle_config_hash(self) -> str:
        return self.configs.bundle_config_hash

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ConfigApplied:
        return await self._config_write(lambda: self.configs.apply(request))

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ConfigApplied:
        return await self._config_write(lambda: self.configs.replace(request))

    async def set_pinned_models(self, models: tuple[str, ...]) -> PinnedApplied:
        """The pinning hook (wire-protocol §3.5): the authoritative set of pinned ids (`sie_id` or
        `sie_id:profile`), kept in `pinned`; a pinned id that is configured but not loaded starts
        loading, as a backend keeps its pinned models resident."""
        self.pinned = frozenset(models)
        for model in self.pinned:
            base = model.split(":", 1)[0]
            if base not in self._loaded and base not in self.failed_models and base not in self.retry_later_models:
                self._loading.setdefault(base, self._clock())
        return PinnedApplied(applied=True, pinned_count=len(self.pinned))

    async def _config_write(self, write: Callable[[], ConfigApplied]) -> ConfigApplied:
        """A write that takes `config_apply_delay_s`, during which the registry is half-applied: a batch
        that runs meanwhile is recorded in `batches_during_config_write` (the sidecar's barrier must
        keep that at zero)."""
        self._config_writing += 1
        try:
            if self.config_apply_delay_s:
                await self._sleep(self.config_apply_delay_s / 2)
                answer = write()
                await self._sleep(self.config_apply_delay_s / 2)
                return answer
            return write()
        finally:
            self._config_writing -= 1

    def _check_config(self, items: list[dict[str, Any]]) -> None:
        """Record a batch that overlaps a config write, or whose items pin another hash than ours."""
        if self._config_writing:
            self.batches_during_config_write += 1
        current = self.configs.bundle_config_hash
        for item in items:
            pinned = item.get("bundle_config_hash")
            if pinned and pinned != current:
                self.items_on_wrong_hash += 1

    # -- inference ----------------------------------------------------------------------------

    def vector(self, text: str, lora: str = "") -> npt.NDArray[np.float32]:
        """The unit vector of one text (row 0 of `vectors`)."""
        row: npt.NDArray[np.float32] = self.vectors([text], [lora])[0]
        return row

    def vectors(self, texts: Sequence[str], loras: Sequence[str]) -> npt.NDArray[np.float32]:
        """One L2-normalised row per (text, LoRA): uniform values in [-1, 1) from a counter-based
        generator (SplitMix64 of a per-text seed plus the column), computed for the whole batch at
        once. A per-item `np.random.Generator` cost ~20 µs an item, which made the throughput
        baseline measure the adapter instead of the sidecar."""
        seeds = np.fromiter(
            (
                int.from_bytes(hashlib.blake2b(f"{lora}\0{text}".encode(), digest_size=8).digest(), "little")
                for text, lora in zip(texts, loras, strict=True)
            ),
            dtype=np.uint64,
            count=len(texts),
        )
        z = seeds[:, None] + self._columns[None, :]
        z = (z ^ (z >> _S30)) * _MIX1
        z = (z ^ (z >> _S27)) * _MIX2
        z ^= z >> _S31
        values = ((z >> _S11).astype(np.float64) * _TWO_POW_M52 - 1.0).astype(np.float32)
        norms = np.linalg.norm(values, axis=1, keepdims=True)
        np.maximum(norms, np.float32(1e-30), out=norms)
        normalized: npt.NDArray[np.float32] = values / norms
        return normalized

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        self.batches += 1
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            return await self._run_batch_counted(model_id, op, items, lora_key)
        finally:
            self.running -= 1

    async def _run_batch_counted(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        if self.crash_after_batches and self.batches >= self.crash_after_batches:
            os._exit(1)  # a backend child dying mid-batch, for the sidecar's transport-error tests
        self.items += len(items)
        self._check_config(items)
        if self.batch_delay_s:
            await asyncio.sleep(self.batch_delay_s)  # a slow GPU, for drain and mid-flight failure tests
        self._check_config(items)
        self._promote()
        if model_id not in self._loaded:
            return [
                outcome_for(item, "nak_retry", nak_delay_ms=NOT_LOADED_NAK_MS, error=f"model {model_id} is not loaded")
                for item in items
            ]
        device_ms = await self._occupy_device(op, items) if self.cost_model else None
        started = time.perf_counter()
        if op == "encode":
            results, units = self._encode(items)
        elif op == "score":
            results, units = self._score(items)
        elif op == "extract":
            results = [wire.frame_extract({"entities": []}, _item_id(item)) for item in items]
            units = [
                unit_counts(input_tokens=len(text_of(item.get("item")).split()), audio_ms=_audio_ms(item))
                for item in items
            ]
        else:
            raise ValueError(f"unknown op {op!r}")
        elapsed_ms = (time.perf_counter() - started) * 1000.0 if device_ms is None else device_ms
        outcomes: list[dict[str, Any]] = []
        padded = self.oversized_bytes == 0
        first = self.inferred
        self.inferred += len(items)
        for k, (item, result, unit) in enumerate(zip(items, results, units, strict=True)):
            if self.error_every and (first + k + 1) % self.error_every == 0:
                outcomes.append(
                    outcome_for(
                        item,
                        "publish_error_and_ack",
                        error="null adapter: injected inference error",
                        error_code=INFERENCE_ERROR,
                        retry_after_s=self.error_retry_after_s,
                    )
                )
                continue
            data = bytes(result)
            if not padded:
                data = pad_result(data, self.oversized_bytes)
                padded = True
            outcomes.append(
                outcome_for(item, "publish_and_ack", result_msgpack=data, inference_ms=elapsed_ms, units=unit)
            )
        return outcomes

    def _encode(self, items: list[dict[str, Any]]) -> tuple[Iterable[Any], list[dict[str, int | None]]]:
        if self.cached_results:
            if self._cached_result is None:
                self._cached_result = bytes(wire.frame_dense(self.vector("cached")))
            return [self._cached_result] * len(items), [_NO_UNITS] * len(items)
        texts = [text_of(item.get("item")) for item in items]
        loras = [_lora(item) for item in items]
        matrix = self.vectors(texts, loras)
        ids = [_caller_id(item.get("item")) for item in items]
        framed = wire.frame_dense_batch(matrix, item_ids=ids)
        return framed, [unit_counts(input_tokens=len(t.split())) for t in texts]

    def _score(self, items: list[dict[str, Any]]) -> tuple[list[bytes], list[dict[str, int | None]]]:
        results: list[bytes] = []
        units: list[dict[str, int | None]] = []
        for item in items:
            query = text_of(item.get("query_item"))
            docs = list(item.get("score_items") or [])
            q = self.vector(query)
            doc_vectors = self.vectors([text_of(doc) for doc in docs], [""] * len(docs))
            scores = (doc_vectors @ q).astype(np.float32)
            ids = [_caller_id(doc) or f"item-{i}" for i, doc in enumerate(docs)]
            results.append(wire.frame_score(scores, ids))
            tokens = len(query.split()) + sum(len(text_of(doc).split()) for doc in docs)
            units.append(unit_counts(input_tokens=tokens, pairs=len(docs)))
        return results, units


_NO_UNITS: dict[str, int | None] = unit_counts()


def _caller_id(item: object) -> str | None:
    if isinstance(item, Mapping):
        value = item.get("id")
        if isinstance(value, str):
            return value
    return None


def _item_id(item: Mapping[str, Any]) -> str:
    return _caller_id(item.get("item")) or str(item.get("work_item_id", ""))


def _audio_ms(item: Mapping[str, Any]) -> int | None:
    """The accepted audio milliseconds of an extract item the sidecar prepared audio for."""
    prepared = item.get("prepared_audio")
    if isinstance(prepared, Mapping):
        ms = prepared.get("duration_ms")
        if isinstance(ms, int) and not isinstance(ms, bool):
            return ms
    return None


def _lora(item: Mapping[str, Any]) -> str:
    options = item.get("options")
    if isinstance(options, Mapping):
        lora = options.get("lora")
        if isinstance(lora, str):
            return lora
    return ""


def pad_result(result: bytes, size: int) -> bytes:
    """`result` with one more entry holding `size` zero bytes (a `_pad` key for a map, an element
    for an array), so it stays valid msgpack; other shapes come back unchanged."""
    if not result:
        return result
    marker = result[0]
    if 0x80 <= marker <= 0x8F:
        is_map, count, header = True, marker & 0x0F, 1
    elif marker == 0xDE:
        is_map, count, header = True, struct.unpack(">H", result[1:3])[0], 3
    elif marker == 0xDF:
        is_map, count, header = True, struct.unpack(">I", result[1:5])[0], 5
    elif 0x90 <= marker <= 0x9F:
        is_map, count, header = False, marker & 0x0F, 1
    elif marker == 0xDC:
        is_map, count, header = False, struct.unpack(">H", result[1:3])[0], 3
    elif marker == 0xDD:
        is_map, count, header = False, struct.unpack(">I", result[1:5])[0], 5
    else:
        return result
    count += 1
    if count < 16:
        new_header = bytes(((0x80 if is_map else 0x90) | count,))
    elif count < 0x10000:
        new_header = (b"\xde" if is_map else b"\xdc") + struct.pack(">H", count)
    else:
        new_header = (b"\xdf" if is_map else b"\xdd") + struct.pack(">I", count)
    key = msgpack.packb(PAD_KEY) if is_map else b""
    return b"".join((new_header, result[header:], key, msgpack.packb(bytes(size), use_bin_type=True)))


__all__ = [
    "DEFAULT_BATCH_TIME_A_MS",
    "DEFAULT_BATCH_TIME_B_US",
    "NOT_LOADED_NAK_MS",
    "PAD_KEY",
    "SPECIAL_TOKENS",
    "NullAdapter",
    "item_tokens",
    "pad_result",
    "text_of",
]
