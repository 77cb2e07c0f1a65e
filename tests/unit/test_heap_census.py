# SPDX-License-Identifier: Apache-2.0
"""The heap census finds a planted leak: its allocation site, its block count and its type."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from benches.heap_census import Censor, _own_frame_first, _short, censuses, diff, report


class PlantedLeak:
    """A type no other code makes, so its count in the census is the plant's alone."""

    def __init__(self, n: int) -> None:
        self.payload = [n, str(n)]


HELD: list[PlantedLeak] = []


def plant(n: int) -> None:
    HELD.extend(PlantedLeak(k) for k in range(n))


@pytest.fixture
def tracing() -> Iterator[None]:
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start(8)
    try:
        yield
    finally:
        HELD.clear()
        if not was_tracing:
            tracemalloc.stop()


def test_diff_names_the_leaking_site_and_type(tracing: None, tmp_path: Path) -> None:
    censor = Censor(tmp_path)
    censor.take()
    plant(2_000)
    censor.take()
    first, last = censuses(tmp_path)
    assert (first.name, last.name) == ("census-000", "census-001")

    result = diff(first, last)

    assert result.blocks[1] - result.blocks[0] >= 2_000
    top = result.sites[0]
    assert top.count_diff >= 2_000
    assert any(frame.startswith("test_heap_census.py:") for frame in top.frames)
    assert ("PlantedLeak", 2_000, 2_000) in result.types
    text = report(tmp_path)
    assert "PlantedLeak" in text and "test_heap_census.py" in text


def test_nothing_planted_shows_no_planted_type(tracing: None, tmp_path: Path) -> None:
    censor = Censor(tmp_path)
    censor.take()
    censor.take()
    result = diff(*censuses(tmp_path))
    assert all(name != "PlantedLeak" for name, _, _ in result.types)
    assert all(site.count_diff < 2_000 for site in result.sites)


def test_a_single_census_is_reported_as_not_enough(tmp_path: Path) -> None:
    assert "need 2" in report(tmp_path)


def test_frames_are_cut_after_the_first_frame_of_the_package() -> None:
    frames = ["events.py:10", "streams.py:5", "sie_sidecar/pipeline/feed.py:88", "sie_sidecar/app.py:3"]
    assert _own_frame_first(frames) == frames[:3]
    foreign = ["a.py:1", "b.py:2", "c.py:3", "d.py:4", "e.py:5"]
    assert _own_frame_first(foreign) == foreign[:4]
    assert _short("/x/.venv/lib/python3.11/site-packages/sie_sidecar/bus/pull.py") == "sie_sidecar/bus/pull.py"
    assert _short("/usr/lib/python3.11/asyncio/events.py") == "events.py"


def test_objects_a_native_loop_callback_made_are_named_by_type(tracing: None, tmp_path: Path) -> None:
    """No Python frame names what a C or Rust callable the loop ran allocated; the census still finds
    those objects (as referents: the collector does not track strings) and shows their type. Strings,
    not tuples: a tuple from the free list keeps the traceback of its first allocation."""
    made: list[str] = []
    names = [f"subject-{k}" for k in range(300)]

    async def plant_by_callback() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.call_soon(made.extend, map(str.upper, names))  # the strings are made inside C code
        loop.call_soon(done.set_result, None)
        await done

    censor = Censor(tmp_path)
    censor.take()
    asyncio.run(plant_by_callback())
    censor.take()
    result = diff(*censuses(tmp_path))
    strings = next(row for row in result.made_by_callbacks if row[0] == "str")
    assert strings[1] >= 300 and "SUBJECT-" in strings[3]
