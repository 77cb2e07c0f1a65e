# SPDX-License-Identifier: Apache-2.0
"""Every exception of the sidecar and every WorkResult error code, in one module at the bottom of the
import graph: the wire core's typed errors (shared by the native core and the twin, which raise the
very same classes), start-up and connection failures, IPC and payload failures."""

from __future__ import annotations

from typing import ClassVar, Literal

# ----------------------------------------------------------------------- WorkResult error codes (§4.2, §6)
# Every `error_code` the sidecar or the reference backend writes, named once. The case follows v0.7.1:
# lower snake case for the sidecar's own codes, upper case where v0.7.1 upper-cases them.

BAD_OPERATION = "bad_operation"  # unknown operation (§4.2)
MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"  # EnsureModelReady answered `failed` (§4.2)
PAYLOAD_ERROR = "payload_error"  # an offloaded payload could not be fetched or decoded (§12)
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"  # over the envelope cap, or a result over the transport limit (§6)
INVALID_INPUT = "INVALID_INPUT"  # extract image / document shape invalid (§4.2); generation media (§4.4)
MODEL_LOADING = "MODEL_LOADING"  # generation: the model is loading, a terminal chunk (§4.4)
INTERNAL_ERROR = "internal_error"  # generation: an offloaded payload or the re-encode failed (§4.4)
INVALID_REQUEST = "invalid_request"  # extract audio refused by preparation (§4.2)
RAW_OUTPUT_SHAPE_ERROR = "raw_output_shape_error"  # a typed raw output could not be framed (§6.1)
INFERENCE_ERROR = "inference_error"  # the reference backend's per-item inference failure
RUN_BATCH_MIXED_OP = "run_batch_mixed_op"  # the reference backend: a RunBatch item of another op
RUN_BATCH_INVALID_ITEM = "run_batch_invalid_item"  # the reference backend: an item without its op payload
#: A remote attempt (an item with `fallback_reason`) the backend could not take: answered, not NAKed
#: (wire-protocol §4.6, §10.1; newer than v0.7.1).
QUEUE_FULL = "QUEUE_FULL"
REMOTE_REFUSAL_MESSAGE = "The remote profile cannot serve this request now"


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


#: What a backend without RunBatch answers it (wire-protocol §2: `unknown method <name>`).
NO_RUN_BATCH = "unknown method RunBatch"


class ShapeError(WireError):
    """Output framing rejected its input; the item becomes a raw_output_shape_error result."""

    code = RAW_OUTPUT_SHAPE_ERROR


class PayloadTooLarge(WireError):
    """A reply cannot be published within max_payload, not even as a compact error."""

    code = PAYLOAD_TOO_LARGE


class SubjectError(WireError, ValueError):
    """A lane token or subject is not acceptable."""


class GenerateMediaError(ValueError):
    """A generate map's images break a rule of §7.4 (answered with an `INVALID_INPUT` terminal chunk)."""


class AudioPrepError(ValueError):
    """An extract item's audio was refused by preparation (scheduler-and-prep §7.3); the message
    names the rule (sizes, rates, container names, never the audio or the declared format)."""


class ConfigError(Exception):
    """Invalid configuration; the CLI prints `sie-sidecar: <message>` and exits with status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConnectError(Exception):
    """The first NATS connection failed; the message is one redacted line."""


class TopologyError(Exception):
    """The topology could not be established at start-up; the message is one redacted line."""


class StartupError(Exception):
    """A start-up step failed: `run` logs one line and returns `code` (2 configuration, 1 runtime)."""

    def __init__(self, step: str, reason: str, code: int = 1) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason
        self.code = code


class IpcTransportError(Exception):
    """The backend could not be reached or dropped the connection (after the one retry).

    `transient` is the §1.2 classification of the underlying failure (broken pipe, refused, reset,
    aborted, EOF, not found, not connected, would-block): a config write retries only those (§9.2
    step 9). A closed client, a permission error or a bad socket path are not transient."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class TransportFailure(Exception):
    """Inside the IPC client: one attempt failed at the transport level; `retryable` says whether §1.2 retries it."""

    def __init__(self, cause: BaseException, *, retryable: bool) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.cause = cause
        self.retryable = retryable


class ConfigNotAttested(Exception):
    """Hash-pinned work was not sent: the backend child's last Ping does not attest the advertised
    bundle config (§9.4), or the connection is new since one was lost (a restarted backend)."""


class IpcTimeout(Exception):
    """The exchange (write, response and any reassembly) did not finish in time; the slot was discarded."""


class WorkItemError(ValueError):
    """The payload is not a decodable WorkItem (settled as NAK with the base delay)."""


class PoolsResponseError(ValueError):
    """The gateway's `/v1/pools` answered something that is not a pool list (§8: an admission error)."""


class PoolsPollError(Exception):
    """One `/v1/pools` poll failed; `detail` (no URL, no bearer) is what the admission reason carries."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ConfigServiceError(Exception):
    """One config-service request (`/v1/configs/*`, §9.3) failed or answered a body of the wrong shape;
    `detail` names neither the URL nor the bearer."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotificationError(ValueError):
    """A `sie.config.models.*` notification that is not the §9.1 JSON object (outcome `parse_error`)."""


# ------------------------------------------------------------------------------------- local ingest (§11)
# Generation-stream error codes of the local socket (`"CODE: message"` in the response's `error`).
DUPLICATE_REQUEST = "DUPLICATE_REQUEST"  # the request id is already streaming on this connection
INVALID_TRANSPORT_BINDING = "INVALID_TRANSPORT_BINDING"  # the request id is streaming on another connection
BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
BUNDLE_CONFIG_MISMATCH = "BUNDLE_CONFIG_MISMATCH"
TRANSPORT_FAILURE = "TRANSPORT_FAILURE"
RETRY_LATER = "RETRY_LATER"
TIMEOUT = "TIMEOUT"
DISCONNECTED = "DISCONNECTED"
POOL_ADMISSION_REJECTED = "POOL_ADMISSION_REJECTED"
DECODE_ERROR = "DECODE_ERROR"
CAPACITY_EXHAUSTED = "CAPACITY_EXHAUSTED"
BAD_OPERATION_STREAM = "BAD_OPERATION"
#: The WorkResult code of a `publish_work` slot whose admission pools disagree (§11).
POOL_ADMISSION_REJECTED_RESULT = "pool_admission_rejected"


class LocalFrameError(ValueError):
    """A local-ingest frame that cannot be read: truncated header or body, over 64 MiB, not msgpack,
    or not the `{id, op, body}` / `{id, ok, error, body}` envelope. The connection is closed."""


class CapacityExhausted(Exception):
    """A per-connection budget of §11 is used up (data ops, control op, generation streams)."""


class InvalidTransportBinding(ValueError):
    """The request's dispatch context or payload digest does not bind its body (§11, TV-L3)."""


class LocalIngestError(Exception):
    """The local-ingest socket answered `ok=false`; `error` is its text (`"Type: message"`)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class StreamSettlementError(LocalIngestError):
    """A backend settlement after the backend itself ended a local generation stream (a second `ack`
    after the terminal chunk's, or a progress or NAK after it; TV-G3): the stream's outcome stands."""


class GenerationStreamError(LocalIngestError):
    """A local generation stream ended with `"CODE: message"` instead of its final outcome."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        code, sep, message = error.partition(": ")
        self.code = code if sep else ""
        self.message = message if sep else error


# ------------------------------------------------------------------------------------------ payloads (§12)

Reason = Literal["not_found", "permission_denied", "io", "invalid_ref", "unsupported", "object_store", "too_large"]


class PayloadStoreConfigError(Exception):
    """An unusable `SIE_PAYLOAD_STORE_URL`: fatal at start-up (§3), never raised per read."""


class PayloadError(Exception):
    """A payload reference could not be read; `reason` names why in the §13 vocabulary."""

    reason: ClassVar[Reason] = "io"

    @property
    def too_large(self) -> bool:
        """Whether the caller answers `PAYLOAD_TOO_LARGE` rather than `payload_error`."""
        return self.reason == "too_large"


class PayloadNotFound(PayloadError):
    """A local file that does not exist (object stores report a missing key as an invalid ref)."""

    reason: ClassVar[Reason] = "not_found"


class PayloadPermissionDenied(PayloadError):
    """The file exists but this process may not open it."""

    reason: ClassVar[Reason] = "permission_denied"


class PayloadIOError(PayloadError):
    """Any other operating-system error while opening or reading."""

    reason: ClassVar[Reason] = "io"


class InvalidPayloadRef(PayloadError):
    """The reference is malformed, escapes the store, crosses a symlink, or names no object."""

    reason: ClassVar[Reason] = "invalid_ref"


class PayloadUnsupported(PayloadError):
    """The platform cannot open files safely (no `openat2`): refuse rather than fall back."""

    reason: ClassVar[Reason] = "unsupported"


class ObjectStoreError(PayloadError):
    """The object store failed (transport, credentials, throttling, server error)."""

    reason: ClassVar[Reason] = "object_store"


class StsError(ObjectStoreError):
    """STS refused or failed the exchange; only the HTTP status and a sanitised STS code are kept."""

    def __init__(self, status: int | None, code: str, *, retryable: bool) -> None:
        where = f"HTTP {status}" if status is not None else "transport"
        super().__init__(f"OSS credentials: STS AssumeRoleWithOIDC failed ({where}, {code})")
        self.status = status
        self.code = code
        self.retryable = retryable


class PayloadOversized(PayloadError):
    """The stored blob is larger than the fetch limit (from metadata or while reading)."""

    reason: ClassVar[Reason] = "too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of at least {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


__all__ = [
    "BACKEND_UNAVAILABLE",
    "BAD_OPERATION",
    "BAD_OPERATION_STREAM",
    "BUNDLE_CONFIG_MISMATCH",
    "CAPACITY_EXHAUSTED",
    "DECODE_ERROR",
    "DISCONNECTED",
    "DUPLICATE_REQUEST",
    "INFERENCE_ERROR",
    "INVALID_INPUT",
    "INVALID_REQUEST",
    "INVALID_TRANSPORT_BINDING",
    "MODEL_LOAD_FAILED",
    "NO_RUN_BATCH",
    "PAYLOAD_ERROR",
    "PAYLOAD_TOO_LARGE",
    "POOL_ADMISSION_REJECTED",
    "POOL_ADMISSION_REJECTED_RESULT",
    "QUEUE_FULL",
    "RAW_OUTPUT_SHAPE_ERROR",
    "REMOTE_REFUSAL_MESSAGE",
    "RETRY_LATER",
    "RUN_BATCH_INVALID_ITEM",
    "RUN_BATCH_MIXED_OP",
    "TIMEOUT",
    "TRANSPORT_FAILURE",
    "AudioPrepError",
    "BudgetExceeded",
    "CapacityExhausted",
    "ChunkProtocolError",
    "ConfigError",
    "ConnectError",
    "DecodeError",
    "FrameTooLarge",
    "GenerationStreamError",
    "InvalidPayloadRef",
    "InvalidTransportBinding",
    "IpcServerError",
    "IpcTimeout",
    "IpcTransportError",
    "LocalFrameError",
    "LocalIngestError",
    "ObjectStoreError",
    "PayloadError",
    "PayloadIOError",
    "PayloadNotFound",
    "PayloadOversized",
    "PayloadPermissionDenied",
    "PayloadStoreConfigError",
    "PayloadTooLarge",
    "PayloadUnsupported",
    "PoolsPollError",
    "PoolsResponseError",
    "ProtocolError",
    "Reason",
    "ShapeError",
    "StartupError",
    "StreamSettlementError",
    "SubjectError",
    "TopologyError",
    "WireError",
    "WorkItemError",
]
