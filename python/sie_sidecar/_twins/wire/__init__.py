# SPDX-License-Identifier: Apache-2.0
"""Pure-Python twin of the wire core: the same API as `sie_sidecar.wire._native_api`.

Used for parity tests, debugging and as the benchmark baseline; selected at run time by
`SIE_SIDECAR_NO_EXTENSIONS=1`.
"""

from __future__ import annotations

from .envelopes import (
    BatchedF16Multivector,
    BatchOutcome,
    IpcResponseChunk,
    ItemOutcome,
    ResponseEnvelope,
    decode_batch_outcome,
    decode_body,
    decode_response,
    encode_request,
    response_body,
)
from .framing import FrameReader, FrameSplitter, encode_frame
from .ipc_chunks import (
    PRODUCTION_LIMITS,
    AssembledResponse,
    ChunkLimits,
    IpcChunkAssembler,
    ResponseBudget,
    response_budget,
)
from .outputs import (
    f32_to_f16,
    frame_dense,
    frame_dense_batch,
    frame_extract,
    frame_multivector,
    frame_score,
    frame_sparse,
    nd_sentinel,
)
from .replies import FramedReplies, FramedResponse, frame_batch_response, frame_outcome_replies
from .response_chunks import encode_response_frames
from .results import (
    ReplyPlan,
    ResultChunkAssembler,
    encode_result_chunk,
    encode_work_result,
    plan_reply,
)
from .subjects import (
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
from .tombstones import BatchTombstones, TombstoneSet

IMPLEMENTATION = "python"

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
