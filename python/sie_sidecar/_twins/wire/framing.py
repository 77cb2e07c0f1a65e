# SPDX-License-Identifier: Apache-2.0
"""IPC length-prefixed framing (wire-protocol §1.1), pure-Python twin.

Every body is copied exactly once out of the caller's read buffer: frames that lie wholly inside
one ``feed`` share a single ``bytes`` copy of that region, and a frame that straddles reads is
written into a ``bytearray`` preallocated to its declared length. Bodies are handed out as
read-only memoryviews over those copies, so nothing is copied again downstream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import FrameTooLarge
from ...wire.limits import MAX_FRAME

if TYPE_CHECKING:
    from typing_extensions import Buffer

_HEADER = 4
_EMPTY = memoryview(b"")


def _as_bytes_view(data: Buffer) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer (numpy arrays included)."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class FrameSplitter:
    """Turns a byte stream into frame bodies, whatever the read sizes."""

    __slots__ = ("_body", "_closed", "_filled", "_header", "_max_body")

    def __init__(self, max_body: int = MAX_FRAME) -> None:
        self._max_body = max_body
        self._header = bytearray()  # partial length prefix (0..3 bytes) when no body is pending
        self._body: bytearray | None = None  # preallocated body of a frame that straddles reads
        self._filled = 0  # bytes of _body written so far
        self._closed = False

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet handed out: a partial header, or a header plus a partial body."""
        if self._body is not None:
            return _HEADER + self._filled
        return len(self._header)

    def _declared(self, length: int) -> int:
        """Check a declared length; an over-ceiling one closes the splitter for good."""
        if length > self._max_body:
            self._closed = True
            self._header.clear()
            self._body = None
            self._filled = 0
            raise FrameTooLarge(f"declared IPC frame length {length} exceeds the limit of {self._max_body} bytes")
        return length

    def feed(self, data: Buffer) -> list[memoryview]:
        """Consume one read; return the bodies it completed, in stream order."""
        if self._closed:
            raise FrameTooLarge("frame splitter closed after an oversized frame (stream desynchronised)")
        view = _as_bytes_view(data)
        size = len(view)
        out: list[memoryview] = []
        pos = 0

        # 1. Finish the frame left pending by earlier reads.
        if self._body is None and self._header:
            take = min(_HEADER - len(self._header), size)
            self._header += view[:take]
            pos = take
            if len(self._header) < _HEADER:
                return out
            length = self._declared(int.from_bytes(self._header, "big"))
            self._header.clear()
            if length == 0:
                out.append(_EMPTY)
            else:
                self._body = bytearray(length)
                self._filled = 0
        if self._body is not None:
            body = self._body
            take = min(len(body) - self._filled, size - pos)
            body[self._filled : self._filled + take] = view[pos : pos + take]
            self._filled += take
            pos += take
            if self._filled < len(body):
                return out
            out.append(memoryview(body).toreadonly())
            self._body = None
            self._filled = 0

        # 2. Walk the frames that lie wholly inside this read, reading headers in place.
        start = pos
        spans: list[tuple[int, int]] = []
        while size - pos >= _HEADER:
            length = self._declared(int.from_bytes(view[pos : pos + _HEADER], "big"))
            if size - pos - _HEADER < length:
                break
            spans.append((pos + _HEADER, pos + _HEADER + length))
            pos += _HEADER + length
        if spans:
            block = memoryview(bytes(view[start:pos]))  # the single copy shared by these bodies
            out.extend(block[a - start : b - start] for a, b in spans)

        # 3. Keep the tail: a partial header, or a header plus the start of a body.
        if pos < size:
            if size - pos < _HEADER:
                self._header += view[pos:]
            else:
                length = int.from_bytes(view[pos : pos + _HEADER], "big")  # checked in step 2
                self._body = bytearray(length)
                self._filled = size - pos - _HEADER
                self._body[: self._filled] = view[pos + _HEADER :]
        return out


class FrameReader:
    """Twin of the compiled `FrameReader`: the same calls over one reusable read buffer, fed to a
    `FrameSplitter` (so each body is copied out once; only the compiled reader reads into blocks
    that the bodies are views of)."""

    __slots__ = ("_buffer", "_splitter", "_window", "_windows")

    def __init__(self, max_body: int = MAX_FRAME, block_size: int = 256 << 10) -> None:
        self._splitter = FrameSplitter(max_body)
        self._buffer = memoryview(bytearray(max(block_size, 2 * _HEADER)))
        self._window = False
        self._windows = 0

    @property
    def stats(self) -> dict[str, int]:
        """As the compiled reader's: the twin reads into one buffer and never moves a frame."""
        return {"windows": self._windows, "moves": 0, "moved_bytes": 0, "blocks_made": 1}

    @property
    def buffered(self) -> int:
        """Bytes read but not yet part of a returned body."""
        return self._splitter.buffered

    def read_window(self) -> memoryview:
        """A writable buffer for the next read (pass its filled length to `window_filled`)."""
        if self._splitter._closed:
            raise FrameTooLarge("frame reader closed after an oversized frame (stream desynchronised)")
        self._window = True
        self._windows += 1
        return self._buffer

    def window_filled(self, nbytes: int) -> list[memoryview]:
        """`nbytes` were read into the last window; returns the bodies completed, in order."""
        if not self._window:
            raise ValueError("window_filled() called without a read_window() before it")
        self._window = False
        if nbytes > len(self._buffer):
            raise ValueError(f"window_filled({nbytes}) is more than the {len(self._buffer)} byte window")
        return self._splitter.feed(self._buffer[:nbytes])


def encode_frame(body: Buffer) -> bytes:
    """Prefix a body with its 4-byte big-endian length; refuses bodies over the 32 MiB ceiling."""
    view = _as_bytes_view(body)
    if len(view) > MAX_FRAME:
        raise FrameTooLarge(f"IPC frame body of {len(view)} bytes exceeds the limit of {MAX_FRAME} bytes")
    return b"".join((len(view).to_bytes(_HEADER, "big"), view))


__all__ = ["FrameReader", "FrameSplitter", "encode_frame"]
