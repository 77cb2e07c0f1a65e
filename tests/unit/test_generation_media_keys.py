# SPDX-License-Identifier: Apache-2.0
"""Unique keys in generation media (scheduler-and-prep §7.2, test case 71): `messages`, each
message's `images` (and, newer than v0.7.1, `videos`), each entry's `data` and `format` may not
repeat. A plain msgpack decode keeps the last of a repeated key, so the generation path decodes with
`unpack_value`, whose maps remember their repeats; these tests decode real msgpack bytes the same way."""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import pytest

from sie_sidecar.errors import GenerateMediaError
from sie_sidecar.prep.generate_media import normalise_generate_images
from sie_sidecar.prep.media import unpack_value


class Raw(bytes):
    """msgpack bytes written into a document as they are."""


def packed(value: Any) -> bytes:
    return value if isinstance(value, Raw) else bytes(msgpack.packb(value, use_bin_type=True))


def raw_map(*pairs: tuple[Any, Any]) -> Raw:
    """A map written pair by pair, so keys may repeat (a dict can not say that)."""
    assert len(pairs) < 16
    return Raw(bytes([0x80 | len(pairs)]) + b"".join(packed(k) + packed(v) for k, v in pairs))


def raw_array(*values: Any) -> Raw:
    assert len(values) < 16
    return Raw(bytes([0x90 | len(values)]) + b"".join(packed(v) for v in values))


PNG = base64.b64encode(b"\x89PNG").decode()


def generate_with(message: Raw) -> Any:
    """A decoded `generate` value with one message, as the generation path decodes it."""
    return unpack_value(raw_map(("messages", raw_array(message)), ("max_new_tokens", 4)))


def one_message(*pairs: tuple[Any, Any]) -> Raw:
    """`{messages: [<a message written pair by pair>]}`."""
    return raw_map(("messages", raw_array(raw_map(*pairs))))


def one_entry(kind: str, *pairs: tuple[Any, Any]) -> Raw:
    """One message whose `kind` list holds one entry written pair by pair."""
    return one_message((kind, raw_array(raw_map(*pairs))))


@pytest.mark.parametrize(
    ("generate", "path"),
    [
        (raw_map(("messages", []), ("messages", [{"role": "user"}]), ("max_new_tokens", 4)), "generate.messages"),
        (one_message(("role", "user"), ("images", [{"data": PNG}]), ("images", [])), "generate.messages[0].images"),
        (one_message(("role", "user"), ("videos", None), ("videos", None)), "generate.messages[0].videos"),
        (one_entry("images", ("data", PNG), ("data", PNG)), "generate.messages[0].images[0].data"),
        (
            one_entry("images", ("data", PNG), ("format", "png"), ("format", None)),
            "generate.messages[0].images[0].format",
        ),
        (one_entry("videos", ("data", PNG), ("data", b"v")), "generate.messages[0].videos[0].data"),
    ],
)
def test_a_repeated_media_key_is_invalid_input_naming_its_path(generate: Raw, path: str) -> None:
    decoded = unpack_value(generate)
    with pytest.raises(GenerateMediaError) as caught:
        normalise_generate_images(decoded)
    assert str(caught.value) == f"{path}: duplicate field"


def test_a_str_and_a_bin_spelling_of_one_key_are_a_repeat() -> None:
    """As for extract media (§7.1): map keys may be str or UTF-8 bin, and both spellings are the field."""
    message = raw_map(("images", [{"data": PNG}]), (b"images", [{"data": PNG}]))
    with pytest.raises(GenerateMediaError, match=r"^generate\.messages\[0\]\.images: duplicate field$"):
        normalise_generate_images(generate_with(message))


def test_the_first_repeat_in_entry_order_is_the_one_reported() -> None:
    """The rules run entry by entry: the first image passes, the repeat in the second is the error."""
    good = raw_map(("data", PNG))
    twice = raw_map(("data", PNG), ("data", PNG))
    with pytest.raises(GenerateMediaError, match=r"images\[1\]\.data: duplicate field"):
        normalise_generate_images(generate_with(raw_map(("images", raw_array(good, twice)))))


def test_keys_the_rules_do_not_name_may_repeat_and_unique_media_is_normalised() -> None:
    """Only the keys §7.2 names must be unique; without repeats the maps are plain dicts (nothing is
    paid per map but the check) and the images are decoded to binary as before."""
    message = raw_map(
        ("role", "user"), ("role", "user"), ("images", raw_array(raw_map(("data", PNG), ("format", "png"))))
    )
    generate = generate_with(message)
    assert type(generate) is dict and type(generate["messages"][0]["images"][0]) is dict
    normalise_generate_images(generate)
    assert generate["messages"][0]["images"][0] == {"data": b"\x89PNG", "format": "png"}
    repeated_prompt = unpack_value(raw_map(("prompt", "a"), ("prompt", "b")))
    normalise_generate_images(repeated_prompt)  # not a media key: the last one stands, as msgpack decodes it
    assert repeated_prompt == {"prompt": "b"}
