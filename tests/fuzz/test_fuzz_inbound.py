# SPDX-License-Identifier: Apache-2.0
"""Fuzz the inbound MSG scanner: any bytes, and valid frame streams mutated anywhere, in; never a
crash, never more consumed than given, and the native scanner agrees with its twin."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from sie_sidecar._native import deliveries_of_run
from sie_sidecar._native.wire import scan_direct_msgs
from sie_sidecar._twins.inbound import scan_direct_msgs as scan_direct_msgs_py
from sie_sidecar.wire.workitem import WorkItem

MAKE_RUN = functools.partial(deliveries_of_run, item_cls=WorkItem)

pytestmark = pytest.mark.fuzz

frame = st.builds(
    lambda sid, reply, payload: (
        f"MSG _INBOX.x {sid}{' ' + reply if reply else ''} {len(payload)}\r\n".encode() + payload + b"\r\n"
    ),
    st.sampled_from([1, 7, 99, 2**40]),
    st.one_of(st.none(), st.text("abc$.>", min_size=1, max_size=8)),
    st.binary(max_size=64),
)


def _scan(scanner: object, data: bytes, *make_run: object) -> tuple[object, list[tuple[str, str, bytes]]]:
    got: list[Msg] = []
    result = scanner(bytearray(data), {1: got.extend, 2**40: got.extend}, None, Msg, *make_run)  # type: ignore[operator]
    return result[:4], [(m.subject, m.reply, m.data) for m in got]


@given(
    frames=st.lists(frame, max_size=8),
    flips=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=4),
    junk=st.binary(max_size=32),
)
def test_fuzz_scanner_on_mutated_streams(frames: list[bytes], flips: list[tuple[int, int]], junk: bytes) -> None:
    data = bytearray(b"".join(frames) + junk)
    for pos, value in flips:
        if data:
            data[pos % len(data)] = value
    native = _scan(scan_direct_msgs, bytes(data))
    assert native == _scan(scan_direct_msgs_py, bytes(data))
    assert native == _scan(scan_direct_msgs, bytes(data), MAKE_RUN) == _scan(scan_direct_msgs_py, bytes(data), MAKE_RUN)
    consumed = native[0][0]  # type: ignore[index]
    assert 0 <= consumed <= len(data)


@given(data=st.binary(max_size=2048))
def test_fuzz_scanner_on_arbitrary_bytes(data: bytes) -> None:
    assert _scan(scan_direct_msgs, data) == _scan(scan_direct_msgs_py, data) == _scan(scan_direct_msgs, data, MAKE_RUN)
