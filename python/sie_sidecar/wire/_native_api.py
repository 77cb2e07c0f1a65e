# SPDX-License-Identifier: Apache-2.0
"""The compiled wire core: Rust (`_native`) for bytes, Cython (`_native.wire`) for strings.

Same API as `sie_sidecar._twins.wire`. The few thin wrappers here only adapt arguments (numpy dtype
and shape for `nd_sentinel`); `frame_extract` (`wire.extract`) is shared with the twin: it is generic msgpack
of a small map, where msgpack's own C packer is already the fast path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _native
from .._native import (
    PRODUCTION_LIMITS,
    AssembledResponse,
    BatchedF16Multivector,
    BatchOutcome,
    ChunkLimits,
    FramedReplies,
    FramedResponse,
    FrameReader,
    FrameSplitter,
    IpcChunkAssembler,
    IpcResponseChunk,
    ItemOutcome,
    ReplyPlan,
    ResponseBudget,
    ResponseEnvelope,
    ResultChunkAssembler,
    decode_batch_outcome,
    decode_body,
    decode_response,
    encode_frame,
    encode_request,
    encode_response_frames,
    encode_result_chunk,
    encode_work_result,
    f32_to_f16,
    frame_batch_response,
    frame_dense,
    frame_dense_batch,
    frame_multivector,
    frame_outcome_replies,
    frame_score,
    frame_sparse,
    plan_reply,
    response_body,
    response_budget,
)
from .._native.wire import (
    BatchTombstones,
    TombstoneSet,
    WorkSubject,
    denormalize_token,
    filters_overlap,
    health_subject,
    is_safe_reply_subject,
    is_worker_direct_subject,
    model_from_subject,
    normalize_token,
    parse_batch_cancel,
    parse_generate_cancel,
    parse_work_cancel,
    parse_work_subject,
    pool_durable_filter,
    pool_durable_name,
    pool_stream_name,
    pool_stream_subjects,
    pool_work_subject,
    validate_lane_token,
    worker_consumer_name,
    worker_direct_filter,
    worker_direct_subject,
    worker_stream_name,
)
from .extract import frame_extract

if TYPE_CHECKING:
    import numpy.typing as npt

IMPLEMENTATION = "native"
__version__: str = _native.__version__


def nd_sentinel(array: npt.ArrayLike) -> bytes:
    """msgpack-numpy sentinel of an ndarray (C order, little-endian data)."""
    import numpy as np  # not at import time: `sie-sidecar run` starts ~50 ms sooner without numpy

    arr = np.ascontiguousarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return _native.nd_sentinel_raw(arr.dtype.str, [int(d) for d in arr.shape], arr.reshape(-1).data.cast("B"))


__all__ = [
    "IMPLEMENTATION",
    "PRODUCTION_LIMITS",
    "AssembledResponse",
    "BatchOutcome",
    "BatchTombstones",
    "BatchedF16Multivector",
    "ChunkLimits",
    "FrameReader",
    "FrameSplitter",
    "FramedReplies",
    "FramedResponse",
    "IpcChunkAssembler",
    "IpcResponseChunk",
    "ItemOutcome",
    "ReplyPlan",
    "ResponseBudget",
    "ResponseEnvelope",
    "ResultChunkAssembler",
    "TombstoneSet",
    "WorkSubject",
    "decode_batch_outcome",
    "decode_body",
    "decode_response",
    "denormalize_token",
    "encode_frame",
    "encode_request",
    "encode_response_frames",
    "encode_result_chunk",
    "encode_work_result",
    "f32_to_f16",
    "filters_overlap",
    "frame_batch_response",
    "frame_dense",
    "frame_dense_batch",
    "frame_extract",
    "frame_multivector",
    "frame_outcome_replies",
    "frame_score",
    "frame_sparse",
    "health_subject",
    "is_safe_reply_subject",
    "is_worker_direct_subject",
    "model_from_subject",
    "nd_sentinel",
    "normalize_token",
    "parse_batch_cancel",
    "parse_generate_cancel",
    "parse_work_cancel",
    "parse_work_subject",
    "plan_reply",
    "pool_durable_filter",
    "pool_durable_name",
    "pool_stream_name",
    "pool_stream_subjects",
    "pool_work_subject",
    "response_body",
    "response_budget",
    "validate_lane_token",
    "worker_consumer_name",
    "worker_direct_filter",
    "worker_direct_subject",
    "worker_stream_name",
]
