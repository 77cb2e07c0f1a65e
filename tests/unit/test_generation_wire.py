# SPDX-License-Identifier: Apache-2.0
"""The generation envelopes the sidecar writes (wire-protocol §5, §7.2, §7.4): test vectors TV-G1
and TV-G2 byte for byte, the sidecar's WorkItem order, the GenerateEvent decode, image rules."""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.errors import DecodeError, GenerateMediaError
from sie_sidecar.ipc.types import GenerateEvent
from sie_sidecar.prep.generate_media import MAX_IMAGE_BYTES, MAX_IMAGES, normalise_generate_images
from sie_sidecar.wire.generation import (
    EXECUTED_HASH_KEY,
    SIDECAR_ORDER,
    encode_sidecar_work_item,
    stamp_executed_hash,
    terminal_chunk,
)

TV_G1 = (
    "88a46b696e64a56368756e6baa726571756573745f6964a87265712d6c6f6164aa617474656d70745f6964b87265712d6c6f61"
    "642e303a6d6f64656c2d6c6f6164696e67a373657100aa746578745f64656c7461a0a4646f6e65c3ad66696e6973685f7265"
    "61736f6ea56572726f72a56572726f7282a4636f6465ad4d4f44454c5f4c4f4144494e47a76d657373616765a76c6f616469"
    "6e67"
)
TV_G2_IN = (
    "86a46b696e64a56368756e6baa726571756573745f6964a57265712d31aa617474656d70745f6964a9617474656d70742d31"
    "a373657101aa746578745f64656c7461a4646f6e65a4646f6e65c3"
)
TV_G2_OUT = TV_G2_IN.replace("86", "87", 1) + "bb65786563757465645f62756e646c655f636f6e6669675f68617368a6686173682d61"


def test_tv_g1_terminal_chunk() -> None:
    chunk = terminal_chunk("req-load.0", "req-load", "MODEL_LOADING", "loading")
    assert chunk.hex() == TV_G1 and len(chunk) == 153


def test_tv_g2_executed_hash_stamping() -> None:
    assert stamp_executed_hash(bytes.fromhex(TV_G2_IN), "hash-a").hex() == TV_G2_OUT
    assert stamp_executed_hash(bytes.fromhex(TV_G2_IN), "") == bytes.fromhex(TV_G2_IN)  # untouched


def test_stamping_replaces_an_earlier_hash_and_refuses_non_maps() -> None:
    stamped = stamp_executed_hash(msgpack.packb({EXECUTED_HASH_KEY: "old", "seq": 1}), "new")
    assert list(msgpack.unpackb(stamped).items()) == [("seq", 1), (EXECUTED_HASH_KEY, "new")]
    for bad in (msgpack.packb([1, 2]), b"\xc1", b""):
        with pytest.raises(DecodeError):
            stamp_executed_hash(bad, "h")


@given(st.binary(max_size=64))
def test_stamping_any_bytes_stamps_a_map_or_raises_the_typed_error(data: bytes) -> None:
    try:
        out = stamp_executed_hash(data, "h")
    except DecodeError:
        return
    assert list(msgpack.unpackb(out, strict_map_key=False))[-1] == EXECUTED_HASH_KEY


def test_the_sidecar_order_writes_32_keys_with_nils_and_drops_unknown_keys() -> None:
    doc = {"reply_subject": "_INBOX.gw.r", "request_id": "r", "unknown": 1, "admission_pool": None, "deadline": 9.5}
    decoded = msgpack.unpackb(encode_sidecar_work_item(doc))
    assert list(decoded) == [key for key, _ in SIDECAR_ORDER] + ["deadline"]
    assert len(SIDECAR_ORDER) == 32
    assert decoded["admission_pool"] == "" and decoded["generate"] is None and "unknown" not in decoded
    assert decoded["reply_subject"] == "_INBOX.gw.r" and decoded["timestamp"] == 0.0


def test_a_generate_event_defaults_and_types() -> None:
    assert GenerateEvent.from_body({"kind": "done"}) == GenerateEvent(kind="done")
    event = GenerateEvent.from_body({"kind": "nak", "delay_ms": 250, "payload": None, "reply_subject": None})
    assert (event.delay_ms, event.payload, event.reply_subject) == (250, b"", "")
    for bad in ({}, {"kind": 1}, {"kind": "publish", "payload": "text"}, {"kind": "nak", "delay_ms": -1}):
        with pytest.raises(DecodeError):
            GenerateEvent.from_body(bad)


def messages(*images: list[dict[str, Any]]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "x", "images": list(group)} for group in images]}


def test_base64_images_become_binary_and_binary_stays() -> None:
    generate = messages([{"data": base64.b64encode(b"png!").decode()}, {"data": b"raw"}])
    normalise_generate_images(generate)
    assert [i["data"] for i in generate["messages"][0]["images"]] == [b"png!", b"raw"]
    normalise_generate_images({"prompt": "no messages"})  # nothing to do


@pytest.mark.parametrize(
    "generate",
    [
        messages([{"data": "not base64!"}]),
        messages([{"data": 5}]),
        messages(["image"]),  # type: ignore[list-item]
        messages(*[[{"data": b"x"}] for _ in range(MAX_IMAGES + 1)]),
        messages([{"data": b"x" * (MAX_IMAGE_BYTES // 2 + 1)}], [{"data": b"y" * (MAX_IMAGE_BYTES // 2)}]),
    ],
)
def test_images_breaking_a_rule_are_invalid_input(generate: dict[str, Any]) -> None:
    with pytest.raises(GenerateMediaError):
        normalise_generate_images(generate)


def test_a_video_is_normalised_like_an_image_and_shares_the_budget() -> None:
    """scheduler-and-prep §7.2 (newer than v0.7.1): `videos` follow the image rules, at most one per
    request, in the same 16 MiB of decoded bytes."""
    video = {"data": base64.b64encode(b"mp4!").decode(), "format": "mp4"}
    generate: dict[str, Any] = {"messages": [{"role": "user", "videos": [video]}]}
    normalise_generate_images(generate)
    assert generate["messages"][0]["videos"][0]["data"] == b"mp4!"
    two = {"messages": [{"videos": [{"data": b"a"}]}, {"videos": [{"data": b"b"}]}]}
    with pytest.raises(GenerateMediaError, match=r"generate\.messages\[1\]\.videos\[0\]: at most 1 videos"):
        normalise_generate_images(two)
    shared = {"messages": [{"images": [{"data": b"x" * (MAX_IMAGE_BYTES - 2)}], "videos": [{"data": b"yyy"}]}]}
    with pytest.raises(GenerateMediaError, match="decoded bytes"):
        normalise_generate_images(shared)
    with pytest.raises(GenerateMediaError, match=r"generate\.messages\[0\]\.videos must be an array"):
        normalise_generate_images({"messages": [{"videos": "clip"}]})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"data": "  "}, "generate.messages[0].images[0].data is empty"),
        ({"data": b""}, "generate.messages[0].images[0].data is empty"),
        ({"format": 3, "data": b"x"}, "generate.messages[0].images[0].format must be a string"),
        ({"format": "png"}, "generate.messages[0].images[0].data is required"),
        ({"data": "!!!!"}, "generate.messages[0].images[0].data is not valid base64"),
    ],
)
def test_errors_name_the_field_path_and_never_the_data(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(GenerateMediaError) as caught:
        normalise_generate_images({"messages": [{"images": [entry]}]})
    assert str(caught.value) == message


def test_base64_is_trimmed_and_a_too_long_string_is_refused_before_decoding() -> None:
    generate: dict[str, Any] = {"messages": [{"images": [{"data": "  " + base64.b64encode(b"ok").decode() + "\n"}]}]}
    normalise_generate_images(generate)
    assert generate["messages"][0]["images"][0]["data"] == b"ok"
    huge = "A" * ((MAX_IMAGE_BYTES // 3 + 1) * 4)
    with pytest.raises(GenerateMediaError, match="exceeds"):
        normalise_generate_images({"messages": [{"images": [{"data": huge}]}]})


TV_W1 = bytes.fromhex(
    "89ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f6964a57265712d31aa6974656d5f696e64657800ab"
    "746f74616c5f6974656d7301a96f7065726174696f6ea6656e636f6465a86d6f64656c5f6964ab424141492f6267652d6d33a970"
    "6f6f6c5f6e616d65a764656661756c74af6d616368696e655f70726f66696c65a26c34ad7265706c795f7375626a656374af5f49"
    "4e424f582e67772e7265712d31"
)
TV_W2 = bytes.fromhex(
    "de0020ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f6964a57265712d31aa6974656d5f696e646578"
    "00ab746f74616c5f6974656d7301a96f7065726174696f6ea6656e636f6465a86d6f64656c5f6964ab424141492f6267652d6d33"
    "aa70726f66696c655f6964a0a6656e67696e65a0a9706f6f6c5f6e616d65a764656661756c74ae61646d697373696f6e5f706f6f"
    "6ca0af6d616368696e655f70726f66696c65a26c34a46974656dc0ab7061796c6f61645f726566c0ac6f75747075745f74797065"
    "73c0ab696e737472756374696f6ec0a869735f7175657279c2a76f7074696f6e73c0aa71756572795f6974656dc0b17175657279"
    "5f7061796c6f61645f726566c0ab73636f72655f6974656d73c0a66c6162656c73c0ad6f75747075745f736368656d61c0a86765"
    "6e6572617465c0ab726f7574696e675f6b6579c0b070726f6d70745f63616368655f6b6579c0b262756e646c655f636f6e666967"
    "5f68617368a0a9726f757465725f6964a0b5616363657074735f726573756c745f6368756e6b73c2ad7265706c795f7375626a65"
    "6374af5f494e424f582e67772e7265712d31ab7472616365706172656e74c0aa74726163657374617465c0a974696d657374616d"
    "70cb0000000000000000"
)


def test_tv_w2_the_sidecar_re_encoding_of_tv_w1_byte_for_byte() -> None:
    """TV-W2: 32 keys in the sidecar's order, defaults written, `admission_pool` present, a float64
    timestamp, unknown keys dropped; 478 bytes."""
    assert len(TV_W2) == 478
    assert encode_sidecar_work_item(msgpack.unpackb(TV_W1)) == TV_W2
    with_unknown = msgpack.unpackb(TV_W1) | {"display_model": "x", "no_such_key": 1}
    assert encode_sidecar_work_item(with_unknown) == TV_W2


@pytest.mark.parametrize("generate", ["prompt", [1], 5])
def test_a_generate_value_that_is_not_a_map_is_invalid_input(generate: Any) -> None:
    """scheduler-and-prep §7.2: `generate` must be a map (absent is left to the backend)."""
    with pytest.raises(GenerateMediaError, match=r"^generate must be a map$"):
        normalise_generate_images(generate)
    normalise_generate_images(None)
