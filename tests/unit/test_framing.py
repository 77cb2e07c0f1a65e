# SPDX-License-Identifier: Apache-2.0
"""IPC length-prefixed framing (wire-protocol §1.1; TV-I1, TV-I4, TV-I5)."""

from __future__ import annotations

import itertools
from types import ModuleType

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar import errors
from sie_sidecar.wire.limits import MAX_FRAME

TV_I1_BODY = bytes.fromhex(
    "85a776657273696f6e01aa726571756573745f6964a7722d736d616c6ca26f6bc3a4626f647981a576616c756593010203a56572726f72c0"
)
TV_I1_FRAME = bytes.fromhex("00000038") + TV_I1_BODY
TV_I2_RESPONSE_FRAME = bytes.fromhex(
    "0000004085a776657273696f6e01aa726571756573745f6964a27231a26f6bc2a4626f6479c0a56572726f72b7756e737570706f727465642076657273696f6e20393939"
)


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def feed_all(splitter: object, pieces: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for piece in pieces:
        out.extend(bytes(v) for v in splitter.feed(piece))  # type: ignore[attr-defined]
    return out


# --- encode_frame -------------------------------------------------------------------------------


def test_encode_frame_tv_i1(impl: ModuleType) -> None:
    assert impl.encode_frame(TV_I1_BODY) == TV_I1_FRAME


def test_encode_frame_accepts_buffers(impl: ModuleType) -> None:
    body = b"\x81\xa1a\x01"
    assert impl.encode_frame(bytearray(body)) == frame(body)
    assert impl.encode_frame(memoryview(body)) == frame(body)
    assert impl.encode_frame(np.frombuffer(body, dtype=np.uint8)) == frame(body)
    assert impl.encode_frame(b"") == b"\x00\x00\x00\x00"


def test_encode_frame_ceiling_tv_i5(impl: ModuleType) -> None:
    exact = bytes(MAX_FRAME)
    out = impl.encode_frame(exact)
    assert out[:4] == bytes.fromhex("02000000")
    assert len(out) == MAX_FRAME + 4
    with pytest.raises(errors.FrameTooLarge):
        impl.encode_frame(bytes(MAX_FRAME + 1))


# --- FrameSplitter: the vectors -----------------------------------------------------------------


def test_splitter_whole_frame_tv_i1(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    bodies = splitter.feed(TV_I1_FRAME)
    assert len(bodies) == 1
    assert isinstance(bodies[0], memoryview)
    assert bodies[0].readonly
    assert bytes(bodies[0]) == TV_I1_BODY
    assert splitter.buffered == 0


def test_splitter_malformed_body_tv_i4(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    bodies = splitter.feed(bytes.fromhex("00000003ffffff"))
    assert [bytes(b) for b in bodies] == [b"\xff\xff\xff"]
    with pytest.raises(errors.DecodeError):
        impl.decode_response(bodies[0])


def test_splitter_declared_over_ceiling_tv_i5(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(bytes.fromhex("02000001") + b"\x80")
    # The stream is desynchronised: the splitter stays closed, even for a valid frame.
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(TV_I1_FRAME)
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(b"")


def test_splitter_declared_at_ceiling_is_accepted_tv_i5(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    assert splitter.feed(bytes.fromhex("02000000") + b"\x80\x80") == []
    assert splitter.buffered == 6


def test_splitter_header_split_then_over_ceiling(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter(max_body=16)
    assert splitter.feed(b"\x00\x00") == []
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(b"\x00\x11")
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(frame(b"\x80"))


def test_splitter_over_ceiling_after_good_frames(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter(max_body=8)
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(frame(b"\x80") + frame(bytes(9)))
    with pytest.raises(errors.FrameTooLarge):
        splitter.feed(frame(b"\x80"))


def test_splitter_custom_max_body_boundary(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter(max_body=8)
    assert feed_all(splitter, [frame(bytes(8))]) == [bytes(8)]


def test_splitter_zero_length_body_tv_i5(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    bodies = splitter.feed(b"\x00\x00\x00\x00")
    assert len(bodies) == 1
    assert bytes(bodies[0]) == b""
    with pytest.raises(errors.DecodeError):
        impl.decode_response(bodies[0])


def test_splitter_zero_length_body_across_reads(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    assert splitter.feed(b"\x00\x00") == []
    assert splitter.buffered == 2
    out = splitter.feed(b"\x00\x00" + frame(b"\x80"))
    assert [bytes(b) for b in out] == [b"", b"\x80"]
    assert splitter.buffered == 0


# --- FrameSplitter: read sizes ------------------------------------------------------------------


def test_splitter_byte_at_a_time(impl: ModuleType) -> None:
    stream = TV_I1_FRAME + TV_I2_RESPONSE_FRAME
    splitter = impl.FrameSplitter()
    out: list[bytes] = []
    for i in range(len(stream)):
        got = splitter.feed(stream[i : i + 1])
        out.extend(bytes(b) for b in got)
        if i < len(TV_I1_FRAME) - 1:
            assert splitter.buffered == i + 1
    assert out == [TV_I1_BODY, TV_I2_RESPONSE_FRAME[4:]]
    assert splitter.buffered == 0


def test_splitter_many_frames_one_read(impl: ModuleType) -> None:
    bodies = [bytes([0x80 + (i % 16)]) * (i + 1) for i in range(20)]
    splitter = impl.FrameSplitter()
    got = splitter.feed(b"".join(frame(b) for b in bodies))
    assert [bytes(g) for g in got] == bodies
    assert all(g.readonly for g in got)


def test_splitter_partial_tail_is_buffered(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    got = splitter.feed(TV_I1_FRAME + TV_I1_FRAME[:10])
    assert [bytes(g) for g in got] == [TV_I1_BODY]
    assert splitter.buffered == 10
    got = splitter.feed(TV_I1_FRAME[10:] + TV_I1_FRAME[:3])
    assert [bytes(g) for g in got] == [TV_I1_BODY]
    assert splitter.buffered == 3
    assert [bytes(g) for g in splitter.feed(TV_I1_FRAME[3:])] == [TV_I1_BODY]
    assert splitter.buffered == 0


def test_splitter_empty_feed(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    assert splitter.feed(b"") == []
    splitter.feed(TV_I1_FRAME[:7])
    assert splitter.feed(b"") == []
    assert splitter.buffered == 7


def test_splitter_accepts_buffer_types(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    out = [bytes(b) for b in splitter.feed(bytearray(TV_I1_FRAME[:20]))]
    out += [bytes(b) for b in splitter.feed(memoryview(TV_I1_FRAME)[20:40])]
    out += [bytes(b) for b in splitter.feed(np.frombuffer(TV_I1_FRAME[40:], dtype=np.uint8))]
    assert out == [TV_I1_BODY]


def test_splitter_bodies_are_copies_of_the_read_buffer(impl: ModuleType) -> None:
    """The caller may reuse its read buffer as soon as feed returns."""
    read_buf = bytearray(TV_I1_FRAME + TV_I1_FRAME[:30])
    splitter = impl.FrameSplitter()
    first = splitter.feed(read_buf)
    read_buf[:] = bytes(len(read_buf))
    tail = bytearray(TV_I1_FRAME[30:])
    second = splitter.feed(tail)
    tail[:] = bytes(len(tail))
    assert bytes(first[0]) == TV_I1_BODY
    assert bytes(second[0]) == TV_I1_BODY


def test_splitter_bodies_are_read_only(impl: ModuleType) -> None:
    splitter = impl.FrameSplitter()
    straddling = splitter.feed(TV_I1_FRAME[:30])
    straddling = splitter.feed(TV_I1_FRAME[30:] + TV_I1_FRAME)
    assert len(straddling) == 2
    for body in straddling:
        assert body.readonly
        with pytest.raises(TypeError):
            body[0] = 0


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=25),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_splitter_any_chunking_property(impl: ModuleType, bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in itertools.pairwise(points)]
    splitter = impl.FrameSplitter()
    assert feed_all(splitter, pieces) == bodies
    assert splitter.buffered == 0


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(st.binary(max_size=64), min_size=1, max_size=10), cut=st.integers(min_value=1, max_value=400))
def test_splitter_buffered_counts_incomplete_frame(impl: ModuleType, bodies: list[bytes], cut: int) -> None:
    stream = b"".join(frame(b) for b in bodies)
    cut = min(cut, len(stream))
    splitter = impl.FrameSplitter()
    complete = feed_all(splitter, [stream[:cut]])
    consumed = sum(4 + len(b) for b in complete)
    assert splitter.buffered == cut - consumed
    assert complete == bodies[: len(complete)]
