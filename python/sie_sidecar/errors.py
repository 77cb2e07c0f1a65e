# SPDX-License-Identifier: Apache-2.0
"""Typed errors of the wire core, shared by the native core and the pure-Python twin."""

from __future__ import annotations


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

    code = "raw_output_shape_error"


class PayloadTooLarge(WireError):
    """A reply cannot be published within max_payload, not even as a compact error."""

    code = "PAYLOAD_TOO_LARGE"


class SubjectError(WireError, ValueError):
    """A lane token or subject is not acceptable."""


class AudioPrepError(ValueError):
    """An extract item's audio was refused by preparation (scheduler-and-prep §7.3); the message
    names the rule (sizes, rates, container names, never the audio or the declared format)."""


__all__ = [
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
