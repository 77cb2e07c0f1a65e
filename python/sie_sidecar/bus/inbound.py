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
import re
import struct
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg
from nats.protocol import parser as nats_parser

from ..wire._switch import USING_NATIVE
from ..wire.workitem import WorkItem

log = logging.getLogger(__name__)

#: Receives a run of deliveries: `Msg` objects (twin), or native `LazyDelivery` objects.
DeliverRun = Callable[[list[Any]], None]
ScanResult = tuple[int, int, int, bool, BaseException | None]

_TOKEN = rb"[^ \t\r\n\f\v]+"
_MSG_LINE = re.compile(rb"MSG[ \t]+(%s)[ \t]+(%s)[ \t]+(%s)[ \t]+(\d+)[ \t]*\r\n" % (_TOKEN, _TOKEN, _TOKEN))
_MAX_CONTROL_LINE = 4096
_CRLF = b"\r\n"
#: nats-py's one-line frames, in the order its parser tries them.
_LINE_FRAMES = tuple(
    getattr(nats_parser, name)
    for name in ("OK_RE", "ERR_RE", "PING_RE", "PONG_RE", "INFO_RE")
    if hasattr(nats_parser, name)
)


def _new_msg(msg_cls: Any, client: Any, subject: str, reply: str, payload: bytes, sid: int) -> Any:  # noqa: PLR0917
    """A `msg_cls` with its instance dict filled directly, as the Cython scanner makes it."""
    msg = msg_cls.__new__(msg_cls)
    msg.__dict__.update(_client=client, subject=subject, reply=reply, data=payload, headers=None, _sid=sid)
    return msg


def scan_direct_msgs_py(
    buf: bytearray,
    direct: dict[int, DeliverRun],
    client: Any,
    msg_cls: Any,
    make_run: Callable[..., list[Any]] | None = None,
) -> ScanResult:
    """Pure-Python twin of the Cython scanner (same results; used by the parity tests).

    With `make_run`, a run is handed to it as the Cython scanner hands it: the run's bytes, four
    little-endian u32 per frame (reply offset and length, payload offset and length, in the run)
    and the frames' subjects; what it returns is delivered."""
    pos = count = nbytes = 0
    run: list[Any] | None = None
    run_sid = -1
    run_deliver: DeliverRun | None = None
    run_start = run_end = 0
    spans: list[int] = []
    subjects: list[str] = []

    def flush() -> BaseException | None:
        if run is None or run_deliver is None:
            return None
        try:
            if make_run is None:
                run_deliver(run)
            else:
                packed = struct.pack(f"<{len(spans)}I", *spans)
                run_deliver(make_run(bytes(buf[run_start:run_end]), packed, subjects, run_sid, client, msg_cls))
        except BaseException as exc:  # mirrors the Cython scanner: report, stop after this run
            return exc
        return None

    partial = False
    while pos < len(buf):
        if len(buf) - pos < 4:
            partial = buf.startswith(b"M", pos)
            break
        if not buf.startswith(b"MSG", pos) or buf[pos + 3] not in b" \t":
            break
        line_end = buf.find(b"\r\n", pos + 4, min(len(buf), pos + _MAX_CONTROL_LINE))
        if line_end < 0:
            partial = min(len(buf), pos + _MAX_CONTROL_LINE) == len(buf)
            break
        m = _MSG_LINE.fullmatch(bytes(buf[pos : line_end + 2]))
        if m is None or len(m.group(2)) > 18 or not m.group(2).isdigit() or len(m.group(4)) > 18:
            break  # also a MSG without a reply subject: not a JetStream delivery
        sid, size = int(m.group(2)), int(m.group(4))
        deliver = direct.get(sid)
        if deliver is None:
            break
        body = line_end + 2
        frame_end = body + size + 2
        if frame_end > len(buf):
            partial = True
            break
        if buf[frame_end - 2 : frame_end] != b"\r\n":
            break
        try:
            subject = m.group(1).decode()
            reply = m.group(3).decode()
        except UnicodeDecodeError:
            break
        payload = bytes(buf[body : body + size])
        if run is not None and sid != run_sid:
            error = flush()
            run = None
            if error is not None:
                return pos, count, nbytes, False, error
        if run is None:
            run, run_sid, run_deliver = [], sid, deliver
            run_start, spans, subjects = pos, [], []
        run.append(_new_msg(msg_cls, client, subject, reply, payload, sid))
        spans += (pos + m.start(3) - run_start, m.end(3) - m.start(3), body - run_start, size)
        subjects.append(subject)
        run_end = frame_end
        pos, count, nbytes = frame_end, count + 1, nbytes + size
    error = flush()
    return pos, count, nbytes, partial, error


Scanner = Callable[[bytearray, dict[int, DeliverRun], Any, Any, Callable[..., list[Any]] | None], ScanResult]


def _select_scanner() -> tuple[Scanner, Callable[..., list[Any]] | None]:
    """The Cython scanner, and the native maker of a run's deliveries (no `Msg` per frame), unless
    the pure-Python twin was asked for (then `Msg` objects, as nats-py makes them)."""
    if USING_NATIVE:
        from .._native import deliveries_of_run
        from .._native.wire import scan_direct_msgs

        return scan_direct_msgs, functools.partial(deliveries_of_run, item_cls=WorkItem)
    return scan_direct_msgs_py, None


scan_direct_msgs, make_run = _select_scanner()


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


__all__ = ["DeliverRun", "FastInbound", "first_frame_end", "scan_direct_msgs", "scan_direct_msgs_py"]
