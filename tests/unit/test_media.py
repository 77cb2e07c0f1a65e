# SPDX-License-Identifier: Apache-2.0
"""Extract media checks (scheduler-and-prep §7.1, §7.3 envelope and size; test cases 67-70)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.prep.media import (
    MAX_AUDIO_BYTES,
    MAX_MEDIA_BYTES,
    DupDict,
    MediaError,
    check_extract_item,
    check_extract_work_item,
    unpack_value,
    validate_audio,
    validate_extract_media,
)
from sie_sidecar.wire.workitem import WorkItem

MiB = 1024 * 1024


def img(data: Any = b"\x89PNG", fmt: Any = "png") -> dict[str, Any]:
    return {"data": data, "format": fmt}


def invalid(message: str) -> MediaError:
    return MediaError("INVALID_INPUT", message)


def raw_map(*pairs: tuple[Any, Any]) -> bytes:
    """A msgpack map written pair by pair, so keys may repeat (a dict can not say that)."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)


# -- §7.1 images and document -------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    [
        {"text": "no media"},
        {"images": None, "document": None},
        {"images": []},
        {"images": [img(), img(b"x", None), {"data": b"y"}], "document": img(b"%PDF", "pdf")},
        {"images": [img(fmt="unknown-hint")], "extra": {"kept": True}},
        {b"images": [img()], b"document": img()},  # UTF-8 bin keys
        {"images": [img()] * 16},
    ],
)
def test_accepted_items(item: Any) -> None:
    before = repr(item)
    assert validate_extract_media(item) is None
    assert repr(item) == before  # nothing is rewritten: unknown fields and hints are kept


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("text", "item must be a map"),
        (None, "item must be a map"),
        ([img()], "item must be a map"),
        ({"images": [img()], b"images": []}, "item.images: duplicate field"),
        ({"document": img(), b"document": img()}, "item.document: duplicate field"),
        ({"images": img()}, "item.images must be an array"),
        ({"images": "abc"}, "item.images must be an array"),
        ({"images": [img()] * 17}, "item.images: too many images (17, limit 16)"),
        ({"images": [img(), b"raw"]}, "item.images[1] must be a map"),
        ({"document": b"%PDF"}, "item.document must be a map"),
        ({"images": [{"data": b"a", b"data": b"b"}]}, "item.images[0].data: duplicate field"),
        ({"images": [{"data": b"a", "format": "png", b"format": "png"}]}, "item.images[0].format: duplicate field"),
        ({"images": [img("iVBORw0KGgo=")]}, "item.images[0].data must be non-empty binary"),
        ({"images": [img(b"")]}, "item.images[0].data must be non-empty binary"),
        ({"images": [{"format": "png"}]}, "item.images[0].data must be non-empty binary"),
        ({"document": {"data": None}}, "item.document.data must be non-empty binary"),
        ({"images": [img(fmt=5)]}, "item.images[0].format must be a string or null"),
        ({"document": img(fmt=b"pdf")}, "item.document.format must be a string or null"),
    ],
)
def test_refused_items(item: Any, message: str) -> None:
    assert validate_extract_media(item) == invalid(message)


def test_aggregate_limit_reports_the_running_total() -> None:
    """Case 69: 8 MiB + 1 then 8 MiB is 16 MiB + 1, one byte over."""
    half = MAX_MEDIA_BYTES // 2
    item = {"images": [img(b"a" * (half + 1))], "document": img(b"b" * half)}
    assert validate_extract_media(item) == invalid(
        f"item media too large: {MAX_MEDIA_BYTES + 1} bytes (limit 16777216)"
    )
    exact = {"images": [img(b"a" * half)], "document": img(b"b" * half)}
    assert validate_extract_media(exact) is None


def test_aggregate_limit_stops_at_the_first_image_over() -> None:
    big = b"z" * (6 * MiB)
    result = validate_extract_media({"images": [img(big), img(big), img(big), img("not even checked")]})
    assert result == invalid(f"item media too large: {18 * MiB} bytes (limit 16777216)")


@given(st.lists(st.integers(min_value=1, max_value=64), max_size=20))
def test_image_count_rule(sizes: list[int]) -> None:
    result = validate_extract_media({"images": [img(b"p" * n) for n in sizes]})
    assert (result is None) == (len(sizes) <= 16)


# -- duplicate keys survive the payload decode ----------------------------------------------------


def test_unpack_value_remembers_repeated_keys_of_fetched_items() -> None:
    blob = raw_map(("images", [img()]), ("images", [img()]))
    value = unpack_value(blob)
    assert isinstance(value, DupDict) and value.duplicate_keys == frozenset({"images"})
    assert value == {"images": [img()]}
    assert validate_extract_media(value) == invalid("item.images: duplicate field")

    inner = raw_map(("data", b"a"), ("data", b"b"))
    blob = raw_map(("images", []))[:-1] + b"\x91" + inner  # {"images": [<inner>]}
    assert validate_extract_media(unpack_value(blob)) == invalid("item.images[0].data: duplicate field")


def test_unpack_value_gives_plain_dicts_without_repeats_and_repacks_identically() -> None:
    value = unpack_value(msgpack.packb({"images": [img()], "n": [1, 2]}))
    assert type(value) is dict and type(value["images"][0]) is dict
    dup = unpack_value(raw_map(("a", 1), ("a", 2)))
    assert msgpack.unpackb(msgpack.packb(dup)) == {"a": 2}  # still packs as a map


# -- §7.3 audio envelope and compressed size ------------------------------------------------------


def audio_error(message: str) -> MediaError:
    return MediaError("invalid_request", message)


@pytest.mark.parametrize(
    "item",
    [
        {"text": "x"},
        {"audio": None},
        {"audio": {"data": b"RIFF"}},
        {"audio": {"data": b"RIFF", "format": "wav", "sample_rate": 16000}},
        {"audio": {b"data": b"RIFF", b"format": None, b"sample_rate": None}},
        {"audio": {"data": b"R", "format": "x" * 32, "sample_rate": 2**32 - 1}},
        "not a map: audio passes it through",
    ],
)
def test_audio_accepted(item: Any) -> None:
    assert validate_audio(item) is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"audio": {"data": b"a"}, b"audio": None}, "item.audio: duplicate field"),
        ({"audio": b"RIFF"}, "item.audio must be a map"),
        ({"audio": {"data": b"a", "channels": 2}}, "item.audio: unknown field"),
        ({"audio": {"data": b"a", "X" * 10_000: 1}}, "item.audio: unknown field"),
        ({"audio": {"data": b"a", b"\xff": 1}}, "item.audio: unknown field"),
        ({"audio": {"data": b"a", b"data": b"b"}}, "item.audio.data: duplicate field"),
        ({"audio": {}}, "item.audio.data is required"),
        ({"audio": {"data": None}}, "item.audio.data is required"),
        ({"audio": {"data": "UklGRg=="}}, "item.audio.data must be binary"),
        ({"audio": {"data": b""}}, "item.audio.data is empty"),
        (
            {"audio": {"data": b"a", "format": "x" * 33}},
            "item.audio.format must be a string of at most 32 bytes or null",
        ),
        (
            {"audio": {"data": b"a", "format": "é" * 17}},
            "item.audio.format must be a string of at most 32 bytes or null",
        ),
        ({"audio": {"data": b"a", "format": 3}}, "item.audio.format must be a string of at most 32 bytes or null"),
        (
            {"audio": {"data": b"a", "sample_rate": 0}},
            "item.audio.sample_rate must be a positive integer that fits u32, or null",
        ),
        (
            {"audio": {"data": b"a", "sample_rate": 2**32}},
            "item.audio.sample_rate must be a positive integer that fits u32, or null",
        ),
        (
            {"audio": {"data": b"a", "sample_rate": True}},
            "item.audio.sample_rate must be a positive integer that fits u32, or null",
        ),
        (
            {"audio": {"data": b"a", "sample_rate": 16000.0}},
            "item.audio.sample_rate must be a positive integer that fits u32, or null",
        ),
    ],
)
def test_audio_refused(item: Any, message: str) -> None:
    assert validate_audio(item) == audio_error(message)
    assert "X" * 20 not in message  # an unknown key is never echoed


def test_audio_compressed_limit_is_24_mib() -> None:
    assert validate_audio({"audio": {"data": b"\0" * MAX_AUDIO_BYTES}}) is None
    assert validate_audio({"audio": {"data": b"\0" * (MAX_AUDIO_BYTES + 1)}}) == audio_error(
        f"item.audio.data too large: {MAX_AUDIO_BYTES + 1} bytes (limit 25165824)"
    )


def test_audio_does_not_count_against_the_image_budget() -> None:
    item = {"images": [img(b"i" * MAX_MEDIA_BYTES)], "audio": {"data": b"\0" * (20 * MiB)}}
    assert check_extract_item(item) is None


# -- one item, both rule sets, and the offloaded case ---------------------------------------------


def test_images_are_checked_before_audio() -> None:
    item = {"images": "bad", "audio": {"data": b""}}
    assert check_extract_item(item) == invalid("item.images must be an array")
    assert check_extract_item({"images": [], "audio": {"data": b""}}) == audio_error("item.audio.data is empty")


def extract(**fields: Any) -> WorkItem:
    return WorkItem(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        total_items=1,
        operation="extract",
        model_id="m",
        pool_name="p",
        machine_profile="l4",
        reply_subject="_INBOX.gw.r",
        **fields,
    )


def test_offloaded_item_is_checked_only_after_its_fetch() -> None:
    assert check_extract_work_item(extract(payload_ref="r_0.bin")) is None  # item is nil until fetched
    assert check_extract_work_item(extract()) == invalid("item must be a map")
    fetched = extract(item=unpack_value(msgpack.packb({"images": [img()] * 17})))
    assert check_extract_work_item(fetched) == invalid("item.images: too many images (17, limit 16)")
    assert check_extract_work_item(extract(item={"images": [img()]})) is None


def test_batch_of_mixed_items_fails_only_the_bad_ones() -> None:
    items = [
        extract(item={"images": [img()]}),
        extract(item={"images": [img(b"")]}),
        extract(item={"audio": {"data": b"RIFF", "bogus": 1}}),
        extract(item={"document": img(b"%PDF")}),
    ]
    results = [check_extract_work_item(w) for w in items]
    assert results == [
        None,
        invalid("item.images[0].data must be non-empty binary"),
        audio_error("item.audio: unknown field"),
        None,
    ]
