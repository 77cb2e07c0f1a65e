# SPDX-License-Identifier: Apache-2.0
"""The confirmed-ACK frame (`bus.ack_confirm.frame_confirmed_acks`), byte for byte: plain `+ACK`s,
the last one with the reply subject the answer comes back on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.bus.ack_confirm import ask_last_ack, frame_confirmed_acks

SUBJECT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)


def test_one_ack_carries_the_reply() -> None:
    assert frame_confirmed_acks(["$JS.ACK.S.D.1.7.7.0.0"], "_INBOX.abc.1") == (
        b"PUB $JS.ACK.S.D.1.7.7.0.0 _INBOX.abc.1 4\r\n+ACK\r\n"
    )


def test_only_the_last_of_a_batch_carries_the_reply() -> None:
    assert frame_confirmed_acks(["a.1", "a.2", "a.3"], "_INBOX.x.9") == (
        b"PUB a.1 4\r\n+ACK\r\nPUB a.2 4\r\n+ACK\r\nPUB a.3 _INBOX.x.9 4\r\n+ACK\r\n"
    )


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        frame_confirmed_acks([], "_INBOX.x.1")


@given(st.lists(SUBJECT, min_size=1, max_size=20), SUBJECT)
def test_the_frame_is_every_ack_in_order(subjects: list[str], reply: str) -> None:
    lines = frame_confirmed_acks(subjects, reply).split(b"\r\n")
    assert lines[-1] == b""
    commands, payloads = lines[0:-1:2], lines[1:-1:2]
    assert payloads == [b"+ACK"] * len(subjects)
    assert [c.split(b" ")[1].decode() for c in commands] == subjects
    assert all(c.split(b" ")[-1] == b"4" for c in commands)
    assert [len(c.split(b" ")) for c in commands] == [3] * (len(subjects) - 1) + [4]
    assert commands[-1].split(b" ")[2].decode() == reply


def test_the_last_ack_of_a_replies_buffer_is_made_to_ask() -> None:
    replies = (
        b"PUB _INBOX.r.1 3\r\nabc\r\nPUB $JS.ACK.S.D.1.1.1.0.0 4\r\n+ACK\r\nPUB $JS.ACK.S.D.1.2.2.0.0 4\r\n+ACK\r\n"
    )
    assert ask_last_ack(replies, "$JS.ACK.S.D.1.2.2.0.0", "_INBOX.c.7") == (
        b"PUB _INBOX.r.1 3\r\nabc\r\nPUB $JS.ACK.S.D.1.1.1.0.0 4\r\n+ACK\r\n"
        b"PUB $JS.ACK.S.D.1.2.2.0.0 _INBOX.c.7 4\r\n+ACK\r\n"
    )


@pytest.mark.parametrize(
    "buffer",
    [
        b"PUB _INBOX.r.1 3\r\nabc\r\n",  # no ACKs framed
        b"PUB $JS.ACK.S.D.1.1.1.0.0 4\r\n+ACK\r\n",  # another message's ACK last
        b"",
    ],
)
def test_a_buffer_not_ending_with_that_ack_is_left_alone(buffer: bytes) -> None:
    assert ask_last_ack(buffer, "$JS.ACK.S.D.1.2.2.0.0", "_INBOX.c.7") is None


@given(st.lists(SUBJECT, min_size=1, max_size=20), SUBJECT)
def test_asking_on_a_replies_buffer_frames_what_the_ack_path_frames(subjects: list[str], reply: str) -> None:
    """The two ways a batch's ACKs go out (after its replies in one buffer, or on their own) agree."""
    plain = b"".join(b"PUB %s 4\r\n+ACK\r\n" % s.encode() for s in subjects)
    assert ask_last_ack(plain, subjects[-1], reply) == frame_confirmed_acks(subjects, reply)
