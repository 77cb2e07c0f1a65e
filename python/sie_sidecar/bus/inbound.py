# SPDX-License-Identifier: Apache-2.0
"""Inbound fast path: JetStream deliveries for the pull inboxes, parsed a read buffer at a time.

nats-py parses every frame in Python (a regex match, an awaited `_process_msg`, header processing,
a queue put): several µs a message, which is the largest per-message cost left in the sidecar. A
parser installed here first hands the complete `MSG` frames of *registered* subscriptions at the
head of the buffer to `scan_direct_msgs` (Cython: one C loop, the consumer's callback called
synchronously once per run of frames), and leaves everything else to nats-py's own parser,
unchanged. A run is not made into nats-py `Msg` objects: the native core makes one `LazyDelivery`
per frame (subject, ACK subject and payload as spans of the run, the WorkItem read in place); the
`Msg` is built only if a per-message path (a NAK, a progress ACK) asks for it. With the pure-Python
twin selected, frames become `Msg` objects as before.

A read is scanned where it lies (issue 32): once the frame the last read cut is completed from its
head, its frames are runs of the read itself, copied neither into nats-py's buffer nor into a run
of their own. Only what the scan leaves (another subscription's frame, a frame still arriving)
joins the buffer, and a buffer's run is copied once.

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
from .reads import ReadsAsTheyCame

log = logging.getLogger(__name__)

#: Receives a run of deliveries: `Msg` objects (twin), or native `LazyDelivery` objects.
DeliverRun = Callable[[list[Any]], None]
ScanResult = tuple[int, int, int, bool, BaseException | None]

_CRLF = b"\r\n"
#: The longest control line nats-py accepts (its MAX_CONTROL_LINE_SIZE).
_MAX_LINE = 4096
#: nats-py's one-line frames, in the order its parser tries them.
_LINE_FRAMES = tuple(
    getattr(nats_parser, name)
    for name in ("OK_RE", "ERR_RE", "PING_RE", "PONG_RE", "INFO_RE")
    if hasattr(nats_parser, name)
)

Scanner = Callable[
    [bytearray | bytes, dict[int, DeliverRun], Any, Any, Callable[..., list[Any]] | None, int], ScanResult
]

#: The compiled core, or the pure-Python twin with `SIE_SIDECAR_NO_EXTENSIONS=1` (`_twins.inbound`).
_core = load("inbound")
#: The Cython scanner and the native maker of a run's deliveries (no `Msg` per frame); with the twin,
#: its scanner and no maker (then `Msg` objects, as nats-py makes them).
scan_direct_msgs: Scanner = _core.wire.scan_direct_msgs if USING_NATIVE else _core.scan_direct_msgs
make_run: Callable[..., list[Any]] | None = (
    functools.partial(_core.deliveries_of_run, item_cls=WorkItem) if USING_NATIVE else None
)


def first_frame_end(buf: bytearray | memoryview) -> int | None:
    """Where the first complete frame of `buf` ends, read as nats-py's parser reads it (its own
    patterns); None when it is not complete yet or not one nats-py knows (then nats-py takes all)."""
    head = bytes(buf[:4])
    if head.startswith(b"MSG"):
        m = nats_parser.MSG_RE.match(buf)
        end = None if m is None else m.end() + int(m.group(5)) + 2
    elif head == b"HMSG":
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
    _make_run: Callable[..., list[Any]] | None  # `make_run`, with this client's attempt tallies
    _fast: FastInbound
    _reader: object  # the connection's StreamReader last seen (adopted, or left as it was)

    async def parse(self, data: bytes = b"") -> None:
        reader = getattr(self.nc._transport, "_io_reader", None)
        if reader is not self._reader and self.nc.is_connected:
            # A new connection, its handshake over (it reads lines through StreamReader's buffer):
            # from now on its reads are handed over as they came.
            self._reader = reader
            ReadsAsTheyCame.adopt(reader)
        buf = self.buf
        if data and self._direct and type(data) is bytes:
            start = self._completes_partial(buf, data)
            if start is not None:
                await self._parse_read(buf, data, start)
                return
        if data:
            buf.extend(data)
        await self._parse_buffer(buf)

    def _completes_partial(self, buf: bytearray, data: bytes) -> int | None:
        """How many bytes at the head of `data` complete the frame `buf` was left holding (0 when
        it holds none), or None when that is not known here (then `data` joins `buf` whole)."""
        if not buf:
            return 0
        if self.state != nats_parser.AWAITING_CONTROL_LINE or not buf.startswith(b"MSG"):
            return None
        line_end = buf.find(_CRLF, 0, _MAX_LINE)
        if line_end >= 0:
            m = nats_parser.MSG_RE.match(buf, 0, line_end + len(_CRLF))
        else:  # the control line itself was cut: its end is in `data` (joined: under 4 KB)
            cut = data.find(_CRLF, 0, _MAX_LINE)
            m = None if cut < 0 else nats_parser.MSG_RE.match(bytes(buf) + data[: cut + len(_CRLF)])
        if m is None:
            return None
        need = m.end() + int(m.group(5)) + len(_CRLF) - len(buf)
        return need if 0 < need <= len(data) else None

    async def _parse_read(self, buf: bytearray, data: bytes, start: int) -> None:
        """Parse a read whose first `start` bytes complete the frame in `buf`: that frame through
        `buf`, then the rest in place. The scanner hands a run `data` itself, so the deliveries'
        bytes are the read's and are copied neither into `buf` nor into a run of their own. A frame
        of another subscription goes to nats-py alone and the scan resumes after it; only what is
        left when the scan cannot go on (a frame still arriving, one not known) joins `buf`."""
        view = memoryview(data)
        if start:
            buf.extend(view[:start])
            try:
                await self._parse_buffer(buf)
            except BaseException:
                if self.buf is buf:
                    buf.extend(view[start:])  # kept, as the scan below keeps what follows an error
                raise
            if self.buf is not buf:
                return  # reset meanwhile (a reconnect): the read belongs to the old connection
        pos, partial = start, False
        while not buf and self.state == nats_parser.AWAITING_CONTROL_LINE and self._direct:
            consumed, count, nbytes, partial, error = scan_direct_msgs(
                data, self._direct, self.nc, Msg, self._make_run, pos
            )
            if count:
                stats = self.nc.stats
                stats["in_msgs"] += count
                stats["in_bytes"] += nbytes
                self._fast.messages += count
                self._fast.in_place += count
            pos = consumed
            if error is not None:
                buf.extend(view[pos:])
                raise error
            if partial or pos == len(data):
                break
            # A frame the scan does not own (an ACK's answer, a status): nats-py parses it alone,
            # and the scan resumes in the read after it (else the rest of the read, ~30 KB, would
            # be copied into the buffer for it).
            end = first_frame_end(view[pos:])
            if end is None or pos + end >= len(data):
                break  # not known, or the read's last frame: nats-py takes the rest from the buffer
            if not await self._parse_alone(bytearray(view[pos : pos + end])):
                return
            pos += end
        if pos < len(data):
            buf.extend(view[pos:])
        if buf and not partial and self.buf is buf:  # partial: a direct frame still arriving
            await self._parse_buffer(buf)

    async def _parse_alone(self, one: bytearray) -> bool:
        """nats-py parses the frame `one` in a buffer of its own while the frames behind it stay
        where they are; what it leaves of `one` goes first in the buffer. False when the parser was
        reset meanwhile (a reconnect: what was left belongs to the old connection)."""
        buf = self.buf
        self.buf = one
        await super().parse(b"")
        if self.buf is not one:
            return False
        if one:
            buf[:0] = one  # not all taken (nats-py stopped inside it): it stays first
        self.buf = buf
        self._fast.handed_over += 1
        return True

    async def _parse_buffer(self, buf: bytearray) -> None:
        """The frames in `buf`: direct runs through the scanner, anything else by nats-py."""
        direct = self._direct
        while direct and buf:
            if self.state == nats_parser.AWAITING_CONTROL_LINE:
                consumed, count, nbytes, partial, error = scan_direct_msgs(buf, direct, self.nc, Msg, self._make_run, 0)
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
            # That one frame goes alone (a copy of it, ~100 bytes): moving the frames behind it
            # out and back in copied the rest of the read twice, ~17 KB a handover (issue 32).
            one = buf[:end]
            del buf[:end]  # a prefix: CPython only moves the bytearray's start
            if not await self._parse_alone(one):
                return
        if buf:
            await super().parse(b"")


class FastInbound:
    """The fast path of one client; register a subscription's sid with its delivery callback."""

    def __init__(self, parser: _FastParser) -> None:
        self._parser = parser
        #: sid -> the `AttemptTally` its runs' ACK subjects are counted into as they are scanned.
        self._tallies: dict[int, Any] = {}
        self.messages = 0  # delivered through the fast path (telemetry and tests)
        self.handed_over = 0  # other frames nats-py parsed alone, the fast path resuming after each
        self.in_place = 0  # of `messages`, those read in place in a read (not copied into a buffer)

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
        fast_ps._reader = None
        fast = cls(fast_ps)
        fast_ps._make_run = None if make_run is None else functools.partial(make_run, tallies=fast._tallies)
        fast_ps._fast = fast
        nc._sie_fast_inbound = fast
        return fast

    def register(self, sid: int, deliver: DeliverRun) -> None:
        """`deliver` receives each run of consecutive direct frames of `sid` as one list."""
        self._parser._direct[sid] = deliver

    def unregister(self, sid: int) -> None:
        self._parser._direct.pop(sid, None)
        self._tallies.pop(sid, None)

    def tally(self, sid: int, tally: Any | None) -> bool:
        """Count the delivery attempts of `sid`'s runs into `tally` as they are scanned (None: stop).
        Whether the scan counts them: only the compiled maker of runs does, for a registered sid, so
        with the twins (`SIE_SIDECAR_NO_EXTENSIONS=1`) or callback delivery the caller counts each
        run itself."""
        if tally is None or make_run is None or sid not in self._parser._direct:
            self._tallies.pop(sid, None)  # not counted by the scan: the caller counts each run
            return False
        self._tallies[sid] = tally
        return True

    def tallied(self, sid: int) -> bool:
        """Whether the runs of `sid` are counted by the scan (`tally`)."""
        return sid in self._tallies


__all__ = ["DeliverRun", "FastInbound", "first_frame_end", "scan_direct_msgs"]
