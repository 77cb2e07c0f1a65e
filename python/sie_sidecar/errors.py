# SPDX-License-Identifier: Apache-2.0
"""Typed errors of the wire core, shared by the native core and the pure-Python twin."""

from __future__ import annotations

# ----------------------------------------------------------------------- WorkResult error codes (§4.2, §6)
# Every `error_code` the sidecar or the reference backend writes, named once. The case follows v0.7.1:
# lower snake case for the sidecar's own codes, upper case where v0.7.1 upper-cases them.

BAD_OPERATION = "bad_operation"  # unknown operation (§4.2)
MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"  # EnsureModelReady answered `failed` (§4.2)
PAYLOAD_ERROR = "payload_error"  # an offloaded payload could not be fetched or decoded (§12)
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"  # over the envelope cap, or a result over the transport limit (§6)
INVALID_INPUT = "INVALID_INPUT"  # extract image / document shape invalid (§4.2)
INVALID_REQUEST = "invalid_request"  # extract audio refused by preparation (§4.2)
RAW_OUTPUT_SHAPE_ERROR = "raw_output_shape_error"  # a typed raw output could not be framed (§6.1)
INFERENCE_ERROR = "inference_error"  # the reference backend's per-item inference failure
RUN_BATCH_MIXED_OP = "run_batch_mixed_op"  # the reference backend: a RunBatch item of another op
RUN_BATCH_INVALID_ITEM = "run_batch_invalid_item"  # the reference backend: an item without its op payload


class WireError(Exception):
    """Base class: every parser and encoder of the wire core raises a subclass of this."""


class FrameTooLarge(WireError):
    """An IPC body is over the frame ceiling; the connection must be closed."""


class ProtocolError(WireError):
    """Malformed bytes or envelope; the connection must be closed."""


class DecodeError(ProtocolError):
    """Not msgpack, trailing bytes, wrong shape, wrong field type or a missing required key."""


class ChunkProtocolError(ProtocolError):
    """An IpcResponseChunkV1 or ResultChunkV1 rule was broken; the transfer is void."""


class BudgetExceeded(WireError):
    """The process-wide reassembly budget cannot hold this transfer right now."""


class IpcServerError(WireError):
    """The backend answered ok=false; not retried, the connection stays usable."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ShapeError(WireError):
    """Output framing rejected its input; the item becomes a raw_output_shape_error result."""

    code = RAW_OUTPUT_SHAPE_ERROR


class PayloadTooLarge(WireError):
    """A reply cannot be published within max_payload, not even as a compact error."""

    code = PAYLOAD_TOO_LARGE


class SubjectError(WireError, ValueError):
    """A lane token or subject is not acceptable."""


class AudioPrepError(ValueError):
    """An extract item's audio was refused by preparation (scheduler-and-prep §7.3); the message
    names the rule (sizes, rates, container names, never the audio or the declared format)."""


__all__ = [
    "BAD_OPERATION",
    "INFERENCE_ERROR",
    "INVALID_INPUT",
    "INVALID_REQUEST",
    "MODEL_LOAD_FAILED",
    "PAYLOAD_ERROR",
    "PAYLOAD_TOO_LARGE",
    "RAW_OUTPUT_SHAPE_ERROR",
    "RUN_BATCH_INVALID_ITEM",
    "RUN_BATCH_MIXED_OP",
    "AudioPrepError",
    "BudgetExceeded",
    "ChunkProtocolError",
    "DecodeError",
    "FrameTooLarge",
    "IpcServerError",
    "PayloadTooLarge",
    "ProtocolError",
    "ShapeError",
    "SubjectError",
    "WireError",
]
