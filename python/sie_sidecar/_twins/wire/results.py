# SPDX-License-Identifier: Apache-2.0
"""WorkResult encoding, ResultChunkV1 planning and gateway-side reassembly (wire-protocol §8, §9).

The pure-Python twin of the native reply path. Envelopes are assembled by hand so that the
payload slice is copied once, and so that candidate chunk counts can be sized arithmetically
from msgpack header widths instead of being encoded.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from ...errors import PAYLOAD_TOO_LARGE, ChunkProtocolError, PayloadTooLarge
from ...wire.limits import (
    DIGEST_LEN,
    MAX_CHUNKED_RESULT,
    MAX_RESULT_CHUNKS,
    NEWER_UNIT_KEYS,
    RESULT_CHUNK_KIND,
    RESULT_CHUNK_TARGET,
    UNIT_KEYS,
)
from ...wire.types import WorkResult
from .outputs import (
    bin_header,
    bin_header_len,
    map_header,
    pack_f64,
    pack_str,
    pack_uint,
    uint_len,
)

_U32_MAX = 0xFFFF_FFFF
RETIRED_PER_ITEM = 8  # digests and layouts remembered per item (§9.2)
COMPLETED_REMEMBERED = 65_536  # completed items whose late chunks are ignored

_NIL = b"\xc0"
_TRUE = b"\xc3"
_FALSE = b"\xc2"

# WorkResult keys, pre-encoded (§8.1 producer order).
_K_WORK_ITEM_ID = pack_str("work_item_id")
_K_REQUEST_ID = pack_str("request_id")
_K_ITEM_INDEX = pack_str("item_index")
_K_SUCCESS = pack_str("success")
_K_RESULT_MSGPACK = pack_str("result_msgpack")
_K_ERROR = pack_str("error")
_K_ERROR_CODE = pack_str("error_code")
_K_INFERENCE_MS = pack_str("inference_ms")
_K_QUEUE_MS = pack_str("queue_ms")
_K_PROCESSING_MS = pack_str("processing_ms")
_K_WORKER_ID = pack_str("worker_id")
_K_TOKENIZATION_MS = pack_str("tokenization_ms")
_K_POSTPROCESSING_MS = pack_str("postprocessing_ms")
_K_PAYLOAD_FETCH_MS = pack_str("payload_fetch_ms")
_K_UNITS = pack_str("units")
_K_WORKER_DIRECT = pack_str("worker_direct")
_K_EXECUTED_HASH = pack_str("executed_bundle_config_hash")
_K_RETRY_AFTER_S = pack_str("retry_after_s")
_UNIT_KEYS_PACKED = tuple(pack_str(key) for key in UNIT_KEYS)

# ResultChunkV1 keys (§9.1 order; `kind` first, unlike IpcResponseChunkV1).
_CHUNK_HEAD = b"\x89" + pack_str("kind") + pack_str(RESULT_CHUNK_KIND) + pack_str("work_item_id")
_K_TRANSFER_DIGEST = pack_str("transfer_digest")
_K_CHUNK_INDEX = pack_str("chunk_index")
_K_CHUNK_COUNT = pack_str("chunk_count")
_K_TOTAL_BYTES = pack_str("total_bytes")
_K_PAYLOAD = pack_str("payload")

_COMPACT_ERROR_CODE = PAYLOAD_TOO_LARGE


def _opt_str(value: str | None) -> bytes:
    return _NIL if value is None else pack_str(value)


def _opt_f64(value: float | None) -> bytes:
    """Timings are always float64 (§0.4), even when the caller handed in an int."""
    return _NIL if value is None else pack_f64(float(value))


def _opt_uint(value: int | None) -> bytes:
    return _NIL if value is None else pack_uint(value)


def encode_work_result(result: WorkResult) -> bytes:
    """Named-map WorkResult in the sidecar producer order (§8.1, TV-R2).

    The 15 always-written keys come first; `units`, `executed_bundle_config_hash` and
    `retry_after_s` are the omit-if-none keys, in their table positions.
    """
    units = result.units
    executed = result.executed_bundle_config_hash or None
    retry = result.retry_after_s
    entries = 15 + (units is not None) + (executed is not None) + (retry is not None)
    payload = memoryview(result.result_msgpack or b"").cast("B")
    parts: list[bytes | bytearray | memoryview] = [
        map_header(entries),
        _K_WORK_ITEM_ID,
        pack_str(result.work_item_id),
        _K_REQUEST_ID,
        pack_str(result.request_id),
        _K_ITEM_INDEX,
        pack_uint(result.item_index),
        _K_SUCCESS,
        _TRUE if result.success else _FALSE,
        _K_RESULT_MSGPACK,
        bin_header(payload.nbytes),
        payload,
        _K_ERROR,
        _opt_str(result.error),
        _K_ERROR_CODE,
        _opt_str(result.error_code),
        _K_INFERENCE_MS,
        _opt_f64(result.inference_ms),
        _K_QUEUE_MS,
        _opt_f64(result.queue_ms),
        _K_PROCESSING_MS,
        _opt_f64(result.processing_ms),
        _K_WORKER_ID,
        _opt_str(result.worker_id),
        _K_TOKENIZATION_MS,
        _opt_f64(result.tokenization_ms),
        _K_POSTPROCESSING_MS,
        _opt_f64(result.postprocessing_ms),
        _K_PAYLOAD_FETCH_MS,
        _opt_f64(result.payload_fetch_ms),
    ]
    if units is not None:
        # The five v0.7.1 keys, nil for an absent count, then the newer keys that are present;
        # unknown keys are dropped (§4.6).
        newer = [(key, units[key]) for key in NEWER_UNIT_KEYS if units.get(key) is not None]
        parts.append(_K_UNITS)
        parts.append(bytes([0x80 | (len(UNIT_KEYS) + len(newer))]))
        for key, packed in zip(UNIT_KEYS, _UNIT_KEYS_PACKED, strict=True):
            parts.append(packed)
            parts.append(_opt_uint(units.get(key)))
        for key, count in newer:
            parts.append(pack_str(key))
            parts.append(_opt_uint(count))
    parts.append(_K_WORKER_DIRECT)
    parts.append(_TRUE if result.worker_direct else _FALSE)
    if executed is not None:
        parts.append(_K_EXECUTED_HASH)
        parts.append(pack_str(executed))
    if retry is not None:
        parts.append(_K_RETRY_AFTER_S)
        parts.append(pack_uint(retry))
    return b"".join(parts)


def _u32(value: int, what: str) -> int:
    if value < 0 or value > _U32_MAX:
        raise OverflowError(f"{what}={value} is not a u32")
    return value


def _chunk_prefix(work_item_id: str, request_id: str, item_index: int, transfer_digest: bytes | memoryview) -> bytes:
    """Everything of a ResultChunkV1 envelope before `chunk_index`; shared by every chunk of a transfer."""
    digest = memoryview(transfer_digest).cast("B")
    return b"".join(
        (
            _CHUNK_HEAD,
            pack_str(work_item_id),
            _K_REQUEST_ID,
            pack_str(request_id),
            _K_ITEM_INDEX,
            pack_uint(_u32(item_index, "item_index")),
            _K_TRANSFER_DIGEST,
            bin_header(digest.nbytes),
            digest,
        )
    )


def _chunk_tail(chunk_index: int, chunk_count: int, total_bytes: int, payload_len: int) -> bytes:
    return b"".join(
        (
            _K_CHUNK_INDEX,
            pack_uint(_u32(chunk_index, "chunk_index")),
            _K_CHUNK_COUNT,
            pack_uint(_u32(chunk_count, "chunk_count")),
            _K_TOTAL_BYTES,
            pack_uint(total_bytes),
            _K_PAYLOAD,
            bin_header(payload_len),
        )
    )


def encode_result_chunk(  # noqa: PLR0917 - the positional signature is the API contract
    work_item_id: str,
    request_id: str,
    item_index: int,
    transfer_digest: Any,
    chunk_index: int,
    chunk_count: int,
    total_bytes: int,
    payload: Any,
) -> bytes:
    """One ResultChunkV1 envelope (§9.1, TV-R1, TV-R3); the payload is copied once."""
    body = memoryview(payload).cast("B")
    prefix = _chunk_prefix(work_item_id, request_id, item_index, transfer_digest)
    return b"".join((prefix, _chunk_tail(chunk_index, chunk_count, total_bytes, body.nbytes), body))


@dataclass(frozen=True, slots=True)
class ReplyPlan:
    """What to publish for one WorkResult: the messages in order, then one flush, then ACK."""

    mode: str
    messages: list[bytes]
    total_bytes: int
    transfer_digest: bytes | None = None


def _compact_error_message(size: int, max_payload: int) -> str:
    return (
        f"Encoded result exceeds the transport limit ({size} > {max_payload} bytes); "
        "reduce the input length or requested output size."
    )


def _chunk_count(total: int, fixed: int, max_payload: int) -> int | None:
    """Smallest n in ceil(total/768 KiB)..=min(64, total) whose largest envelope fits, else None.

    Balanced slices differ by at most one byte, so the largest is ceil(total/n); every other
    envelope field has the same width for every chunk (indices and counts stay below 128).
    """
    for n in range(math.ceil(total / RESULT_CHUNK_TARGET), min(MAX_RESULT_CHUNKS, total) + 1):
        largest = -(-total // n)
        if fixed + bin_header_len(largest) + largest <= max_payload:
            return n
    return None


def plan_reply(result: WorkResult, *, accepts_result_chunks: bool, max_payload: int) -> ReplyPlan:
    """Decide single / chunked / compact-error publication (§8.3, §9.3; sidecar-behaviour §6.2).

    The WorkResult is serialized once; chunk envelopes reference slices of those bytes.
    Raises PayloadTooLarge when not even the compact error fits (the item stays un-ACKed).
    """
    encoded = encode_work_result(result)
    total = len(encoded)
    if total <= max_payload:
        return ReplyPlan("single", [encoded], total, None)
    if accepts_result_chunks and total <= MAX_CHUNKED_RESULT:
        digest = hashlib.sha256(encoded).digest()
        prefix = _chunk_prefix(result.work_item_id, result.request_id, result.item_index, digest)
        # chunk_index and chunk_count are < 128: one byte each.
        fixed = (
            len(prefix)
            + len(_K_CHUNK_INDEX)
            + 1
            + len(_K_CHUNK_COUNT)
            + 1
            + len(_K_TOTAL_BYTES)
            + uint_len(total)
            + len(_K_PAYLOAD)
        )
        n = _chunk_count(total, fixed, max_payload)
        if n is not None:
            view = memoryview(encoded)
            messages: list[bytes] = []
            for i in range(n):
                start, end = total * i // n, total * (i + 1) // n
                tail = _chunk_tail(i, n, total, end - start)
                messages.append(b"".join((prefix, tail, view[start:end])))
            return ReplyPlan("chunked", messages, total, digest)
    compact = replace(
        result,
        success=False,
        result_msgpack=b"",
        error_code=_COMPACT_ERROR_CODE,
        error=_compact_error_message(total, max_payload),
    )
    message = encode_work_result(compact)
    if len(message) > max_payload:
        raise PayloadTooLarge(
            f"compact PAYLOAD_TOO_LARGE result is {len(message)} bytes, over max_payload {max_payload}"
        )
    return ReplyPlan("compact_error", [message], total, None)


# --- gateway side --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Transfer:
    """One item's transfer in progress; never holds more than `total_bytes` of payload."""

    digest: bytes
    count: int
    total: int
    received: int = 0
    chunks: dict[int, bytes] = field(default_factory=dict)
    retired_digests: deque[bytes] = field(default_factory=lambda: deque(maxlen=RETIRED_PER_ITEM))
    retired_layouts: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=RETIRED_PER_ITEM))

    def restart(self, digest: bytes, count: int, total: int) -> None:
        """Begin again with another attempt's digest or layout, no chunks yet."""
        self.digest, self.count, self.total = digest, count, total
        self.received = 0
        self.chunks = {}


def _field(envelope: dict[Any, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in envelope:
        raise ChunkProtocolError(f"result chunk: missing {key}")
    value = envelope[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ChunkProtocolError(f"result chunk: {key} has the wrong type")
    return value


class ResultChunkAssembler:
    """Gateway-side ResultChunkV1 reassembly (§9.4), keyed by work_item_id.

    For tests and the load generator. Out-of-order and byte-identical duplicate chunks are
    accepted. A redelivered item comes back with a new digest: a new digest replaces the active
    transfer only at index 0 and when it is not retired, else the chunk is stale and ignored; the
    same digest with another layout restarts at index 0 (a retired layout is ignored). Chunks of an
    item that already completed are ignored (the first result wins). Every other irregularity
    raises ChunkProtocolError and drops that item's state.
    """

    __slots__ = ("_completed", "_max_total", "_transfers")

    def __init__(self, max_total: int = MAX_CHUNKED_RESULT) -> None:
        self._max_total = max_total
        self._transfers: dict[str, _Transfer] = {}
        self._completed: OrderedDict[str, None] = OrderedDict()

    @property
    def pending(self) -> int:
        """Items with a transfer in progress."""
        return len(self._transfers)

    def feed(self, envelope: Any) -> tuple[str, bytes] | None:
        """Take one envelope; return (work_item_id, WorkResult bytes) once the item is complete."""
        try:
            decoded = msgpack.unpackb(envelope, raw=False, use_list=True, strict_map_key=False)
        except Exception as exc:  # msgpack raises a zoo of types (ValueError, ExtraData, StackError, ...)
            raise ChunkProtocolError(f"result chunk: not msgpack ({exc.__class__.__name__})") from exc
        if not isinstance(decoded, dict):
            raise ChunkProtocolError("result chunk: not a map")
        work_item_id = decoded.get("work_item_id")
        try:
            return self._feed(decoded)
        except ChunkProtocolError:
            if isinstance(work_item_id, str):
                self._transfers.pop(work_item_id, None)
            raise

    def _feed(self, env: dict[Any, Any]) -> tuple[str, bytes] | None:
        if env.get("kind") != RESULT_CHUNK_KIND:
            raise ChunkProtocolError("result chunk: wrong kind")
        work_item_id: str = _field(env, "work_item_id", str)
        request_id: str = _field(env, "request_id", str)
        item_index: int = _field(env, "item_index", int)
        digest: bytes = _field(env, "transfer_digest", bytes)
        chunk_index: int = _field(env, "chunk_index", int)
        chunk_count: int = _field(env, "chunk_count", int)
        total: int = _field(env, "total_bytes", int)
        payload: bytes = _field(env, "payload", bytes)
        if not work_item_id or not request_id:
            raise ChunkProtocolError("result chunk: empty id")
        if not 0 <= item_index <= _U32_MAX:
            raise ChunkProtocolError("result chunk: item_index is not a u32")
        if work_item_id != f"{request_id}.{item_index}":
            raise ChunkProtocolError("result chunk: work_item_id does not match request_id.item_index")
        if len(digest) != DIGEST_LEN:
            raise ChunkProtocolError("result chunk: transfer_digest is not 32 bytes")
        if not 1 <= chunk_count <= MAX_RESULT_CHUNKS:
            raise ChunkProtocolError(f"result chunk: chunk_count {chunk_count} outside 1..{MAX_RESULT_CHUNKS}")
        if not 0 <= chunk_index < chunk_count:
            raise ChunkProtocolError("result chunk: chunk_index >= chunk_count")
        if not 1 <= total <= self._max_total:
            raise ChunkProtocolError(f"result chunk: total_bytes {total} outside 1..{self._max_total}")
        if len(payload) > total:
            raise ChunkProtocolError("result chunk: payload longer than total_bytes")

        if work_item_id in self._completed:
            return None
        transfer = self._transfers.get(work_item_id)
        if transfer is None:
            transfer = _Transfer(digest=digest, count=chunk_count, total=total)
            self._transfers[work_item_id] = transfer
        elif transfer.digest != digest:
            if chunk_index != 0 or digest in transfer.retired_digests:
                return None  # a stale chunk of an older attempt
            transfer.retired_digests.append(transfer.digest)
            transfer.restart(digest, chunk_count, total)
        elif transfer.count != chunk_count or transfer.total != total:
            if (chunk_count, total) in transfer.retired_layouts:
                return None
            if chunk_index != 0:
                raise ChunkProtocolError("result chunk: metadata conflicts with earlier chunks")
            transfer.retired_layouts.append((transfer.count, transfer.total))
            transfer.restart(digest, chunk_count, total)

        seen = transfer.chunks.get(chunk_index)
        if seen is not None:
            if seen != payload:
                raise ChunkProtocolError("result chunk: different payload for a received index")
            return None
        if transfer.received + len(payload) > transfer.total:
            raise ChunkProtocolError("result chunk: accumulated bytes exceed total_bytes")
        transfer.chunks[chunk_index] = payload
        transfer.received += len(payload)
        if len(transfer.chunks) < transfer.count:
            return None

        if transfer.received != transfer.total:
            raise ChunkProtocolError("result chunk: accumulated bytes differ from total_bytes")
        assembled = b"".join(transfer.chunks[i] for i in range(transfer.count))
        if hashlib.sha256(assembled).digest() != transfer.digest:
            raise ChunkProtocolError("result chunk: transfer digest mismatch")
        del self._transfers[work_item_id]
        self._completed[work_item_id] = None
        if len(self._completed) > COMPLETED_REMEMBERED:
            self._completed.popitem(last=False)
        return work_item_id, assembled


__all__ = [
    "ReplyPlan",
    "ResultChunkAssembler",
    "encode_result_chunk",
    "encode_work_result",
    "plan_reply",
]
