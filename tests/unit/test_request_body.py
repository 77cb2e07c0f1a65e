# SPDX-License-Identifier: Apache-2.0
"""`RequestBody`: a RunBatch body written with room in front for its IPC envelope, so its first
request frame is the body's own memory (wire-protocol §2.1's request envelope, body last), and
every later frame of it is a copy that leaves the first one as it was."""

from __future__ import annotations

import gc

import msgpack
import pytest

from sie_sidecar._native import RequestBody, encode_request, write_run_batch_body
from sie_sidecar._native import decode_work_item as decode_native
from sie_sidecar.wire.workitem import WorkItem

ROOM_FITS = "w-" + "9" * 46  # a 48-character request id: the longest the room takes
TOO_LONG = "w-" + "9" * 47


def items(n: int) -> list[WorkItem]:
    payloads = [
        msgpack.packb(
            {
                "work_item_id": f"r.{i}",
                "request_id": "r",
                "item_index": i,
                "total_items": n,
                "operation": "encode",
                "model_id": "m",
                "pool_name": "default",
                "machine_profile": "l4",
                "reply_subject": "_INBOX.gw.r",
                "item": {"text": "x" * i},
            },
            use_bin_type=True,
        )
        for i in range(n)
    ]
    return [decode_native(p, cls=WorkItem) for p in payloads]


def write(n: int = 3) -> tuple[RequestBody, bytes]:
    args = ("m", "encode", "", n, 1, items(n))
    return write_run_batch_body(*args, room=True), write_run_batch_body(*args)


def test_the_first_frame_is_a_read_only_view_equal_to_the_copied_frame() -> None:
    request, body = write()
    frame = encode_request("RunBatch", "w-1", request, True)
    assert isinstance(frame, memoryview) and frame.readonly
    assert frame.tobytes() == encode_request("RunBatch", "w-1", body, True)
    with pytest.raises(TypeError):
        frame[0] = 0


def test_a_second_frame_is_a_copy_and_the_first_is_unchanged() -> None:
    """A body framed again (another request id) must not rewrite a frame that may still be queued
    on a transport: the room is written once."""
    request, body = write()
    first = encode_request("RunBatch", "w-1", request, True)
    second = encode_request("RunBatch", "w-2", request, False)
    assert isinstance(second, bytes)
    assert second == encode_request("RunBatch", "w-2", body, False)
    assert bytes(first) == encode_request("RunBatch", "w-1", body, True)
    assert bytes(request) == body


def test_an_id_longer_than_the_room_is_framed_by_a_copy_and_leaves_the_room() -> None:
    request, body = write()
    copied = encode_request("RunBatch", TOO_LONG, request, True)
    assert isinstance(copied, bytes) and copied == encode_request("RunBatch", TOO_LONG, body, True)
    in_place = encode_request("RunBatch", ROOM_FITS, request, True)
    assert isinstance(in_place, memoryview)
    assert in_place.tobytes() == encode_request("RunBatch", ROOM_FITS, body, True)


def test_the_frame_outlives_its_body_object() -> None:
    request, body = write(40)
    frame = encode_request("RunBatch", "w-7", request, True)
    del request
    gc.collect()
    assert bytes(frame) == encode_request("RunBatch", "w-7", body, True)


def test_the_body_is_a_read_only_buffer_that_decodes() -> None:
    request, body = write()
    view = memoryview(request)
    assert view.readonly and view.tobytes() == body
    assert msgpack.unpackb(request)["model_id"] == "m"


def test_an_empty_batch_frames_in_place() -> None:
    request, body = write(0)
    frame = encode_request("RunBatch", "w-1", request, True)
    assert bytes(frame) == encode_request("RunBatch", "w-1", body, True)


def test_a_large_batch_after_small_ones_is_written_whole() -> None:
    """The writer sizes its buffer from the last batch's bytes per item: a much larger batch grows
    it and loses nothing."""
    write(1)
    args = ("m", "encode", "", 1, 1, items(200))
    request = write_run_batch_body(*args, room=True)
    assert bytes(request) == write_run_batch_body(*args)
    assert len(msgpack.unpackb(request)["items"]) == 200
