# SPDX-License-Identifier: Apache-2.0
"""The inbound MSG fast path: the Cython scanner and its twin agree frame for frame, stop at anything
they do not own, and never consume a frame that has not fully arrived."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from sie_sidecar._native.wire import scan_direct_msgs
from sie_sidecar.bus.inbound import scan_direct_msgs_py

SCANNERS = {"native": scan_direct_msgs, "py": scan_direct_msgs_py}
DIRECT_SIDS = (3, 7)


def run(
    scanner: Any, data: bytes
) -> tuple[tuple[int, int, int, bool, object], list[tuple[str, str, bytes, int | None]]]:
    got: list[Msg] = []
    direct = {sid: got.append for sid in DIRECT_SIDS}
    consumed, count, nbytes, partial, error = scanner(bytearray(data), direct, None, Msg)
    return (consumed, count, nbytes, partial, error), [(m.subject, m.reply, m.data, m._sid) for m in got]


@pytest.mark.parametrize("name", sorted(SCANNERS))
def test_direct_frames_are_delivered_until_a_foreign_one(name: str) -> None:
    data = (
        b"MSG _INBOX.a 7 $JS.ACK.s.c.1.2.3.4.5 5\r\nhello\r\n"
        b"MSG _INBOX.a\t7  2\r\nhi\r\n"
        b"HMSG _INBOX.a 7 22 22\r\nNATS/1.0 408 Timeout\r\n\r\n\r\n"
        b"MSG _INBOX.a 7 1\r\nz\r\n"
    )
    (consumed, count, nbytes, partial, error), msgs = run(SCANNERS[name], data)
    assert msgs == [("_INBOX.a", "$JS.ACK.s.c.1.2.3.4.5", b"hello", 7), ("_INBOX.a", "", b"hi", 7)]
    assert (count, nbytes, partial, error) == (2, 7, False, None)
    assert data[consumed:].startswith(b"HMSG")  # left for nats-py's parser


@pytest.mark.parametrize("name", sorted(SCANNERS))
@pytest.mark.parametrize(
    ("data", "partial"),
    [
        (b"MSG _INBOX.a 7 5\r\nhel", True),  # payload still arriving
        (b"MSG _INBOX.a 7 5", True),  # control line still arriving
        (b"MS", True),
        (b"MSG _INBOX.a 9 1\r\nx\r\n", False),  # not a registered subscription
        (b"PING\r\n", False),
        (b"MSG _INBOX.a 7 1\r\nxy\r\n", False),  # size does not match: nats-py reports it
        (b"MSG _INBOX.a 7 -1\r\n\r\n", False),
        (b"MSG _INBOX.a x 1\r\nx\r\n", False),
        (b"MSG \xff 7 1\r\nx\r\n", False),  # a subject that is not UTF-8
    ],
)
def test_nothing_is_consumed_that_is_not_a_complete_direct_frame(name: str, data: bytes, partial: bool) -> None:
    (consumed, count, _, was_partial, _), msgs = run(SCANNERS[name], data)
    assert (consumed, count, msgs) == (0, 0, [])
    assert was_partial is partial


@pytest.mark.parametrize("name", sorted(SCANNERS))
def test_a_failing_callback_stops_the_scan_after_its_message(name: str) -> None:
    boom = RuntimeError("boom")

    def deliver(msg: Msg) -> None:
        raise boom

    data = b"MSG a 7 1\r\nx\r\nMSG a 7 1\r\ny\r\n"
    consumed, count, _, _, error = SCANNERS[name](bytearray(data), {7: deliver}, None, Msg)
    assert (consumed, count, error) == (14, 1, boom)


tokens = st.text(alphabet="abcdefgh._>*$", min_size=1, max_size=12)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["msg", "msg", "msg", "hmsg", "ping", "junk"]))
    if kind == "ping":
        return b"PING\r\n"
    if kind == "junk":
        return draw(st.binary(max_size=20))
    sid = draw(st.sampled_from([3, 7, 9]))
    payload = draw(st.binary(max_size=40))
    reply = draw(st.one_of(st.none(), tokens))
    subject = draw(tokens)
    sep = draw(st.sampled_from([" ", "\t", "  "]))
    parts = [subject, str(sid)] + ([reply] if reply else [])
    if kind == "hmsg":
        return f"HMSG {sep.join(parts)} 12 {12 + len(payload)}\r\n".encode() + b"NATS/1.0\r\n\r\n" + payload + b"\r\n"
    return f"MSG {sep.join([*parts, str(len(payload))])}\r\n".encode() + payload + b"\r\n"


@given(stream=st.lists(frames(), max_size=12), cut=st.integers(min_value=0, max_value=2000))
def test_native_and_twin_agree_on_any_stream_cut_anywhere(stream: list[bytes], cut: int) -> None:
    data = b"".join(stream)[:cut]
    native = run(scan_direct_msgs, data)
    twin = run(scan_direct_msgs_py, data)
    assert native == twin
    (consumed, count, nbytes, _, _), msgs = native
    assert consumed <= len(data) and count == len(msgs) and nbytes == sum(len(m[2]) for m in msgs)


@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    (consumed, _, _, _, error), _ = run(scan_direct_msgs, data)
    assert 0 <= consumed <= len(data) and error is None
