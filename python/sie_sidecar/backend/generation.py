# SPDX-License-Identifier: Apache-2.0
"""Generation on the backend side of the IPC (wire-protocol §5): the stream an adapter's `generate`
hook writes to, and a deterministic token streamer for the reference backend.

The server answers a ProcessGenerate request with events on the request's own connection:
`in_progress` first, then the adapter's `publish` events (chunk or nak envelopes for the gateway),
one settlement (`ack` or `nak`, only the first counts on the sidecar), then `done`. An adapter that
returns without settling is ACKed for it; one that raises ends the stream with an error envelope,
which the sidecar answers with a NAK. `SignalGenerateCancel` sets `GenerateStream.cancelled`; ending
the stream (a terminal chunk with `finish_reason="cancelled"`, then `ack`) is the adapter's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgpack

from ..ipc.types import GenerateEvent


class GenerateStream:
    """One generation: chunk envelopes with a stable `attempt_id` and contiguous `seq` from 0."""

    def __init__(self, send: Callable[[GenerateEvent], Awaitable[None]], work_item: Mapping[str, Any], attempt_id: str):
        self._send = send
        self.work_item = work_item
        self.request_id = str(work_item.get("request_id") or "")
        self.reply_subject = str(work_item.get("reply_subject") or "")
        self.attempt_id = attempt_id
        self.seq = 0
        self.cancelled = asyncio.Event()
        #: "ack" or "nak" once the adapter settled; the server ACKs an unsettled stream at the end.
        self.settled: str | None = None

    async def _publish(self, envelope: dict[str, Any]) -> None:
        payload = bytes(msgpack.packb(envelope, use_bin_type=True))
        await self._send(GenerateEvent(kind="publish", reply_subject=self.reply_subject, payload=payload))

    async def chunk(
        self,
        text_delta: str = "",
        *,
        done: bool = False,
        finish_reason: str | None = None,
        usage: Mapping[str, int] | None = None,
        ttft_ms: float | None = None,
        error: Mapping[str, str] | None = None,
    ) -> None:
        """Publish the next chunk envelope (§5.3: omit-if-none fields left out)."""
        envelope: dict[str, Any] = {
            "kind": "chunk",
            "request_id": self.request_id,
            "attempt_id": self.attempt_id,
            "seq": self.seq,
            "text_delta": text_delta,
            "done": done,
        }
        if self.seq == 0:
            envelope["is_first"] = True
        if finish_reason is not None:
            envelope["finish_reason"] = finish_reason
        if usage is not None:
            envelope["usage"] = dict(usage)
        if ttft_ms is not None:
            envelope["ttft_ms"] = float(ttft_ms)
        if error is not None:
            envelope["error"] = dict(error)
        self.seq += 1
        await self._publish(envelope)

    async def nak_envelope(self, reason: str) -> None:
        """Tell the gateway to republish the work elsewhere (`kv_budget`, `model_not_loaded`, ...)."""
        await self._publish(
            {"kind": "nak", "request_id": self.request_id, "attempt_id": self.attempt_id, "reason": reason}
        )

    async def in_progress(self) -> None:
        await self._send(GenerateEvent(kind="in_progress"))

    async def ack(self) -> None:
        if self.settled is None:
            self.settled = "ack"
        await self._send(GenerateEvent(kind="ack"))

    async def nak(self, delay_ms: int | None = None) -> None:
        if self.settled is None:
            self.settled = "nak"
        await self._send(GenerateEvent(kind="nak", delay_ms=delay_ms))

    async def done(self) -> None:
        await self._send(GenerateEvent(kind="done"))


def prompt_of(generate: Mapping[str, Any]) -> str:
    """The flattened prompt (§7.4): `prompt`, else the messages' contents joined by newlines."""
    prompt = generate.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = generate.get("messages")
    if isinstance(messages, list):
        return "\n".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))
    return ""


_FALLBACK_WORDS = ("the", "model", "streams", "tokens", "one", "by", "one", "to", "its", "sidecar")


class TokenStreamer:
    """A deterministic generator: the tokens follow from the prompt (the same prompt streams the same
    answer), drawn from a real tokenizer's vocabulary when one is given. Knobs for tests and demos:
    `token_delay_s` between tokens, `kv_budget_naks` first requests answered with a `kv_budget` nak
    envelope before any chunk, `fail_after_tokens` a failure mid-stream (the adapter raises),
    `timestamps` the publish time in ns as each token's text (latency benches)."""

    def __init__(
        self,
        *,
        tokenizer_path: str | os.PathLike[str] | None = None,
        token_delay_s: float = 0.0,
        kv_budget_naks: int = 0,
        fail_after_tokens: int = 0,
        default_max_new_tokens: int = 16,
        timestamps: bool = False,
    ) -> None:
        self.token_delay_s = float(token_delay_s)
        #: For latency benches: every token's `text_delta` is the wall clock (ns) when it was published.
        self.timestamps = bool(timestamps)
        self.kv_budget_naks = int(kv_budget_naks)
        self.fail_after_tokens = int(fail_after_tokens)
        self.default_max_new_tokens = int(default_max_new_tokens)
        self._decode: Callable[[int], str] | None = None
        self._vocab_size = len(_FALLBACK_WORDS)
        #: Loaded at the first generation: a backend that never generates never reads the file.
        self._tokenizer_path = tokenizer_path
        self.streams = 0

    def _load_tokenizer(self) -> None:
        path, self._tokenizer_path = self._tokenizer_path, None
        if path is None:
            return
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        self._vocab_size = tokenizer.get_vocab_size()
        self._decode = lambda token: tokenizer.decode([token])

    def token_text(self, prompt: str, k: int) -> str:
        digest = hashlib.sha256(f"{prompt}\0{k}".encode()).digest()
        token = int.from_bytes(digest[:8], "big") % self._vocab_size
        if self._decode is None:
            return (" " if k else "") + _FALLBACK_WORDS[token]
        return (" " if k else "") + self._decode(token).strip()

    async def run(self, work_item: Mapping[str, Any], stream: GenerateStream) -> None:
        self.streams += 1
        self._load_tokenizer()
        generate = work_item.get("generate") or {}
        if not isinstance(generate, Mapping):
            raise ValueError("generate must be a map")
        if self.kv_budget_naks > 0:
            self.kv_budget_naks -= 1
            await stream.nak_envelope("kv_budget")
            await stream.ack()
            return
        prompt = prompt_of(generate)
        wanted = generate.get("max_new_tokens")
        max_new = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > 0 else None
        count = max_new or self.default_max_new_tokens
        for k in range(count):
            if stream.cancelled.is_set():
                await stream.chunk(done=True, finish_reason="cancelled")
                await stream.ack()
                return
            if self.fail_after_tokens and k == self.fail_after_tokens:
                raise RuntimeError("injected failure mid-stream")
            await stream.chunk(str(time.time_ns()) if self.timestamps else self.token_text(prompt, k))
            if self.token_delay_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stream.cancelled.wait(), self.token_delay_s)
        usage = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": count,
            "total_tokens": len(prompt.split()) + count,
        }
        await stream.chunk(done=True, finish_reason="length", usage=usage)
        await stream.ack()


__all__ = ["GenerateStream", "TokenStreamer", "prompt_of"]
