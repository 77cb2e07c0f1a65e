# SPDX-License-Identifier: Apache-2.0
"""Inbound fast path: JetStream deliveries for the pull inboxes, parsed a read buffer at a time.

nats-py parses every frame in Python (a regex match, an awaited `_process_msg`, header processing,
a queue put): several µs a message, which is the largest per-message cost left in the sidecar. A
parser installed here first hands the complete `MSG` frames of *registered* subscriptions at the
head of the buffer to `scan_direct_msgs` (Cython: one C loop, the consumer's callback called
synchronously once per run of frames), and leaves everything else to nats-py's own parser,
unchanged. A run is not made into nats-py `Msg` objects: its bytes are copied once and the native
core makes one `LazyDelivery` per frame (subject, ACK subject and payload as spans of the run, the
WorkItem read in place); the `Msg` is built only if a per-message path (a NAK, a progress ACK)
asks for it. With the pure-Python twin selected, frames become `Msg` objects as before.

It relies on nats-py internals (`Client._ps`, `Parser.buf` / `state`, `AWAITING_CONTROL_LINE`):
`FastInbound.install` checks them and returns `None` when they changed, and
tests/integration/test_inbound.py fails if their behaviour does.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg
from nats.protocol import parser as nats_parser

from ..wire._switch import USING_NATIVE, load
from ..wire.workitem import WorkItem

log = logging.getLogger(__name__)

#: Receives a run of deliveries: `Msg` objects (twin), or native `LazyDelivery` objects.
DeliverRun = Callable[[list[Any]], None]
ScanResult = tuple[int, int, int, bool, BaseException | None]

_CRLF = b"\r\n"
#: nats-py's one-line frames, in the order its parser tries them.
_LINE_FRAMES = tuple(
    getattr(nats_parser, name)
    for name in ("OK_RE", "ERR_RE", "PING_RE", "PONG_RE", "INFO_RE")
    if hasattr(nats_parser, name)
)

Scanner = Callable[[bytearray, dict[int, DeliverRun], Any, Any, Callable[..., list[Any]] | None], ScanResult]

#: The compiled core, or the pure-Python twin with `SIE_SIDECAR_NO_EXTENSIONS=1` (`_twins.inbound`).
_core = load("inbound")
#: The Cython scanner and the native maker of a run's deliveries (no `Msg` per frame); with the twin,
#: its scanner and no maker (then `Msg` objects, as nats-py makes them).
scan_direct_msgs: Scanner = _core.wire.scan_direct_msgs if USING_NATIVE else _core.scan_direct_msgs
make_run: Callable[..., list[Any]] | None = (
    functools.partial(_core.deliveries_of_run, item_cls=WorkItem) if USING_NATIVE else None
)


def first_frame_end(buf: bytearray) -> int | None:
    """Where the first complete frame of `buf` ends, read as nats-py's parser reads it (its own
    patterns); None when it is not complete yet or not one nats-py knows (then nats-py takes all)."""
    if buf.startswith(b"MSG"):
        m = nats_parser.MSG_RE.match(buf)
        end = None if m is None else m.end() + int(m.group(5)) + 2
    elif buf.startswith(b"HMSG"):
        m = nats_parser.HMSG_RE.match(buf)
        end = None if m is None else m.end() + int(m.group(6)) + 2
    else:
        for pattern in _LINE_FRAMES:
            m = pattern.match(buf)
            if m is not None:
                return int(m.end())
        return None
    return end if end is not None and end <= len(buf) else None


class _FastParser(nats_parser.Parser):
    """nats-py's parser with the direct-MSG fast path in front (the instance's class is swapped in
    place, so its buffer and state carry over and `reset()` on reconnect keeps working)."""

    _direct: dict[int, DeliverRun]
    _fast: FastInbound

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        if data:
            buf.extend(data)
        direct = self._direct
        while direct and buf:
            if self.state == nats_parser.AWAITING_CONTROL_LINE:
                consumed, count, nbytes, partial, error = scan_direct_msgs(buf, direct, self.nc, Msg, make_run)
                if consumed:
                    del buf[:consumed]
                    stats = self.nc.stats
                    stats["in_msgs"] += count
                    stats["in_bytes"] += nbytes
                    self._fast.messages += count
                if error is not None:
                    raise error
                if partial or not buf:
                    return  # a direct frame still arriving: wait for the rest instead of parsing it slowly
                end = first_frame_end(buf)
            elif self.state == nats_parser.AWAITING_MSG_PAYLOAD:  # a frame nats-py began, cut by a read
                end = self.needed + len(_CRLF)
                end = end if end <= len(buf) else None
            else:
                break
            # Another frame (an answer to a request, a PONG, a status): nats-py parses that one
            # frame, and the frames after it come back here; else one such frame in a read sent
            # every delivery behind it down the slow path (a confirmed ACK's answer per batch
            # made the sidecar's CPU per item 1.3-1.8x).
            if end is None or end >= len(buf):
                break
            rest = buf[end:]
            del buf[end:]
            await super().parse(b"")
            if self.buf is not buf:
                return  # reset meanwhile (a reconnect): what was left belongs to the old connection
            buf.extend(rest)
            self._fast.handed_over += 1
        if buf:
            await super().parse(b"")


class FastInbound:
    """The fast path of one client; register a subscription's sid with its delivery callback."""

    def __init__(self, parser: _FastParser) -> None:
        self._parser = parser
        self.messages = 0  # delivered through the fast path (telemetry and tests)
        self.handed_over = 0  # other frames nats-py parsed alone, the fast path resuming after each

    @classmethod
    def install(cls, nc: Any) -> FastInbound | None:
        """Put the fast path in front of `nc`'s parser (once per client); None if nats-py changed."""
        existing = getattr(nc, "_sie_fast_inbound", None)
        if isinstance(existing, FastInbound):
            return existing
        ps = getattr(nc, "_ps", None)
        if type(ps) is not nats_parser.Parser or not isinstance(getattr(ps, "buf", None), bytearray):
            log.warning("nats-py parser internals changed; inbound fast path off")
            return None
        if (
            not hasattr(nats_parser, "AWAITING_CONTROL_LINE")
            or not hasattr(ps, "state")
            or not hasattr(nats_parser, "AWAITING_MSG_PAYLOAD")
            or not hasattr(nats_parser, "MSG_RE")
            or not hasattr(nats_parser, "HMSG_RE")
        ):
            log.warning("nats-py parser internals changed; inbound fast path off")
            return None
        ps.__class__ = _FastParser
        fast_ps: _FastParser = ps  # type: ignore[assignment]
        fast_ps._direct = {}
        fast = cls(fast_ps)
        fast_ps._fast = fast
        nc._sie_fast_inbound = fast
        return fast

    def register(self, sid: int, deliver: DeliverRun) -> None:
        """`deliver` receives each run of consecutive direct frames of `sid` as one list."""
        self._parser._direct[sid] = deliver

    def unregister(self, sid: int) -> None:
        self._parser._direct.pop(sid, None)


__all__ = ["DeliverRun", "FastInbound", "first_frame_end", "scan_direct_msgs"]
