# SPDX-License-Identifier: Apache-2.0
"""`LazyDelivery` (issue 10): the native intake keeps a WorkItem in its payload, and everything that
reads it in place (the intake verdict, the RunBatch writer, the reply framer) gives exactly what the
decoded WorkItem gives; reading `.item` decodes it once, and from then on the WorkItem is the truth."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar._native import LazyDelivery, frame_batch_response, intake_batch, write_run_batch_body
from sie_sidecar._twins.intake import intake_batch as intake_batch_py
from sie_sidecar.backend.adapter import item_outcome
from sie_sidecar.pipeline.delivery import Delivery
from sie_sidecar.pipeline.intake import Intake
from sie_sidecar.wire.workitem import WorkItem, decode_work_item

from ..fuzz.strategies import mutated
from .test_run_batch_body import BASE, _args, _loose, batches, payload_maps

pytestmark = pytest.mark.skipif(not wire.USING_NATIVE, reason="LazyDelivery is the extension's")

SUBJECT = wire.pool_work_subject("default", "l4", "b", str(BASE["model_id"]))


class Msg:
    def __init__(self, data: bytes, subject: str = SUBJECT) -> None:
        self.subject, self.data, self.reply = subject, data, "$JS.ACK.pool.c.1.2.3.4.0"


def intake(payloads: list[bytes], *, lazy: bool = True) -> list[Any]:
    """One delivery per payload, in order, whatever its verdict."""
    found = intake_batch([Msg(p) for p in payloads], Intake()._subject_info, Delivery, WorkItem, None, lazy)
    assert found is not None
    groups, naks, drops, _, _ = found
    by_msg = {id(d.msg.data): d for d in [*naks, *drops, *(d for ds in groups.values() for d in ds)]}
    return [by_msg[id(p)] for p in payloads]


def test_a_plain_payload_stays_undecoded_until_its_item_is_read() -> None:
    payload = msgpack.packb(BASE | {"item": {"text": "hi"}, "bundle_config_hash": "h1"})
    (d,) = intake([payload])
    assert isinstance(d, LazyDelivery)
    assert d.wire_item is d and d.bundle_config_hash == "h1"
    item = d.item
    assert item == decode_work_item(payload) and d.item is item  # decoded once
    assert d.wire_item is item  # from now on the WorkItem (it may be edited) is what is written
    d.item = None
    assert d.item is None


def test_settlement_state_is_read_and_written_like_the_dataclass() -> None:
    (d,) = intake([msgpack.packb(BASE)])
    assert (d.settled, d.payload_fetch_ms, d.prepared_tokens, d.prepared_audio, d.worker_direct) == (
        False,
        0.0,
        None,
        None,
        False,
    )
    d.settled, d.payload_fetch_ms, d.prepared_tokens = True, 2.5, {"input_ids": [[1]]}
    assert (d.settled, d.payload_fetch_ms, d.prepared_tokens) == (True, 2.5, {"input_ids": [[1]]})


@settings(max_examples=150, deadline=None)
@given(
    data=st.one_of(mutated(msgpack.packb(BASE | {"item": {"text": "x"}, "options": {"a": 1}})), st.binary(max_size=40))
)
def test_a_payload_is_kept_in_place_only_when_the_decoder_accepts_it(data: bytes) -> None:
    """`parse` may refuse more than the decoder (then the decoder decides), never less: every lazy
    delivery's payload decodes, and its verdict is the eager intake's."""
    (d,) = intake([data])
    (eager,) = intake([data], lazy=False)
    assert type(d.model) is type(eager.model) and d.model == eager.model  # accepted / refused alike
    assert d.item == eager.item
    if isinstance(d, LazyDelivery):
        assert decode_work_item(data) == eager.item


@settings(max_examples=120, deadline=None)
@given(b=batches(), loose=st.booleans())
def test_the_run_batch_body_of_undecoded_items_is_the_decoded_items_body(b: dict[str, Any], loose: bool) -> None:
    payloads = [_loose(m) if loose else msgpack.packb(m, use_bin_type=True) for m in b["maps"]]
    ds = intake(payloads)
    args = _args(b)
    expected = write_run_batch_body(
        args["model"], args["op"], args["lora"], args["cost"], args["batch_id"],
        [decode_work_item(p) for p in payloads], args["fetch"], args["tokens"], args["audio"],
    )  # fmt: skip
    got = write_run_batch_body(
        args["model"], args["op"], args["lora"], args["cost"], args["batch_id"],
        [d.wire_item for d in ds], args["fetch"], args["tokens"], args["audio"],
    )  # fmt: skip
    assert got == expected


def test_most_generated_payloads_stay_in_place() -> None:
    """The parity above is not vacuous: payloads without ext values are kept lazy."""
    payloads = [msgpack.packb(BASE | {"item": {"text": str(i)}, "timestamp": float(i)}) for i in range(20)]
    assert all(isinstance(d, LazyDelivery) for d in intake(payloads))
    ext = msgpack.packb(BASE | {"item": msgpack.ExtType(1, b"x")})
    (d,) = intake([ext])
    assert isinstance(d, Delivery)  # left to the decoder, which accepts it
    assert d.item == decode_work_item(ext)


@settings(max_examples=100, deadline=None)
@given(maps=st.lists(payload_maps("encode"), max_size=5), acks=st.booleans(), current=st.sampled_from([None, "h"]))
def test_replies_framed_from_undecoded_items_are_the_decoded_items_replies(
    maps: list[dict[str, Any]], acks: bool, current: str | None
) -> None:
    payloads = [msgpack.packb(m | {"reply_subject": "_INBOX.gw.r"}, use_bin_type=True) for m in maps]
    lazy = intake(payloads)
    eager = intake(payloads, lazy=False)
    outcomes = [
        item_outcome(
            d.item.work_item_id, d.item.request_id, d.item.item_index, "publish_and_ack", result_msgpack=b"\x90"
        )
        for d in eager
    ]
    response = msgpack.packb({"outcomes": outcomes, "batched_f16_multivectors": []}, use_bin_type=True)
    args: dict[str, Any] = {
        "worker_id": "w",
        "current_hash": current,
        "now": 1.0e9,
        "max_payload": 1 << 20,
        "acks": acks,
    }
    for d in lazy:
        assert not isinstance(d, LazyDelivery) or d.wire_item is d  # still undecoded
    got = frame_batch_response(response, lazy, **args)
    expected = frame_batch_response(response, eager, **args)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.replies.buffer, got.replies.sent, got.success, got.request_ids) == (
        expected.replies.buffer,
        expected.replies.sent,
        expected.success,
        expected.request_ids,
    )


def test_an_item_edited_after_decoding_is_written_from_its_attributes() -> None:
    (d,) = intake([msgpack.packb(BASE | {"item": {"text": "old"}})])
    d.item.item, d.item.raw = {"text": "new"}, None
    body = msgpack.unpackb(write_run_batch_body("m", "encode", "", 1, 1, [d.wire_item], None, None, None))
    assert body["items"][0]["encode"]["item"] == {"text": "new"}
    with pytest.raises(ValueError, match="wire_item"):
        write_run_batch_body("m", "encode", "", 1, 1, [d], None, None, None)


def test_wide_headers_do_not_change_the_fields_read_in_place() -> None:
    wide = _loose(BASE | {"timestamp": 1.5, "profile_id": "p"})
    (d,) = intake([wide])
    assert isinstance(d, LazyDelivery)
    body = msgpack.unpackb(write_run_batch_body("m", "encode", "", 1, 1, [d], None, None, None))
    inner = body["items"][0]["encode"]
    assert (inner["timestamp"], inner["profile_id"], inner["item_index"]) == (1.5, "p", BASE["item_index"])
    assert struct.unpack(">I", wide[1:5])[0] == len(BASE) + 2


def _frames(payloads: list[bytes], subject: str = SUBJECT) -> bytes:
    return b"".join(
        b"MSG %s 5 $JS.ACK.pool.c.1.%d.%d.0.0 %d\r\n%s\r\n" % (subject.encode(), i + 1, i + 1, len(p), p)
        for i, p in enumerate(payloads)
    )


def _scanned(payloads: list[bytes], *, make_run: bool) -> list[Any]:
    from nats.aio.msg import Msg

    from sie_sidecar._native import deliveries_of_run
    from sie_sidecar._native.wire import scan_direct_msgs

    got: list[Any] = []
    maker = (lambda *a: deliveries_of_run(*a, item_cls=WorkItem)) if make_run else None
    scan_direct_msgs(bytearray(_frames(payloads)), {5: got.extend}, None, Msg, maker)
    return got


def _verdicts(found: Any) -> list[tuple[str, str, Any]]:
    out = [("nak", d.model, d.item) for d in found.naks] + [("drop", d.model, d.item) for d in found.drops]
    out += [("accept", d.model, d.item) for ds in found.groups.values() for d in ds]
    return sorted(out, key=repr)


@settings(max_examples=120, deadline=None)
@given(
    payloads=st.lists(
        st.one_of(
            payload_maps("encode").map(lambda m: msgpack.packb(m, use_bin_type=True)),
            mutated(msgpack.packb(BASE | {"item": {"text": "x"}})),
            st.binary(max_size=24),
        ),
        max_size=6,
    )
)
def test_scanned_deliveries_get_the_verdicts_messages_get(payloads: list[bytes]) -> None:
    """Deliveries the scanner made (payload parsed at scan time, no Msg) and the Msg objects of the
    same frames go through intake alike; a scanned delivery is itself the delivery handed on."""
    scanned = _scanned(payloads, make_run=True)
    assert all(isinstance(d, LazyDelivery) for d in scanned)
    released: list[int] = []
    found = Intake().intake(scanned, released.append)
    expected = Intake().intake(_scanned(payloads, make_run=False), released.append)
    assert _verdicts(found) == _verdicts(expected)
    handed = [*found.naks, *found.drops, *(d for ds in found.groups.values() for d in ds)]
    assert sorted(map(id, handed)) == sorted(map(id, scanned))
    assert found.plain == expected.plain
    assert all(d.release == released.append and not d.settled for d in handed)


@given(
    pools=st.lists(st.sampled_from(["", "pool-a", " POOL-A ", "pool-l", "other", "\x1cpool-a"]), max_size=6),
    physical=st.booleans(),
)
def test_scanned_deliveries_get_the_admission_verdicts_messages_get(pools: list[str], physical: bool) -> None:
    """§4.1 row 11 on the scanner's deliveries (the admission pool read in place) equals the twin's."""
    from sie_sidecar.pipeline.admission import Admission, PoolDecision

    payloads = [msgpack.packb(BASE | {"item": {"text": "x"}, "admission_pool": p}) for p in pools]
    admission = Admission("pool-a")
    admission.record(PoolDecision(physical, "r", frozenset({"pool-l"})))
    native, twin = Intake(), Intake()
    native.admission = twin.admission = admission
    found = native.intake(_scanned(payloads, make_run=True), None)
    scanned = _scanned(payloads, make_run=False)
    expected = intake_batch_py(scanned, twin._subject_info, twin._decide, None, False, admission.item_rule())
    assert sorted((k, m) for k, m, _ in _verdicts(found)) == sorted(
        [("nak", d.model) for d in expected[1]] + [("accept", d.model) for ds in expected[0].values() for d in ds]
    )
    assert len(found.naks) == sum(
        not (physical if p.strip(" ").lower() in ("", "pool-a") else p == "pool-l") for p in pools
    )
