# SPDX-License-Identifier: Apache-2.0
"""The inbound fast path in front of nats-py's parser (`bus.inbound`, installed on a real client):
a frame of another subscription between deliveries is parsed by nats-py alone and the deliveries
after it still take the fast path (before, every one behind it went the slow way: with a confirmed
ACK's answer per batch that cost the sidecar 1.3-1.8x CPU per item); streams cut anywhere lose and
reorder nothing."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.protocol import parser as nats_parser

from sie_sidecar.bus.inbound import FastInbound, first_frame_end

from .conftest import NatsServer

DIRECT_SID = 4242


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(servers=[nats_server.url])
    try:
        yield nc
    finally:
        await nc.close()


def _direct(payload: bytes) -> bytes:
    return b"MSG _INBOX.pull.1 %d $JS.ACK.S.D.1.1.1.0.0 %d\r\n%s\r\n" % (DIRECT_SID, len(payload), payload)


def _other(sid: int, payload: bytes) -> bytes:
    return b"MSG _INBOX.answers.7 %d %d\r\n%s\r\n" % (sid, len(payload), payload)


def _other_status(sid: int) -> bytes:
    headers = b"NATS/1.0 503\r\n\r\n"
    return b"HMSG _INBOX.answers.8 %d %d %d\r\n%s\r\n" % (sid, len(headers), len(headers), headers)


def _payload(delivery: Any) -> bytes:
    """A run holds the compiled scanner's deliveries (each `.msg` made on first use) or, with the
    twins, nats-py `Msg`s: the pull consumer takes either, and so does this test."""
    msg: Any = getattr(delivery, "msg", delivery)
    return bytes(msg.data)


async def _setup(nc: Client) -> tuple[FastInbound, list[bytes], list[Any], int]:
    fast = FastInbound.install(nc)
    assert fast is not None
    direct: list[bytes] = []
    fast.register(DIRECT_SID, lambda run: direct.extend(_payload(d) for d in run))
    others: list[Any] = []

    async def on_other(msg: Any) -> None:
        others.append(msg)

    sub = await nc.subscribe("_INBOX.answers.*", cb=on_other)
    await nc.flush()
    return fast, direct, others, sub._id


async def _until(predicate: Any) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not delivered")


async def test_the_fast_path_resumes_after_a_frame_of_another_subscription(client: Client) -> None:
    fast, direct, others, sid = await _setup(client)
    data = b"".join([*map(_direct, (b"a", b"b", b"c")), _other(sid, b""), *map(_direct, (b"d", b"e", b"f"))])
    await client._ps.parse(data)
    assert direct == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert fast.messages == 6 and fast.handed_over == 1  # before: 3 and the other three slowly
    assert fast.in_place == 6  # the scan resumed in the read itself after the other frame
    await _until(lambda: len(others) == 1)
    assert others[0].subject == "_INBOX.answers.7" and others[0].data == b""
    assert client._ps.buf == bytearray() and client._ps.state == nats_parser.AWAITING_CONTROL_LINE


async def test_a_status_with_headers_between_deliveries_is_handed_over_alone(client: Client) -> None:
    fast, direct, others, sid = await _setup(client)
    await client._ps.parse(_direct(b"1") + _other_status(sid) + _direct(b"2") + _direct(b"3"))
    assert direct == [b"1", b"2", b"3"] and fast.messages == 3
    await _until(lambda: len(others) == 1)
    assert others[0].headers == {"Status": "503"}


@pytest.mark.parametrize(
    ("cut", "in_place"),
    [
        (10, 3),  # inside the first frame's control line: completed from the next read's head
        (120, 3),  # inside the second frame's payload: the first in place, then the last two
        (0, 4),  # one read: all four in place
    ],
)
async def test_a_read_is_scanned_in_place_once_the_cut_frame_is_complete(
    client: Client, cut: int, in_place: int
) -> None:
    """Only the frame a read cut goes through nats-py's buffer; the others are read where they lie."""
    fast, direct, _, _ = await _setup(client)
    payloads = [bytes([65 + i]) * 50 for i in range(4)]
    stream = b"".join(map(_direct, payloads))
    assert len(_direct(payloads[0])) < 120 < 2 * len(_direct(payloads[0]))
    for piece in (stream[:cut], stream[cut:]):
        if piece:
            await client._ps.parse(piece)
    assert direct == payloads
    assert (fast.messages, fast.in_place) == (4, in_place)
    assert client._ps.buf == bytearray()


async def test_a_failing_delivery_of_the_completed_frame_keeps_the_rest_of_the_read(client: Client) -> None:
    """The frame a read completed is delivered through the buffer; when its callback raises, the
    frames behind it in the read stay in the buffer, as they do when a run scanned in place fails."""
    fast, direct, _, _ = await _setup(client)
    calls = 0

    def deliver(run: list[Any]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("consumer failed")
        direct.extend(_payload(d) for d in run)

    fast.register(DIRECT_SID, deliver)
    stream = b"".join(map(_direct, (b"one", b"two", b"three")))
    await client._ps.parse(stream[:10])
    with pytest.raises(RuntimeError, match="consumer failed"):
        await client._ps.parse(stream[10:])
    await client._ps.parse(b"")
    assert direct == [b"two", b"three"]


def test_first_frame_end_reads_frames_as_nats_py_does() -> None:
    frame = _other(9, b"xyz")
    assert first_frame_end(bytearray(frame + b"PING\r\n")) == len(frame)
    assert first_frame_end(bytearray(frame[:-1])) is None  # not complete yet
    assert first_frame_end(bytearray(_other_status(9) + b"MSG")) == len(_other_status(9))
    assert first_frame_end(bytearray(b"PONG\r\nMSG x")) == 6
    assert first_frame_end(bytearray(b"+OK\r\n")) == 5
    assert first_frame_end(bytearray(b"-ERR 'Stale Connection'\r\nPING\r\n")) == len(b"-ERR 'Stale Connection'\r\n")
    assert first_frame_end(bytearray(b"WHAT\r\n")) is None  # unknown: nats-py takes it all


async def test_streams_cut_anywhere_lose_and_reorder_nothing(client: Client) -> None:
    """300 seeded streams of deliveries, other messages and statuses, fed in random pieces."""
    fast, direct, others, sid = await _setup(client)
    rng = random.Random(20261205)
    want_direct: list[bytes] = []
    want_others = 0
    for case in range(300):
        frames: list[bytes] = []
        for i in range(rng.randint(1, 12)):
            kind = rng.random()
            payload = b"%d.%d." % (case, i) + rng.randbytes(rng.randint(0, 40)).replace(b"\r", b"")
            if kind < 0.6:
                frames.append(_direct(payload))
                want_direct.append(payload)
            elif kind < 0.85:
                frames.append(_other(sid, payload))
                want_others += 1
            else:
                frames.append(_other_status(sid))
                want_others += 1
        stream = b"".join(frames)
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 4))))
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            await client._ps.parse(stream[start:end])
        assert client._ps.buf == bytearray() and client._ps.state == nats_parser.AWAITING_CONTROL_LINE
    assert direct == want_direct
    await _until(lambda: len(others) == want_others)
    assert fast.messages == len(want_direct)
    assert 0 < fast.in_place < fast.messages  # both ways were taken: in place, and through the buffer
