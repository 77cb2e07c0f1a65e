# SPDX-License-Identifier: Apache-2.0
"""Twin of the Cython `_native.wire.scan_direct_msgs`: the direct `MSG` frames at the head of a nats-py
read buffer, delivered a run of consecutive frames of one subscription at a time (`bus.inbound`).

Without `make_run`, each frame becomes a `msg_cls` (nats-py's `Msg`, passed in as the native scanner
takes it) with its instance dict filled directly; with it, a run is handed to it as the Cython
scanner hands it."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

IMPLEMENTATION = "py"

#: Receives a run of deliveries.
DeliverRun = Callable[[list[Any]], None]
ScanResult = tuple[int, int, int, bool, BaseException | None]

_TOKEN = rb"[^ \t\r\n\f\v]+"
_MSG_LINE = re.compile(rb"MSG[ \t]+(%s)[ \t]+(%s)[ \t]+(%s)[ \t]+(\d+)[ \t]*\r\n" % (_TOKEN, _TOKEN, _TOKEN))
_MAX_CONTROL_LINE = 4096


def _new_msg(msg_cls: Any, client: Any, subject: str, reply: str, payload: bytes, sid: int) -> Any:  # noqa: PLR0917
    """A `msg_cls` with its instance dict filled directly, as the Cython scanner makes it."""
    msg = msg_cls.__new__(msg_cls)
    msg.__dict__.update(_client=client, subject=subject, reply=reply, data=payload, headers=None, _sid=sid)
    return msg


def scan_direct_msgs(  # noqa: PLR0917
    buf: bytearray | bytes,
    direct: dict[int, DeliverRun],
    client: Any,
    msg_cls: Any,
    make_run: Callable[..., list[Any]] | None = None,
    start: int = 0,
) -> ScanResult:
    """Pure-Python twin of the Cython scanner (same results; used by the parity tests).

    With `make_run`, a run is handed to it as the Cython scanner hands it: the run's bytes, four
    little-endian u32 per frame (reply offset and length, payload offset and length, in the run)
    and the frames' subjects; what it returns is delivered. A `bytes` buffer is handed over whole
    (not copied), the offsets then in it. The scan begins at `start`."""
    fixed = type(buf) is bytes
    if not fixed and type(buf) is not bytearray:
        raise TypeError(f"scan_direct_msgs needs a bytearray or bytes, not {type(buf).__name__}")
    if start < 0 or start > len(buf):
        raise ValueError(f"start {start} is outside the buffer of {len(buf)} bytes")
    pos, count, nbytes = start, 0, 0
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
                whole = buf if fixed else bytes(buf[run_start:run_end])
                run_deliver(make_run(whole, packed, subjects, run_sid, client, msg_cls))
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
        base = 0 if fixed else run_start
        spans += (pos + m.start(3) - base, m.end(3) - m.start(3), body - base, size)
        subjects.append(subject)
        run_end = frame_end
        pos, count, nbytes = frame_end, count + 1, nbytes + size
    error = flush()
    return pos, count, nbytes, partial, error


__all__ = ["IMPLEMENTATION", "scan_direct_msgs"]
