# SPDX-License-Identifier: Apache-2.0
"""`FrameReader`: socket reads go straight into the reader's blocks and each body is a view of the
block it arrived in (wire-protocol §1.1 framing; the zero-copy receive of issue 32)."""

from __future__ import annotations

import gc
import itertools
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar import errors


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def read(reader: object, data: bytes) -> list[memoryview]:
    """One socket read of `data` (at most the window's length) into the reader."""
    window = memoryview(reader.read_window())  # type: ignore[attr-defined]
    assert not window.readonly
    n = min(len(data), len(window))
    window[:n] = data[:n]
    del window
    return list(reader.window_filled(n))  # type: ignore[attr-defined]


def read_stream(reader: object, stream: bytes, sizes: list[int]) -> list[memoryview]:
    """All of `stream`, in reads of the given sizes (cycled; each also capped by the window)."""
    views: list[memoryview] = []
    pos = 0
    for size in itertools.cycle(sizes or [len(stream) or 1]):
        if pos >= len(stream):
            break
        window = memoryview(reader.read_window())  # type: ignore[attr-defined]
        n = max(1, min(size, len(window), len(stream) - pos))
        window[:n] = stream[pos : pos + n]
        del window
        pos += n
        views.extend(reader.window_filled(n))  # type: ignore[attr-defined]
    return views


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=150)
@given(
    bodies=st.lists(st.binary(max_size=3000), max_size=20),
    sizes=st.lists(st.integers(min_value=1, max_value=5000), max_size=8),
    block=st.sampled_from([16, 1024, 4096, 256 << 10]),
)
def test_any_read_sizes_give_the_bodies_and_held_bodies_never_change(
    impl: ModuleType, bodies: list[bytes], sizes: list[int], block: int
) -> None:
    """Every body is held to the end, so reads keep landing beside (or away from) live views."""
    reader = impl.FrameReader(1 << 20, block)
    stream = b"".join(frame(b) for b in bodies)
    views = read_stream(reader, stream, sizes)
    assert [bytes(v) for v in views] == bodies
    assert reader.buffered == 0
    for view in views:
        assert view.readonly


def test_bodies_outlive_later_reads_into_a_reused_block(impl: ModuleType) -> None:
    """A body dropped frees its block for reuse; a body still held is never written over."""
    reader = impl.FrameReader(1 << 20, 4096)
    kept = []
    for i in range(50):
        body = bytes([i]) * (100 + 37 * i % 3000)
        (view,) = read_stream(reader, frame(body), [1 << 20])
        if i % 7 == 0:
            kept.append((view, body))
        del view
        gc.collect()
    for view, body in kept:
        assert bytes(view) == body


def test_a_frame_larger_than_a_block_arrives_whole(impl: ModuleType) -> None:
    reader = impl.FrameReader(1 << 20, 1024)
    body = bytes(range(256)) * 200
    views = read_stream(reader, frame(body) + frame(b"after"), [700])
    assert [bytes(v) for v in views] == [body, b"after"]


def test_a_declared_length_over_the_ceiling_fails_and_stays_failed(impl: ModuleType) -> None:
    reader = impl.FrameReader(100, 1024)
    assert read(reader, frame(b"x" * 100)) and reader.buffered == 0
    with pytest.raises(errors.FrameTooLarge):
        read(reader, (101).to_bytes(4, "big"))
    with pytest.raises(errors.FrameTooLarge):
        reader.read_window()


def test_window_filled_needs_a_window_and_at_most_its_length(impl: ModuleType) -> None:
    reader = impl.FrameReader(100, 1024)
    with pytest.raises(ValueError, match="without a read_window"):
        reader.window_filled(1)
    window = reader.read_window()
    with pytest.raises(ValueError, match="byte window"):
        reader.window_filled(len(window) + 1)
    with pytest.raises(ValueError, match="without a read_window"):
        reader.window_filled(0)


def test_a_partial_header_and_body_are_counted_as_buffered(impl: ModuleType) -> None:
    reader = impl.FrameReader()
    assert read(reader, frame(b"abcdef")[:2]) == [] and reader.buffered == 2
    assert read(reader, frame(b"abcdef")[2:7]) == [] and reader.buffered == 7
    assert [bytes(v) for v in read(reader, frame(b"abcdef")[7:] + frame(b""))] == [b"abcdef", b""]
    assert reader.buffered == 0


def test_a_block_whose_bodies_are_gone_is_read_into_again_and_nothing_moves() -> None:
    """The steady state of an IPC connection: each response decoded and dropped before the next
    arrives keeps one block, read from its start, with no frame moved (no copy in user space)."""
    from sie_sidecar.wire._native_api import FrameReader

    reader = FrameReader(1 << 20, 4096)
    for i in range(100):
        body = bytes([i]) * (500 + 31 * i)
        (view,) = read_stream(reader, frame(body), [1 << 20])
        assert bytes(view) == body
        del view
    assert reader.stats == {"windows": 100, "moves": 0, "moved_bytes": 0, "blocks_made": 1}


def test_held_bodies_make_new_blocks_but_only_the_cut_frame_moves() -> None:
    from sie_sidecar.wire._native_api import FrameReader

    reader = FrameReader(1 << 20, 4096)
    stream = b"".join(frame(bytes([i]) * 1000) for i in range(40))
    views = read_stream(reader, stream, [1 << 20])
    assert [bytes(v) for v in views] == [bytes([i]) * 1000 for i in range(40)]
    stats = reader.stats
    # ~4 bodies a block: each cut frame moved its received part once, to a block of its own.
    assert 8 <= stats["blocks_made"] <= 12 and stats["moves"] == stats["blocks_made"] - 1
    assert stats["moved_bytes"] < stats["moves"] * 1004


def test_a_filled_window_can_not_be_exported_again() -> None:
    """Its bytes may be frames now: a late writer gets no buffer over them."""
    from sie_sidecar.wire._native_api import FrameReader

    reader = FrameReader(1 << 20, 4096)
    window = reader.read_window()
    memoryview(window)[:9] = frame(b"hello")
    (body,) = reader.window_filled(9)
    with pytest.raises(BufferError, match="filled already"):
        memoryview(window)
    assert bytes(body) == b"hello"
    assert len(memoryview(reader.read_window())) == 4096 - 9  # the next window is fine
