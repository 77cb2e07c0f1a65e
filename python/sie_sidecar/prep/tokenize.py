# SPDX-License-Identifier: Apache-2.0
"""Sidecar tokenization from the backend's ModelDescriptor (scheduler §6.3-6.4, §2.1).

Tokenizing in the sidecar takes the work off the GPU host's Python process and gives the scheduler
a real cost (tokens) per encode item. The backend only trusts the tokens when their `tokenizer_id`
equals its own, so identity is the lowercase hex SHA-256 of the tokenizer.json bytes on both sides
(a project rule that replaces the spec's 32-hex hash of re-serialised JSON: hashing the file needs no
round trip through the library's serializer, which could differ between library versions).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypedDict

from tokenizers import Encoding, Tokenizer

from ..ipc.types import ModelDescriptor
from .text import eligible_text, transform_text

__all__ = [
    "COST_ONLY",
    "DEFAULT_MAX_SEQ_LEN",
    "PREPARED_TOKENS",
    "REFUSAL_RETRY_S",
    "PreparedTokens",
    "RegisteredTokenizer",
    "TokenizerRegistry",
    "effective_max_seq_len",
    "encode_cost",
    "prepare_encode_batch",
    "tokenizer_id_of",
]

log = logging.getLogger(__name__)

#: Truncation cap when the descriptor gives none (§6.3).
DEFAULT_MAX_SEQ_LEN: Final = 512
#: A descriptor that failed to register is retried after this long even if it is unchanged (the
#: file may have appeared since); an unchanged one within it is refused without re-reading the file.
REFUSAL_RETRY_S: Final = 60.0
#: Caps at or above this are HF's "unset" sentinel (model_max_length = 1e30), not a real limit.
_CAP_SENTINEL: Final = 1_000_000


class PreparedTokens(TypedDict):
    """The PreparedTokens wire map (wire-protocol §4.4), keys in wire order."""

    input_ids: list[list[int]]
    attention_mask: list[list[int]]
    token_type_ids: list[list[int]]
    tokenizer_id: str
    max_seq_len: int


def tokenizer_id_of(data: bytes) -> str:
    """A tokenizer's identity: lowercase hex SHA-256 of its tokenizer.json bytes (all 64 chars)."""
    return hashlib.sha256(data).hexdigest()


def effective_max_seq_len(value: int | None) -> int:
    """The descriptor's cap when 0 < cap < 1,000,000, else 512 (§6.3, §11)."""
    return value if value is not None and 0 < value < _CAP_SENTINEL else DEFAULT_MAX_SEQ_LEN


def encode_cost(prepared: PreparedTokens | None) -> int:
    """Scheduler cost of an encode item (§2.1): its token count, or 1 when the backend tokenizes."""
    if prepared is None:
        return 1
    return max(1, sum(len(row) for row in prepared["input_ids"]))


def _configured(tokenizer_json: str, max_seq_len: int) -> Tokenizer:
    """A tokenizer that never pads and truncates longest-first to `max_seq_len` (§6.3).

    Built once per (file, cap) and never mutated afterwards: the encode calls borrow it shared
    (and release the GIL), so concurrent batches from worker threads are safe.
    """
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_len, stride=0, strategy="longest_first", direction="right")
    return tokenizer


#: The two ways a registered tokenizer is used (logged once per model, shown in diagnostics).
PREPARED_TOKENS: Final = "prepared_tokens"
COST_ONLY: Final = "cost_only"


def _is_sha256_id(value: str) -> bool:
    """A tokenizer id in this project's form: 64 lowercase hex characters."""
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


@dataclass(frozen=True, slots=True, eq=False)
class RegisteredTokenizer:
    """One model's registry entry: the configured tokenizer and what it was registered with.

    `sends_tokens` is False when the backend's declared identity cannot be proven equal to the file's
    SHA-256 (upstream backends declare a 32-hex BLAKE3 form, which this project does not compute):
    the items are still tokenized, so the scheduler costs them by tokens and batches respect the
    token budget, but no PreparedTokens are sent (the backend tokenizes them itself)."""

    tokenizer_path: str
    tokenizer_id: str
    max_seq_len: int
    default_query_template: str | None
    default_doc_template: str | None
    tokenizer: Tokenizer = field(repr=False)
    #: The id the backend declared (None: it declared none, which is trusted).
    declared_id: str | None = None
    sends_tokens: bool = True

    @property
    def mode(self) -> str:
        """`prepared_tokens` (tokens sent to the backend) or `cost_only` (tokens only cost items)."""
        return PREPARED_TOKENS if self.sends_tokens else COST_ONLY

    def matches(self, descriptor: ModelDescriptor) -> bool:
        """Whether a handshake's descriptor leaves this entry as it is (the registry's no-op row)."""
        declared = descriptor.tokenizer_id
        return (
            descriptor.tokenizer_path == self.tokenizer_path
            and (
                (declared is None or declared == self.tokenizer_id)
                if self.sends_tokens
                else declared == self.declared_id
            )
            and effective_max_seq_len(descriptor.max_seq_len) == self.max_seq_len
            and descriptor.default_query_template == self.default_query_template
            and descriptor.default_doc_template == self.default_doc_template
        )

    def prepare(self, items: Sequence[Mapping[str, Any]]) -> list[PreparedTokens | None]:
        """PreparedTokens per EncodeBatchItem map (None where the backend must tokenize).

        Every eligible text goes through one batch call: the library parallelises a batch across
        cores with the GIL released, which a loop of single encodes cannot do.
        """
        out: list[PreparedTokens | None] = [None] * len(items)
        slots: list[int] = []
        texts: list[str] = []
        for pos, item in enumerate(items):
            text = eligible_text(item) if isinstance(item, Mapping) else None
            if text is None:
                continue
            slots.append(pos)
            texts.append(transform_text(item, text, self.default_query_template, self.default_doc_template))
        if not texts:
            return out
        for pos, encoding in zip(slots, self._encode(texts), strict=True):
            out[pos] = None if encoding is None else self._wire(encoding)
        return out

    def _encode(self, texts: list[str]) -> list[Encoding | None]:
        """One batch call; if it fails, item by item, so one bad text costs only its own tokens."""
        encode_batch: Callable[[list[str]], list[Encoding]] = getattr(
            self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch
        )  # the _fast variant (tokenizers >= 0.20) skips character offsets, which nobody reads here
        try:
            return list(encode_batch(texts))
        except Exception as exc:
            log.debug("batch tokenization of %d texts failed (%s); retrying item by item", len(texts), exc)
        results: list[Encoding | None] = []
        for text in texts:
            try:
                results.append(self.tokenizer.encode(text))
            except Exception as exc:
                log.debug("tokenization failed, the backend tokenizes this item: %s", exc)
                results.append(None)
        return results

    def _wire(self, encoding: Encoding) -> PreparedTokens | None:
        """The wire map of one encoding; None when it broke the cap (the cap is below the special
        tokens' count, which the library then silently ignores)."""
        ids = encoding.ids
        if len(ids) > self.max_seq_len:
            log.debug("%d tokens exceed max_seq_len %d; the backend tokenizes this item", len(ids), self.max_seq_len)
            return None
        type_ids = encoding.type_ids
        return {
            "input_ids": [ids],
            "attention_mask": [encoding.attention_mask],
            "token_type_ids": [type_ids] if any(type_ids) else [],
            "tokenizer_id": self.tokenizer_id,
            "max_seq_len": self.max_seq_len,
        }


def prepare_encode_batch(
    tokenizer: RegisteredTokenizer | None, items: Sequence[Mapping[str, Any]]
) -> list[PreparedTokens | None]:
    """PreparedTokens per encode item, all None when the model has no registered tokenizer."""
    if tokenizer is None:
        return [None] * len(items)
    return tokenizer.prepare(items)


@dataclass(frozen=True, slots=True)
class _TokenizerFile:
    tokenizer_json: str
    tokenizer_id: str


class TokenizerRegistry:
    """Per-model tokenizers, updated from every EnsureModelReady descriptor (§6.4 registry table).

    A file is read once per path (again only when the backend declares a different id for it) and
    parsed once per (file, cap), since handshakes repeat for every batch. Registration never raises:
    any failure leaves the model without prepared tokens, so the backend tokenizes, which is always
    correct. Safe to call from several threads.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # injectable for tests of REFUSAL_RETRY_S
        self._lock = threading.Lock()
        self._models: dict[str, RegisteredTokenizer] = {}
        self._files: dict[str, _TokenizerFile] = {}
        self._tokenizers: dict[tuple[str, int], Tokenizer] = {}
        self._refused: dict[str, tuple[ModelDescriptor, float]] = {}

    def get(self, model_id: str) -> RegisteredTokenizer | None:
        """The model's entry, if its backend declared a usable tokenizer."""
        return self._models.get(model_id)

    def forget(self, model_id: str) -> None:
        """Drop a model's entry (the backend unloaded it, or stopped declaring a tokenizer)."""
        with self._lock:
            self._refused.pop(model_id, None)
            self._drop(model_id)

    def prepare_encode_batch(self, model_id: str, items: Sequence[Mapping[str, Any]]) -> list[PreparedTokens | None]:
        """`prepare_encode_batch` with the model's current entry."""
        return prepare_encode_batch(self.get(model_id), items)

    def register(self, model_id: str, descriptor: ModelDescriptor | None) -> RegisteredTokenizer | None:
        """Apply a `ready` handshake's descriptor; returns the model's entry after it (None: none).

        Unlike the Rust sidecar, a handshake without a descriptor or `tokenizer_path` removes an
        existing entry instead of keeping it: the backend no longer vouches for those tokens.
        """
        with self._lock:
            current = self._models.get(model_id)
            if descriptor is None or not descriptor.tokenizer_path:
                if current is not None:
                    log.info("model %s no longer declares a tokenizer; the backend tokenizes", model_id)
                    self._drop(model_id)
                return None
            if current is not None and current.matches(descriptor):
                return current
            now = self._clock()
            if self._refused_recently(model_id, descriptor, now):
                return None  # the same answer again: no re-read, no second warning
            try:
                entry = self._build(descriptor, descriptor.tokenizer_path)
            except Exception as exc:  # OSError, UnicodeDecodeError, the library's parse errors
                log.warning("tokenizer of model %s not loaded, the backend tokenizes: %s", model_id, exc)
                entry = None
            if entry is None:
                self._drop(model_id)
                self._refused[model_id] = (descriptor, now)
                return None
            self._refused.pop(model_id, None)
            self._models[model_id] = entry
            self._prune()
            log.info(
                "tokenizer registered for model %s: %s (id %s, max_seq_len %d), mode %s",
                model_id,
                entry.tokenizer_path,
                entry.tokenizer_id[:12],
                entry.max_seq_len,
                entry.mode,
                extra={"model": model_id, "tokenizer_mode": entry.mode},
            )
            return entry

    async def register_async(self, model_id: str, descriptor: ModelDescriptor | None) -> RegisteredTokenizer | None:
        """`register` for the event loop: the usual no-op answers inline, a (re)load in a worker
        thread (reading and parsing a large tokenizer.json takes tens to hundreds of ms)."""
        current = self._models.get(model_id)
        if descriptor is None or not descriptor.tokenizer_path:
            if current is None:
                return None  # no tokenizer before, none now: nothing to read (every batch of such a model)
        elif current is not None and current.matches(descriptor):
            return current
        elif self._refused_recently(model_id, descriptor, self._clock()):
            return None  # refused this very descriptor moments ago: `register` would not re-read it
        return await asyncio.to_thread(self.register, model_id, descriptor)

    def _refused_recently(self, model_id: str, descriptor: ModelDescriptor, now: float) -> bool:
        """This very descriptor was refused for the model less than REFUSAL_RETRY_S ago."""
        refused = self._refused.get(model_id)
        return refused is not None and refused[0] == descriptor and now - refused[1] < REFUSAL_RETRY_S

    def _build(self, descriptor: ModelDescriptor, path: str) -> RegisteredTokenizer | None:
        declared = descriptor.tokenizer_id
        loaded = self._files.get(path)
        if loaded is None or (declared is not None and _is_sha256_id(declared) and declared != loaded.tokenizer_id):
            data = Path(path).read_bytes()  # again when a SHA-256 id disagrees: the file may have changed
            loaded = _TokenizerFile(data.decode("utf-8"), tokenizer_id_of(data))
            self._files[path] = loaded
        sends_tokens = declared is None or declared == loaded.tokenizer_id
        if not sends_tokens:
            if declared is not None and _is_sha256_id(declared):
                # scheduler-and-prep §6.4: a declared id that is not the file's hash is refused; the
                # model stays on backend tokenization (its items cost one each).
                log.warning(
                    "tokenizer %s refused: the backend declares id %s but the file hashes to %s; the backend tokenizes",
                    path,
                    declared,
                    loaded.tokenizer_id,
                )
                return None
            else:
                log.info(
                    "tokenizer %s: the backend's id %s is not a SHA-256 this sidecar can verify; "
                    "tokens cost items but are not sent",
                    path,
                    declared,
                )
        cap = effective_max_seq_len(descriptor.max_seq_len)
        key = (loaded.tokenizer_id, cap)
        tokenizer = self._tokenizers.get(key)
        if tokenizer is None:
            tokenizer = self._tokenizers[key] = _configured(loaded.tokenizer_json, cap)
        return RegisteredTokenizer(
            tokenizer_path=path,
            tokenizer_id=loaded.tokenizer_id,
            max_seq_len=cap,
            default_query_template=descriptor.default_query_template,
            default_doc_template=descriptor.default_doc_template,
            tokenizer=tokenizer,
            declared_id=declared,
            sends_tokens=sends_tokens,
        )

    def _drop(self, model_id: str) -> None:
        self._models.pop(model_id, None)
        self._prune()

    def _prune(self) -> None:
        """Keep parsed tokenizers and file texts only while some model uses them."""
        used = {(e.tokenizer_id, e.max_seq_len) for e in self._models.values()}
        for key in [k for k in self._tokenizers if k not in used]:
            del self._tokenizers[key]
        paths = {e.tokenizer_path for e in self._models.values()}
        for path in [p for p in self._files if p not in paths]:
            del self._files[path]
