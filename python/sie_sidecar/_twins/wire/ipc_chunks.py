# SPDX-License-Identifier: Apache-2.0
"""IpcResponseChunkV1 reassembly under a process-wide memory budget (wire-protocol §6.5).

Pure-Python twin. The reassembly buffer is allocated once at frame 0 (its size is known from
`total_bytes`) and each payload is copied straight into it, so a transfer costs one copy of the
response. The budget bounds what all connections together may hold while reassembling and
decoding: a flood of large responses is refused up front instead of exhausting memory.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Final

from ...errors import BudgetExceeded, ChunkProtocolError, WireError
from ...wire.limits import (
    DEFAULT_RESPONSE_BUDGET,
    DIGEST_LEN,
    IPC_VERSION,
    MAX_CHUNK_FRAME,
    MAX_CHUNK_PAYLOAD,
    MAX_CHUNKED_RESPONSE,
    MAX_FRAME,
    MAX_RESPONSE_CHUNKS,
    RESERVATION_OVERHEAD,
)
from .envelopes import IpcResponseChunk, ResponseEnvelope, decode_response

if TYPE_CHECKING:
    from typing import Self


@dataclass(frozen=True, slots=True)
class ChunkLimits:
    """The v1 bounds; only tests relax them (tiny transfers must be accepted there)."""

    legacy_ceiling: int
    max_chunk_payload: int
    max_chunk_frame: int
    max_total: int
    max_chunks: int


PRODUCTION_LIMITS: Final = ChunkLimits(
    legacy_ceiling=MAX_FRAME,
    max_chunk_payload=MAX_CHUNK_PAYLOAD,
    max_chunk_frame=MAX_CHUNK_FRAME,
    max_total=MAX_CHUNKED_RESPONSE,
    max_chunks=MAX_RESPONSE_CHUNKS,
)


class ResponseBudget:
    """Bytes that in-flight chunked responses may hold, shared by every connection (thread-safe)."""

    __slots__ = ("_budget_rejected", "_capacity", "_completed", "_lock", "_protocol_error", "_reserved")

    def __init__(self, capacity: int = DEFAULT_RESPONSE_BUDGET) -> None:
        if capacity < 0:
            raise ValueError("budget capacity must not be negative")
        self._capacity = capacity
        self._reserved = 0
        self._completed = 0
        self._protocol_error = 0
        self._budget_rejected = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def reserved(self) -> int:
        """Bytes currently reserved by transfers in progress or assembled and not yet released."""
        return self._reserved

    @property
    def completed(self) -> int:
        """Transfers whose digest verified."""
        return self._completed

    @property
    def protocol_error(self) -> int:
        """Transfers (or stray frames) that broke a §6.5 rule."""
        return self._protocol_error

    @property
    def budget_rejected(self) -> int:
        """Frames 0 refused because the reservation did not fit."""
        return self._budget_rejected

    def _try_reserve(self, amount: int) -> bool:
        with self._lock:
            if amount > self._capacity - self._reserved:
                self._budget_rejected += 1
                return False
            self._reserved += amount
            return True

    def _release(self, amount: int) -> None:
        with self._lock:
            self._reserved -= amount

    def _count_completed(self) -> None:
        with self._lock:
            self._completed += 1

    def _count_protocol_error(self) -> None:
        with self._lock:
            self._protocol_error += 1

    def __repr__(self) -> str:
        return (
            f"ResponseBudget(capacity={self._capacity}, reserved={self._reserved}, completed={self._completed}, "
            f"protocol_error={self._protocol_error}, budget_rejected={self._budget_rejected})"
        )


_PROCESS_BUDGET: Final = ResponseBudget()


def response_budget() -> ResponseBudget:
    """The process-wide budget, shared by every pool and mux connection."""
    return _PROCESS_BUDGET


class _Reservation:
    """A budget reservation released exactly once, whoever gets there first."""

    __slots__ = ("_amount", "_budget", "_lock")

    def __init__(self, budget: ResponseBudget, amount: int) -> None:
        self._budget: ResponseBudget | None = budget
        self._amount = amount
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            budget, self._budget = self._budget, None
        if budget is not None:
            budget._release(self._amount)

    @property
    def held(self) -> bool:
        return self._budget is not None

    def __del__(self) -> None:
        # A reservation dropped without release (assembler or response discarded with its
        # connection) must not leak budget for the life of the process.
        self.release()


class AssembledResponse:
    """A complete response: the reassembled envelope bytes plus the reservation that covers them.

    Python 3.11 has no pure-Python buffer protocol, so the bytes are reached through `view` (a
    read-only memoryview), `bytes(x)` or, on 3.12+, `memoryview(x)`. A legacy (unchunked)
    response holds no reservation and no reassembled bytes (`nbytes == 0`, `view` empty):
    `decode()` returns the envelope that was fed.
    """

    __slots__ = ("_budget", "_envelope", "_reservation", "_view")

    def __init__(
        self,
        view: memoryview,
        reservation: _Reservation | None,
        budget: ResponseBudget | None,
        envelope: ResponseEnvelope | None = None,
    ) -> None:
        self._view = view
        self._reservation = reservation
        self._budget = budget
        self._envelope = envelope

    @property
    def view(self) -> memoryview:
        """The response bytes (read-only)."""
        return self._view

    @property
    def nbytes(self) -> int:
        return len(self._view)

    @property
    def reservation(self) -> int:
        """Bytes this response holds in the budget (0 once released, and for legacy responses)."""
        r = self._reservation
        return r._amount if r is not None and r.held else 0

    def decode(self) -> ResponseEnvelope:
        """Decode the reassembled bytes as an ordinary envelope; a nested chunk is a protocol error.

        A failure releases the reservation and counts as a protocol error.
        """
        if self._envelope is not None:
            return self._envelope
        try:
            decoded = decode_response(self._view)
            if isinstance(decoded, IpcResponseChunk):
                raise ChunkProtocolError("reassembled IPC response is itself a response chunk")
        except WireError:
            self.release()
            if self._budget is not None:
                self._budget._count_protocol_error()
            raise
        return decoded

    def release(self) -> None:
        """Return the reservation to the budget (idempotent)."""
        if self._reservation is not None:
            self._reservation.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __bytes__(self) -> bytes:
        return bytes(self._view)

    def __len__(self) -> int:
        return len(self._view)

    def __buffer__(self, flags: int) -> memoryview:
        """PEP 688 (Python 3.12+): `memoryview(x)` exposes the response bytes."""
        return self._view

    def __release_buffer__(self, view: memoryview) -> None:
        """PEP 688 counterpart of `__buffer__`; the view needs no cleanup."""

    def __repr__(self) -> str:
        return f"AssembledResponse(nbytes={self.nbytes}, reservation={self.reservation})"


_EMPTY: Final = memoryview(b"")


class IpcChunkAssembler:
    """Reassembles one request's IpcResponseChunkV1 transfer, checking every rule of §6.5.

    Any failure releases the reservation and kills the assembler (later feeds raise
    `ChunkProtocolError`); the connection must be discarded anyway.
    """

    __slots__ = (
        "_budget",
        "_buffer",
        "_count",
        "_dead",
        "_digest",
        "_filled",
        "_hasher",
        "_limits",
        "_next_index",
        "_request_id",
        "_reservation",
        "_total",
    )

    def __init__(
        self, request_id: str, budget: ResponseBudget | None = None, limits: ChunkLimits = PRODUCTION_LIMITS
    ) -> None:
        self._request_id = request_id
        self._budget = budget if budget is not None else response_budget()
        self._limits = limits
        self._dead = False
        self._reset()

    def _reset(self) -> None:
        self._reservation: _Reservation | None = None
        self._buffer: bytearray | None = None
        self._hasher: hashlib._Hash | None = None
        self._digest = b""
        self._count = 0
        self._total = 0
        self._filled = 0
        self._next_index = 0

    @property
    def in_progress(self) -> bool:
        """True between an accepted frame 0 and the last frame (or a failure/abort)."""
        return self._buffer is not None

    def abort(self) -> None:
        """Drop the transfer and release its reservation (timeout, connection lost); idempotent."""
        if self._reservation is not None:
            self._reservation.release()
        self._reset()
        self._dead = True

    def _fail(self, message: str) -> ChunkProtocolError:
        if self._reservation is not None:
            self._reservation.release()
        self._reset()
        self._dead = True
        self._budget._count_protocol_error()
        return ChunkProtocolError(message)

    def feed(self, frame: ResponseEnvelope | IpcResponseChunk) -> AssembledResponse | None:
        """Accept the next decoded frame; return the complete response once the digest verifies."""
        if self._dead:
            raise ChunkProtocolError("IPC response chunk assembler is closed after an earlier failure or abort")
        if isinstance(frame, ResponseEnvelope):
            if self.in_progress:
                raise self._fail("ordinary response frame arrived in the middle of a chunked transfer")
            return AssembledResponse(_EMPTY, None, None, envelope=frame)
        if not isinstance(frame, IpcResponseChunk):
            raise TypeError("feed() takes a ResponseEnvelope or an IpcResponseChunk")
        limits = self._limits
        payload = frame.payload
        size = len(payload)

        # kind (implied by the type) and frame size
        if frame.frame_len > limits.max_chunk_frame:
            raise self._fail(f"chunk frame of {frame.frame_len} bytes exceeds {limits.max_chunk_frame}")
        # version and request id
        if frame.version != IPC_VERSION:
            raise self._fail(f"chunk version {frame.version} is not {IPC_VERSION}")
        if frame.request_id != self._request_id:
            raise self._fail(f"chunk for request {frame.request_id!r} while expecting {self._request_id!r}")
        # bounds (before any reservation)
        count, total = frame.chunk_count, frame.total_bytes
        if not 1 <= count <= limits.max_chunks:
            raise self._fail(f"chunk_count {count} outside 1..{limits.max_chunks}")
        if count > total:
            raise self._fail(f"chunk_count {count} exceeds total_bytes {total}")
        if not limits.legacy_ceiling < total <= limits.max_total:
            raise self._fail(f"total_bytes {total} outside ({limits.legacy_ceiling}, {limits.max_total}]")
        if not 1 <= size <= limits.max_chunk_payload:
            raise self._fail(f"chunk payload of {size} bytes outside 1..{limits.max_chunk_payload}")
        if size > total:
            raise self._fail(f"chunk payload of {size} bytes exceeds total_bytes {total}")
        if len(frame.transfer_digest) != DIGEST_LEN:
            raise self._fail(f"transfer_digest must be {DIGEST_LEN} bytes")

        # sequence: index 0 opens the transfer, then exactly the next index with the same layout
        if not self.in_progress:
            if frame.chunk_index != 0:
                raise self._fail(f"chunked transfer must start at index 0, got {frame.chunk_index}")
            amount = 2 * total + RESERVATION_OVERHEAD
            if not self._budget._try_reserve(amount):
                self._reset()
                self._dead = True
                raise BudgetExceeded(
                    f"IPC response reassembly needs {amount} bytes; the response budget "
                    f"({self._budget.capacity} bytes) has {self._budget.capacity - self._budget.reserved} free"
                )
            self._reservation = _Reservation(self._budget, amount)
            self._buffer = bytearray(total)
            self._hasher = hashlib.sha256()
            self._digest = frame.transfer_digest
            self._count = count
            self._total = total
        else:
            if frame.chunk_index != self._next_index:
                raise self._fail(f"chunk index {frame.chunk_index} out of order (expected {self._next_index})")
            if count != self._count or total != self._total or frame.transfer_digest != self._digest:
                raise self._fail("chunk layout mismatch: count, total or digest changed mid-transfer")

        # accumulated length
        filled = self._filled + size
        last = frame.chunk_index == self._count - 1
        if filled > self._total:
            raise self._fail(f"chunk payloads ({filled} bytes) exceed total_bytes {self._total}")
        if not last and filled == self._total:
            raise self._fail("chunk payloads reached total_bytes before the last index")
        if last and filled != self._total:
            raise self._fail(f"chunk payloads ({filled} bytes) fall short of total_bytes {self._total}")
        buffer, hasher = self._buffer, self._hasher
        assert buffer is not None and hasher is not None
        memoryview(buffer)[self._filled : filled] = payload
        hasher.update(payload)
        self._filled = filled
        self._next_index += 1
        if not last:
            return None

        # digest over the exact bytes
        if hasher.digest() != self._digest:
            raise self._fail("transfer_digest does not match the SHA-256 of the reassembled response")
        self._budget._count_completed()
        reservation = self._reservation
        self._reset()
        return AssembledResponse(memoryview(buffer).toreadonly(), reservation, self._budget)


__all__ = [
    "PRODUCTION_LIMITS",
    "AssembledResponse",
    "ChunkLimits",
    "IpcChunkAssembler",
    "ResponseBudget",
    "response_budget",
]
