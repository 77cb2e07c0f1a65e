# SPDX-License-Identifier: Apache-2.0
"""What a model backend implements to be served by `BackendServer` (docs/runtime.md, `backend/`).

The server owns the protocol (framing, envelopes, validation, LoRA injection, chunking, draining);
an adapter only answers for models: readiness and one homogeneous batch at a time. Keeping that
line here is what lets the null adapter and MiniLM share one server and one set of IPC tests.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..ipc.types import ModelDescriptor, ReadyResponse
from .model_config import ApplyModelConfigRequest, ConfigApplied, PinnedApplied, ReplaceModelConfigsRequest

if TYPE_CHECKING:
    from .generation import GenerateStream

#: The operations a RunBatch may carry (wire-protocol §4.2).
OPS: Final = ("encode", "score", "extract")
#: The redelivery delay of a batch that ran the accelerator out of memory: the Python backend's
#: `SIE_OOM_NAK_DELAY_S` default (wire-protocol §4.6), long enough for the memory to come back.
OOM_NAK_DELAY_MS: Final = 10_000
#: What `torch.cuda.OutOfMemoryError` (and `torch.OutOfMemoryError`) are called; matched by name so
#: that this library needs no torch.
_OOM_TYPE_NAME: Final = "OutOfMemoryError"
#: How torch before 1.13 worded the plain RuntimeError it raised for the same thing.
_OOM_MESSAGE_PREFIX: Final = "CUDA out of memory"


@dataclass(frozen=True, slots=True)
class F16Multivector:
    """Where one item's half-float token embeddings lie in a batched buffer (wire-protocol §4.7)."""

    work_item_id: str
    byte_offset: int
    num_tokens: int
    token_dims: int

    @property
    def byte_len(self) -> int:
        return self.num_tokens * self.token_dims * 2


@dataclass(frozen=True, slots=True)
class BatchOutputs:
    """A batch's ItemOutcome maps and, optionally, batched f16 multivector buffers with their items."""

    outcomes: list[dict[str, Any]]
    f16_buffers: Sequence[tuple[bytes, Sequence[F16Multivector]]] = ()


class Adapter(abc.ABC):
    """A model backend behind the IPC server.

    `run_batch` gets the wrapped batch items (EncodeBatchItem / ScoreBatchItem / ExtractBatchItem
    maps, already validated, LoRA already in `options["lora"]` for encode/extract) and returns one
    ItemOutcome map per item (`item_outcome` builds one). An exception fails the whole call with
    the envelope error `<ExceptionType>: <message>`, which the sidecar NAKs; an accelerator
    out-of-memory (`is_out_of_memory`) instead makes every item of the batch `nak_retry` with the
    server's OOM delay (10 s by default, wire-protocol §4.6).
    """

    @abc.abstractmethod
    def descriptor(self, model_id: str) -> ModelDescriptor:
        """Capabilities of a model, reported with `ready`."""

    @abc.abstractmethod
    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        """Start or check a load; must return quickly (loads run in the background)."""

    @abc.abstractmethod
    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        """Run one homogeneous batch; one ItemOutcome map per item, bound by `work_item_id`."""

    async def run_batch_outputs(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str, *, accepts_f16: bool
    ) -> BatchOutputs:
        """`run_batch`, plus batched f16 multivectors (wire-protocol §4.7) when the caller accepts
        them (`accepts_f16`): an adapter that returns token embeddings as half floats overrides this
        and puts them in one buffer, leaving those items' `result_msgpack` empty. The default runs
        `run_batch` and returns no buffers."""
        return BatchOutputs(await self.run_batch(model_id, op, items, lora_key))

    @abc.abstractmethod
    def loaded_models(self) -> Sequence[str]:
        """Models that are ready now (Ping and WorkerCapabilities sort them)."""

    # Optional hooks with the answers of a simple single-bundle backend.

    def healthy(self) -> bool:
        """Ping's `ready`: backend readiness and accelerator health (see `health`)."""
        return True

    async def health(self) -> bool:
        """What Ping's `ready` reports, awaited on every Ping, so an adapter can await a device
        check (a CUDA sync, a probe kernel); the default is `healthy()`. Keep it fast: the sidecar
        pings every 2 s and calls a heartbeat stale after its multiplier."""
        return self.healthy()

    def bundle_config_hash(self) -> str:
        """Ping's `bundle_config_hash`: the hash of the registry this backend serves ("" = none)."""
        return ""

    def loading_models(self) -> Sequence[str]:
        """Models whose load is in progress (Ping's newer `loading_models`)."""
        return ()

    def supported_models(self) -> Sequence[str]:
        """Configured model ids (WorkerCapabilities)."""
        return self.loaded_models()

    def generation_models(self) -> Sequence[str]:
        """Configured ids with a generate task (WorkerCapabilities; none until generation lands)."""
        return ()

    async def aclose(self) -> None:
        """Release model resources when the server closes."""
        return None

    # Model configuration from the control plane (wire-protocol §3.3-3.5). The server has already
    # checked the request; the default answers the typed "not supported" error.

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ConfigApplied:
        """Apply one model's config delta."""
        raise NotImplementedError("ApplyModelConfig is not supported by this backend")

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ConfigApplied:
        """Replace the bundle's model configs with this snapshot."""
        raise NotImplementedError("ReplaceModelConfigs is not supported by this backend")

    async def generate(self, model_id: str, work_item: Mapping[str, Any], stream: GenerateStream) -> None:
        """Stream one generation (wire-protocol §5): chunks through `stream.chunk`, then `ack` or
        `nak` (the server ACKs a stream left unsettled); watch `stream.cancelled`."""
        raise NotImplementedError("ProcessGenerate is not supported by this backend")

    async def set_pinned_models(self, models: tuple[str, ...]) -> PinnedApplied:
        """Replace the set of pinned models (`sie_id` or `sie_id:profile`)."""
        raise NotImplementedError("SetPinnedModels is not supported by this backend")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an adapter's exception is an accelerator out-of-memory (wire-protocol §4.6): a
    torch-style `OutOfMemoryError` (any class of that name in its MRO), or the RuntimeError older
    torch raised with "CUDA out of memory". The server answers such a batch with `nak_retry`
    instead of an error envelope, so its items come back once the memory is free."""
    if any(cls.__name__ == _OOM_TYPE_NAME for cls in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith(_OOM_MESSAGE_PREFIX)


def oom_nak_delay_ms(environ: Mapping[str, str]) -> int:
    """`SIE_OOM_NAK_DELAY_S` (seconds, > 0) in milliseconds; unset or invalid: `OOM_NAK_DELAY_MS`."""
    raw = environ.get("SIE_OOM_NAK_DELAY_S", "").strip()
    try:
        seconds = float(raw)
    except ValueError:
        return OOM_NAK_DELAY_MS
    if not seconds > 0 or seconds == float("inf"):
        return OOM_NAK_DELAY_MS
    return max(1, round(seconds * 1000))


def unit_counts(
    *,
    input_tokens: int | None = None,
    pages: int | None = None,
    images: int | None = None,
    audio_ms: int | None = None,
    pairs: int | None = None,
    content_input_tokens: int | None = None,
    output_tokens: int | None = None,
) -> dict[str, int | None]:
    """A UnitCounts map with all five v0.7.1 keys, nil for absent counts (wire-protocol §4.6), then
    `content_input_tokens` (score: the caller's own text tokens) and `output_tokens` (newer than
    v0.7.1) only when given."""
    counts = {"input_tokens": input_tokens, "pages": pages, "images": images, "audio_ms": audio_ms, "pairs": pairs}
    if content_input_tokens is not None:
        counts["content_input_tokens"] = content_input_tokens
    if output_tokens is not None:
        counts["output_tokens"] = output_tokens
    return counts


def item_outcome(
    work_item_id: str,
    request_id: str,
    item_index: int,
    disposition: str,
    *,
    nak_delay_ms: int | None = None,
    result_msgpack: bytes | None = None,
    error: str | None = None,
    error_code: str | None = None,
    inference_ms: float | None = None,
    tokenization_ms: float | None = None,
    postprocessing_ms: float | None = None,
    raw_output: Mapping[str, Any] | None = None,
    units: Mapping[str, int | None] | None = None,
    retry_after_s: int | None = None,
) -> dict[str, Any]:
    """An ItemOutcome map with the v0.7.1 keys in spec order; `retry_after_s` (newer) only when set.
    `result_msgpack` is nil unless given (an error or NAK carries no result, as upstream writes it)."""
    outcome: dict[str, Any] = {
        "work_item_id": work_item_id,
        "request_id": request_id,
        "item_index": item_index,
        "disposition": disposition,
        "nak_delay_ms": nak_delay_ms,
        "result_msgpack": result_msgpack,
        "error": error,
        "error_code": error_code,
        "inference_ms": inference_ms,
        "tokenization_ms": tokenization_ms or None,
        "postprocessing_ms": postprocessing_ms or None,
        "raw_output": None if raw_output is None else dict(raw_output),
        "units": None if units is None else dict(units),
    }
    if retry_after_s is not None:
        outcome["retry_after_s"] = retry_after_s
    return outcome


def outcome_for(item: Mapping[str, Any], disposition: str, **fields: Any) -> dict[str, Any]:
    """`item_outcome` for a batch item, taking its identity fields from the item map."""
    return item_outcome(
        str(item.get("work_item_id", "")),
        str(item.get("request_id", "")),
        int(item.get("item_index", 0)),
        disposition,
        **fields,
    )


__all__ = [
    "OOM_NAK_DELAY_MS",
    "OPS",
    "Adapter",
    "is_out_of_memory",
    "item_outcome",
    "oom_nak_delay_ms",
    "outcome_for",
    "unit_counts",
]
