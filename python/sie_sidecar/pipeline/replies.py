# SPDX-License-Identifier: Apache-2.0
"""WorkResults from backend outcomes and from sidecar-side errors (wire-protocol §4.6-4.8, §8.1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .. import wire
from ..errors import RAW_OUTPUT_SHAPE_ERROR, ShapeError
from ..wire.result_fields import executed_hash, queue_ms
from ..wire.types import WorkResult
from ..wire.workitem import WorkItem

if TYPE_CHECKING:
    import numpy as np


class Outcome(Protocol):
    """The attributes of an ItemOutcome that shaping reads (native pyclass or twin dataclass)."""

    @property
    def disposition(self) -> str: ...
    @property
    def result_msgpack(self) -> bytes: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def inference_ms(self) -> float | None: ...
    @property
    def tokenization_ms(self) -> float | None: ...
    @property
    def postprocessing_ms(self) -> float | None: ...
    @property
    def raw_output(self) -> dict[str, Any] | None: ...
    @property
    def units(self) -> dict[str, int | None] | None: ...
    @property
    def retry_after_s(self) -> int | None: ...


def caller_item_id(item: WorkItem) -> str | None:
    """The caller's id echoed first in encode results: the resolved item's `id`, str or UTF-8 bin."""
    payload = item.item
    if not isinstance(payload, dict):
        return None
    value = payload.get("id")
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def error_result(
    item: WorkItem,
    *,
    code: str,
    message: str,
    worker_id: str,
    worker_direct: bool,
    current_hash: str | None,
    retry_after_s: int | None = None,
) -> WorkResult:
    """A synthetic sidecar error: error, code, worker id and direct flag; every timing nil."""
    return WorkResult(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        success=False,
        error=message,
        error_code=code,
        worker_id=worker_id,
        worker_direct=worker_direct,
        executed_bundle_config_hash=executed_hash(item, current_hash),
        retry_after_s=retry_after_s,
    )


def _floats(values: Any, what: str) -> np.ndarray[Any, np.dtype[np.float32]]:
    import numpy as np  # only raw outputs need it; `run` starts without numpy

    if not isinstance(values, list):
        raise ShapeError(f"{what} must be an array")
    try:
        return np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError):
        raise ShapeError(f"{what} must hold numbers") from None


def frame_raw_output(raw: Mapping[str, Any], item_id: str | None, item_index: int) -> bytes:
    """Frame a typed RawOutput (§4.8): the first populated of dense, score, sparse, multivector."""
    dense = raw.get("dense")
    if dense is not None:
        values = _floats(dense.get("values"), "dense values")
        dim = dense.get("dim")
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise ShapeError("dense dim must be an unsigned int")
        return wire.frame_dense(values, dims=dim, item_id=item_id, normalize=bool(dense.get("normalize", False)))
    score = raw.get("score")
    if score is not None:
        ids = score.get("item_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ShapeError("score item_ids must be strings")
        return wire.frame_score(_floats(score.get("scores"), "scores"), ids)
    sparse = raw.get("sparse")
    if sparse is not None:
        indices = sparse.get("indices")
        if not isinstance(indices, list):
            raise ShapeError("sparse indices must be an array")
        import numpy as np

        try:
            idx = np.asarray(indices, dtype=np.int32)
        except (TypeError, ValueError, OverflowError):
            raise ShapeError("sparse indices must be int32") from None
        dims = sparse.get("dims")
        return wire.frame_sparse(idx, _floats(sparse.get("values"), "sparse values"), dims=dims, item_id=item_id)
    multi = raw.get("multivector")
    if multi is not None:
        num_tokens, token_dims = multi.get("num_tokens"), multi.get("token_dims")
        if not isinstance(num_tokens, int) or not isinstance(token_dims, int):
            raise ShapeError("multivector num_tokens and token_dims must be unsigned ints")
        dtype = multi.get("dtype") or "float32"
        values_f16 = multi.get("values_f16") or None
        mv_values = None if values_f16 else _floats(multi.get("values"), "multivector values")
        return wire.frame_multivector(
            mv_values, num_tokens, token_dims, dtype=dtype, item_id=item_id, values_f16=values_f16
        )
    raise ShapeError(f"raw_output of item {item_index} has no populated variant")


def batched_f16_slices(batches: Sequence[Any]) -> dict[str, tuple[bytes, int, int] | str]:
    """Per work item: (f16 bytes, num_tokens, token_dims), or an error text (§4.7)."""
    out: dict[str, tuple[bytes, int, int] | str] = {}
    for batch in batches:
        buf = batch.values_f16
        for entry in batch.items:
            wid = entry["work_item_id"]
            off, length = entry["byte_offset"], entry["byte_len"]
            n, d = entry["num_tokens"], entry["token_dims"]
            if wid in out:
                out[wid] = "batched f16 multivector: duplicate work_item_id"
            elif off % 2 or length % 2 or off + length > len(buf):
                out[wid] = "batched f16 multivector: slice outside the buffer or not f16-aligned"
            elif length != n * d * 2:
                out[wid] = "batched f16 multivector: byte_len does not match num_tokens x token_dims"
            else:
                out[wid] = (bytes(buf[off : off + length]), n, d)
    return out


def outcome_result(
    item: WorkItem,
    outcome: Outcome,
    *,
    worker_id: str,
    worker_direct: bool,
    current_hash: str | None,
    f16_slice: tuple[bytes, int, int] | str | None = None,
    now: float | None = None,
    payload_fetch_ms: float = 0.0,
) -> WorkResult:
    """The WorkResult for a publish_* outcome, framing sidecar-side outputs when needed."""
    success = outcome.disposition == "publish_and_ack"
    payload = outcome.result_msgpack
    error, code = outcome.error, outcome.error_code
    if success and not payload:
        try:
            if f16_slice is not None:
                if isinstance(f16_slice, str):
                    raise ShapeError(f16_slice)
                data, n, d = f16_slice
                payload = wire.frame_multivector(
                    None, n, d, dtype="float16", item_id=caller_item_id(item), values_f16=data
                )
            elif outcome.raw_output is not None:
                payload = frame_raw_output(outcome.raw_output, caller_item_id(item), item.item_index)
        except ShapeError as exc:
            success, payload, error, code = False, b"", str(exc), RAW_OUTPUT_SHAPE_ERROR
    if not success and outcome.disposition == "nak_retry" and error is None:
        error = "nak_retry reached publisher"
    return WorkResult(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        success=success,
        result_msgpack=payload if success else b"",
        error=None if success else error,
        error_code=None if success else code,
        inference_ms=outcome.inference_ms,
        queue_ms=queue_ms(item, now),
        processing_ms=0.0,
        worker_id=worker_id,
        tokenization_ms=outcome.tokenization_ms,
        postprocessing_ms=outcome.postprocessing_ms,
        payload_fetch_ms=payload_fetch_ms if payload_fetch_ms > 0 else None,  # §6.1: only if > 0
        units=outcome.units,
        worker_direct=worker_direct,
        executed_bundle_config_hash=executed_hash(item, current_hash),
        retry_after_s=outcome.retry_after_s,  # newer than v0.7.1: passed through unchanged (§6.1)
    )


__all__ = [
    "Outcome",
    "batched_f16_slices",
    "caller_item_id",
    "error_result",
    "executed_hash",
    "frame_raw_output",
    "outcome_result",
    "queue_ms",
]
