# SPDX-License-Identifier: Apache-2.0
"""Fuzz the in-place response framer (`frame_batch_response`): valid BatchOutcomes mutated anywhere,
and arbitrary bytes, in; never a crash, nothing framed from a response the general path
(`decode_batch_outcome`, then `frame_outcome_replies`) would refuse, and whatever it frames is
byte for byte what the general path frames."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar._native import decode_batch_outcome, frame_outcome_replies
from sie_sidecar._native import frame_batch_response as native_frame
from sie_sidecar.backend.adapter import item_outcome
from sie_sidecar.wire.workitem import WorkItem

from .strategies import mutated

pytestmark = pytest.mark.fuzz

ARGS: dict[str, Any] = {"worker_id": "w", "current_hash": None, "now": 1.0e9, "max_payload": 1 << 20, "acks": True}


@dataclass
class _Msg:
    reply: str


@dataclass
class _D:
    item: WorkItem
    worker_direct: bool = False
    payload_fetch_ms: float = 0.0
    msg: _Msg = field(default_factory=lambda: _Msg("$JS.ACK.x"))


def _deliveries(n: int) -> list[_D]:
    return [
        _D(WorkItem(f"r{i}.0", f"r{i}", i, 1, "encode", "m", "p", "c", f"_INBOX.g.{i}", timestamp=1.0e9 - 1))
        for i in range(n)
    ]


def _valid(n: int) -> bytes:
    maps = [
        item_outcome(f"r{i}.0", f"r{i}", i, "publish_and_ack", result_msgpack=b"\x81\xa1x\x01", units={"pairs": i})
        for i in range(n)
    ]
    return bytes(msgpack.packb({"outcomes": maps, "batched_f16_multivectors": []}, use_bin_type=True))


def _check(data: bytes, n: int) -> None:
    ds = _deliveries(n)
    got = native_frame(data, ds, **ARGS)
    if got is None:
        return  # the general path decides (and reports any decode error)
    outcome = decode_batch_outcome(data)  # raises if the general path would refuse the response
    assert not outcome.batched_f16_multivectors
    expected = frame_outcome_replies(ds, list(outcome.outcomes), **ARGS)
    assert expected is not None
    assert (got.replies.buffer, got.replies.sent, got.replies.acks) == (expected.buffer, expected.sent, expected.acks)
    assert got.success == bytes(int(o.disposition == "publish_and_ack") for o in outcome.outcomes)


@given(n=st.integers(0, 4), data=st.data())
def test_fuzz_mutated_batch_outcomes(n: int, data: st.DataObject) -> None:
    _check(data.draw(mutated(_valid(n))), n)


@given(n=st.integers(0, 3), raw=st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(n: int, raw: bytes) -> None:
    _check(raw, n)
