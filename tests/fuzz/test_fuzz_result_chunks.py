# SPDX-License-Identifier: Apache-2.0
"""Fuzz ResultChunkAssembler: random and mutated envelopes may only raise WireError subclasses.

`HYPOTHESIS_PROFILE=fuzz` runs the long version (`make fuzz`); the default profile keeps it short.
"""

from __future__ import annotations

import hashlib
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.errors import WireError
from sie_sidecar.wire.types import WorkResult

pytestmark = pytest.mark.fuzz

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
# Structured strategies are costly to draw; a quarter of the profile's examples keeps the default run
# short while `HYPOTHESIS_PROFILE=fuzz` still runs thousands.
costly = settings(
    max_examples=max(50, settings().max_examples // 4), suppress_health_check=[HealthCheck.function_scoped_fixture]
)

MAX_TOTAL = 4096  # a small ceiling so bounds are easy to hit


def feed_all(impl: ModuleType, envelopes: list[bytes], max_total: int = MAX_TOTAL) -> None:
    """Feed every envelope; a WireError is a valid outcome, anything else escapes and fails."""
    assembler = impl.ResultChunkAssembler(max_total=max_total)
    for envelope in envelopes:
        try:
            done = assembler.feed(envelope)
        except WireError:
            continue
        if done is not None:
            work_item_id, data = done
            assert isinstance(work_item_id, str)
            assert isinstance(data, bytes)
            assert 0 < len(data) <= max_total
        assert assembler.pending <= len(envelopes)


def valid_chunks(impl: ModuleType, data: bytes, n: int, request_id: str = "req", index: int = 0) -> list[bytes]:
    digest = hashlib.sha256(data).digest()
    total = len(data)
    return [
        bytes(
            impl.encode_result_chunk(
                f"{request_id}.{index}",
                request_id,
                index,
                digest,
                i,
                n,
                total,
                data[total * i // n : total * (i + 1) // n],
            )
        )
        for i in range(n)
    ]


@fixture_ok
@given(envelopes=st.lists(st.binary(max_size=512), max_size=8))
def test_random_bytes(impl: ModuleType, envelopes: list[bytes]) -> None:
    feed_all(impl, envelopes)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=40)
)
msgpack_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=4,
)

field_values: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(["result_chunk_v1", "ipc_response_chunk_v1", "", "chunk"]) | msgpack_values,
    "work_item_id": st.sampled_from(["r.0", "r.1", "", ".0", "r.00"]) | scalars,
    "request_id": st.sampled_from(["r", ""]) | scalars,
    "item_index": st.integers(-2, 3) | st.sampled_from([2**32, 2**64 - 1]) | scalars,
    "transfer_digest": st.binary(min_size=31, max_size=33) | scalars,
    "chunk_index": st.integers(-1, 66) | scalars,
    "chunk_count": st.integers(-1, 66) | scalars,
    "total_bytes": st.integers(-1, MAX_TOTAL + 2) | st.sampled_from([2**63, 2**64 - 1]) | scalars,
    "payload": st.binary(max_size=64) | scalars,
}


@st.composite
def envelope_maps(draw: st.DrawFn) -> bytes:
    """Maps with the chunk keys (some dropped, some of the wrong type), packed in a random order."""
    keys = draw(st.lists(st.sampled_from(sorted(field_values)), unique=True, min_size=5))
    body = {key: draw(field_values[key]) for key in keys}
    if draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(msgpack_values)
    return bytes(msgpack.packb(body, use_bin_type=True))


@costly
@given(envelopes=st.lists(envelope_maps(), min_size=1, max_size=6))
def test_structured_envelopes(impl: ModuleType, envelopes: list[bytes]) -> None:
    feed_all(impl, envelopes)


@st.composite
def mutated_transfer(draw: st.DrawFn, impl: ModuleType) -> list[bytes]:
    """A valid transfer whose envelopes are shuffled, duplicated, truncated and bit-flipped."""
    data = draw(st.binary(min_size=1, max_size=MAX_TOTAL))
    n = draw(st.integers(1, min(64, len(data))))
    index = draw(st.integers(0, 2))
    messages = valid_chunks(impl, data, n, index=index)
    out: list[bytes] = []
    for message in draw(st.permutations(messages + draw(st.lists(st.sampled_from(messages), max_size=3)))):
        action = draw(st.sampled_from(["keep", "flip", "truncate", "extend", "splice"]))
        buf = bytearray(message)
        if action == "flip":
            for _ in range(draw(st.integers(1, 4))):
                pos = draw(st.integers(0, len(buf) - 1))
                buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif action == "truncate":
            del buf[draw(st.integers(0, len(buf) - 1)) :]
        elif action == "extend":
            buf += draw(st.binary(min_size=1, max_size=8))
        elif action == "splice":
            pos = draw(st.integers(0, len(buf)))
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        out.append(bytes(buf))
    return out


@fixture_ok
@given(data=st.data())
def test_mutated_transfers(impl: ModuleType, data: st.DataObject) -> None:
    feed_all(impl, data.draw(mutated_transfer(impl)))


@costly
@given(data=st.data())
def test_interleaved_transfers_with_noise(impl: ModuleType, data: st.DataObject) -> None:
    streams = [
        valid_chunks(impl, data.draw(st.binary(min_size=1, max_size=512)), data.draw(st.integers(1, 8)), "r", i)
        for i in range(data.draw(st.integers(1, 3)))
    ]
    noise = data.draw(st.lists(envelope_maps(), max_size=4))
    feed_all(impl, data.draw(st.permutations([m for s in streams for m in s] + noise)))


@fixture_ok
@given(size=st.integers(0, 3000), limit=st.integers(0, 2000), accepts=st.booleans(), data=st.data())
def test_plan_reply_then_mutate(impl: ModuleType, size: int, limit: int, accepts: bool, data: st.DataObject) -> None:
    result = WorkResult(work_item_id="q.1", request_id="q", item_index=1, success=True, result_msgpack=b"\x5a" * size)
    try:
        plan = impl.plan_reply(result, accepts_result_chunks=accepts, max_payload=limit)
    except WireError:
        return
    assert all(len(m) <= limit for m in plan.messages)
    messages = list(plan.messages)
    if messages:
        victim = data.draw(st.integers(0, len(messages) - 1))
        buf = bytearray(messages[victim])
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] ^= 0xFF
        messages.append(bytes(buf))
    feed_all(impl, data.draw(st.permutations(messages)), max_total=1 << 24)
