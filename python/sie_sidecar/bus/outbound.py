# SPDX-License-Identifier: Apache-2.0
"""Many PUBs as one write: the batch-framed outbound path of shared/design/nats-hot-path.md.

nats-py's public `publish` handles one message per call (header building, buffer checks, a flusher
wake-up each time). A batch of replies and ACKs is framed here into one command buffer and handed to
the client's pending buffer in a single call, keeping their order on the wire (each reply before
its message's ACK).

This leans on four nats-py internals: `_send_command`, `_flush_pending`, `_pending_data_size` and
`_max_pending_size` (nats-py is pinned below 3). `FramedWriter.supported()` checks they exist, and
tests/integration/test_outbound.py fails if their behaviour changes; without them the writer falls
back to the public per-message `publish`.

While connected with nothing queued in the client's pending list, a buffer goes straight to the
connection's transport (`_pending`, `_transport`; issue 30): nats-py's flusher would copy it once more
(`writelines` joins its list) and wake a task of its own for each batch. Order is kept: anything
queued goes through the pending list as before, and both end in the same transport buffer, so a
PING/PONG (`nc.flush()`) still proves the server read everything written before it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from nats import errors as nats_errors

log = logging.getLogger(__name__)

_INTERNALS = ("_send_command", "_flush_pending", "_pending_data_size", "_max_pending_size")
#: What the direct write reads besides: the pending list (empty: nothing would be overtaken) and the transport.
_DIRECT_INTERNALS = ("_pending", "_transport")
ACK = b"+ACK"


def frame_pubs(messages: Sequence[tuple[str, bytes]]) -> bytes:
    """`PUB <subject> <size>\\r\\n<payload>\\r\\n` for every message, back to back."""
    parts: list[bytes] = []
    for subject, payload in messages:
        parts.append(b"PUB %s %d\r\n" % (subject.encode(), len(payload)))
        parts.append(payload)
        parts.append(b"\r\n")
    return b"".join(parts)


class FramedWriter:
    """Publishes a batch of (subject, payload) pairs with one buffer append and one flusher kick."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc
        self.framed = self.supported(nc)
        self.direct = self.framed and all(hasattr(nc, name) for name in _DIRECT_INTERNALS)
        #: Buffers written straight to the transport, and through the client's pending list.
        self.direct_writes = 0
        self.queued_writes = 0
        if not self.framed:
            log.warning("nats-py internals changed; falling back to per-message publish")

    @staticmethod
    def supported(nc: Any) -> bool:
        return all(hasattr(nc, name) for name in _INTERNALS)

    async def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Queue every message in order; raises like `publish` (buffer limit, payload size, closed)."""
        if not messages:
            return
        nc = self._nc
        if not self.framed:
            for subject, payload in messages:
                await nc.publish(subject, payload)
            return
        if nc.is_closed:
            raise nats_errors.ConnectionClosedError
        max_payload = nc.max_payload
        for subject, payload in messages:
            if not subject:
                raise nats_errors.BadSubjectError
            if len(payload) > max_payload:
                raise nats_errors.MaxPayloadError
        await self._send(frame_pubs(messages), len(messages), sum(len(p) for _, p in messages))

    async def publish_framed(self, buf: bytes, messages: int, payload_bytes: int) -> None:
        """Queue PUB commands framed elsewhere (`wire.frame_outcome_replies`, which checks every
        subject and payload size); raises like `publish` while closed or over the reconnect buffer."""
        if messages <= 0:
            return
        nc = self._nc
        if nc.is_closed:
            raise nats_errors.ConnectionClosedError
        await self._send(buf, messages, payload_bytes)

    def write_now(self, buf: bytes, messages: int, payload_bytes: int) -> bool:
        """Write commands straight to the transport from synchronous code (a small pull request as
        capacity frees): True when written; False when that cannot be done now (not connected,
        something queued ahead, no direct path), and the caller goes the asynchronous way."""
        nc = self._nc
        if not self.direct or not nc.is_connected or nc._pending:
            return False
        transport = nc._transport
        if transport is None:
            return False
        nc.stats["out_msgs"] += messages
        nc.stats["out_bytes"] += payload_bytes
        transport.write(buf)
        self.direct_writes += 1
        return True

    async def _send(self, buf: bytes, messages: int, payload_bytes: int) -> None:
        nc = self._nc
        if not nc.is_connected and (
            nc._max_pending_size <= 0 or len(buf) + nc._pending_data_size > nc._max_pending_size
        ):
            raise nats_errors.OutboundBufferLimitError  # the same refusal `publish` makes while reconnecting
        if self.write_now(buf, messages, payload_bytes):  # nothing queued ahead: no flusher
            if _write_buffer_size(nc._transport):
                await nc._transport.drain()  # the socket did not take it all: wait as the flusher would
            return
        nc.stats["out_msgs"] += messages
        nc.stats["out_bytes"] += payload_bytes
        self.queued_writes += 1
        await nc._send_command(buf)
        await nc._flush_pending()

    async def ack_many(self, reply_subjects: Sequence[str]) -> None:
        """ACK many JetStream messages at once (`+ACK` to each message's reply subject)."""
        await self.publish_many([(subject, ACK) for subject in reply_subjects])


def _write_buffer_size(transport: Any) -> int:
    """Bytes the connection's asyncio transport still holds (unknown: 1, so the caller drains)."""
    writer = getattr(transport, "_io_writer", None)
    try:
        return int(writer.transport.get_write_buffer_size())  # type: ignore[union-attr]
    except Exception:
        return 1


__all__ = ["ACK", "FramedWriter", "frame_pubs"]
