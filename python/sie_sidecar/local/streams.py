# SPDX-License-Identifier: Apache-2.0
"""One generation stream over the local socket (sidecar-behaviour §11): the backend's chunks checked
against the local contract and forwarded as ordered `{chunk, seq}` responses, then one final
`{final: true, outcome: {status: "complete", chunks: n}}`, or one `"CODE: message"` error.

The stream is the generation delivery's settle handle: the pipeline's `Generations` runs it exactly as
it runs a NATS generate item, and its settlements become the stream's end (`ack` after the terminal
chunk: complete; `nak`: RETRY_LATER before any chunk; `refuse`: the sidecar's own dispatch error).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgpack

from ..errors import DECODE_ERROR, RETRY_LATER, TRANSPORT_FAILURE, StreamSettlementError

MAX_ATTEMPT_ID_BYTES: Final = 128
MAX_NAK_REASON_BYTES: Final = 64
#: Generation replies go to `_LOCAL.{request_id}` (§11).
LOCAL_REPLY_PREFIX: Final = "_LOCAL."


class _Violation(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _no_duplicates(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Violation(DECODE_ERROR, f"chunk has a duplicate key {key!r}")
        out[key] = value
    return out


def decode_chunk(payload: bytes) -> dict[Any, Any]:
    """A backend publication as a map, duplicate keys refused (`_Violation` with DECODE_ERROR)."""
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False, object_pairs_hook=_no_duplicates)
    except _Violation:
        raise
    except Exception as exc:
        raise _Violation(DECODE_ERROR, f"chunk is not msgpack: {exc}") from None
    if not isinstance(value, dict):
        raise _Violation(DECODE_ERROR, "chunk is not a map")
    return value


class LocalStream:
    """A generation delivery whose replies and settlements go back over one local connection."""

    def __init__(
        self,
        request_id: str,
        data: bytes,
        send_chunk: Callable[[bytes, int], Awaitable[None]],
    ) -> None:
        self.request_id = request_id
        self.subject = ""  # not routed by subject: the stream is handed to `Generations` directly
        self.reply = ""
        self.data = data
        self._send_chunk = send_chunk
        self._attempt: str | None = None
        self.chunks = 0
        self._terminal = False
        #: The reason of a `kind="nak"` publication, which waits for the backend's one `ack`.
        self._nak_reason: str | None = None
        #: The backend ended the stream itself (its `ack` after the terminal chunk or a nak):
        #: any later settlement from it is a protocol error.
        self._closed_by_backend = False
        #: ("complete", chunks) or ("error", "CODE: message"), once.
        self.ended: asyncio.Future[tuple[str, str | int]] = asyncio.get_running_loop().create_future()

    @property
    def reply_subject(self) -> str:
        return LOCAL_REPLY_PREFIX + self.request_id

    @property
    def finished(self) -> bool:
        return self.ended.done()

    def fail(self, code: str, message: str) -> None:
        """End the stream with `"CODE: message"`; later chunks and settlements are ignored."""
        if not self.ended.done():
            self.ended.set_result(("error", f"{code}: {message}"))

    async def on_chunk(self, payload: bytes) -> bool:
        """A backend `publish` for this stream: checked, then forwarded. False stops the stream."""
        if self.finished:
            return False
        try:
            chunk = decode_chunk(payload)
            self._check(chunk)
        except _Violation as exc:
            self.fail(exc.code, str(exc))
            return False
        if chunk.get("kind") == "nak":
            return True  # nothing goes to the client; the `ack` ends the stream as RETRY_LATER
        seq = self.chunks
        self.chunks += 1
        await self._send_chunk(payload, seq)
        return not self.finished

    def _check(self, chunk: dict[Any, Any]) -> None:
        kind = chunk.get("kind")
        if self._nak_reason is not None:
            raise _Violation(TRANSPORT_FAILURE, "publication after a nak")
        if kind == "nak":
            reason = chunk.get("reason")
            if not isinstance(reason, str) or not 1 <= len(reason.encode()) <= MAX_NAK_REASON_BYTES:
                raise _Violation(TRANSPORT_FAILURE, "nak reason must be 1-64 bytes")
            if self.chunks:
                raise _Violation(TRANSPORT_FAILURE, "nak after output")
            self._nak_reason = reason  # a retry: the stream ends with the backend's one `ack`
            return
        if kind != "chunk":
            raise _Violation(TRANSPORT_FAILURE, f"unexpected publication kind {kind!r}")
        if self._terminal:
            raise _Violation(TRANSPORT_FAILURE, "chunk after the terminal chunk")
        if chunk.get("request_id") != self.request_id:
            raise _Violation(TRANSPORT_FAILURE, "chunk for another request")
        attempt = chunk.get("attempt_id")
        if not isinstance(attempt, str) or not 1 <= len(attempt.encode()) <= MAX_ATTEMPT_ID_BYTES:
            raise _Violation(TRANSPORT_FAILURE, "attempt_id must be 1-128 bytes")
        if self._attempt is None:
            self._attempt = attempt
        elif attempt != self._attempt:
            raise _Violation(TRANSPORT_FAILURE, "attempt_id changed within the stream")
        seq = chunk.get("seq", 0)
        if isinstance(seq, bool) or seq != self.chunks:
            raise _Violation(TRANSPORT_FAILURE, f"chunk seq {seq!r}, expected {self.chunks}")
        done = chunk.get("done", False)
        if not isinstance(done, bool):
            raise _Violation(TRANSPORT_FAILURE, "chunk done must be a bool")
        self._terminal = done

    # -- the settle handle ----------------------------------------------------------------------

    def _after_backend_end(self, what: str) -> None:
        """TV-G3: once the backend ended the stream, any settlement of its own is an error."""
        if self._closed_by_backend:
            raise StreamSettlementError(f"{what} after the stream ended (request {self.request_id})")

    async def ack(self) -> None:
        """The backend's settlement: complete when it follows the terminal chunk, RETRY_LATER with
        the reason when it follows a nak publication (exactly one; a second is an error)."""
        self._after_backend_end("ack")
        if self.finished:
            return
        if self._nak_reason is not None:
            self._closed_by_backend = True
            self.fail(RETRY_LATER, f"backend asked to retry later ({self._nak_reason})")
            return
        if not self._terminal:
            self.fail(TRANSPORT_FAILURE, "backend acknowledged before the terminal chunk")
            return
        self._closed_by_backend = True
        self.ended.set_result(("complete", self.chunks))

    async def nak(self, delay: int | float | None = None) -> None:
        self._after_backend_end("nak")
        if self.finished:
            return
        if self._nak_reason is not None:
            self.fail(TRANSPORT_FAILURE, "nak settlement after a nak publication (one ack expected)")
        elif self.chunks:
            self.fail(TRANSPORT_FAILURE, "stream ended without its final acknowledgement")
        else:
            self.fail(RETRY_LATER, "the backend could not take the request now")

    async def in_progress(self) -> None:
        """No broker lease to extend; after the backend ended the stream, an error (TV-G3)."""
        self._after_backend_end("progress")

    async def refuse(self, code: str, message: str) -> None:
        """A dispatch error the sidecar found itself (loading, config mismatch, backend gone, ...)."""
        self.fail(code, message)


__all__ = ["LOCAL_REPLY_PREFIX", "LocalStream", "StreamSettlementError", "decode_chunk"]
