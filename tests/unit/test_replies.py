# SPDX-License-Identifier: Apache-2.0
"""`frame_outcome_replies`: a batch of outcomes to PUB commands in one call, byte-identical to the
general per-item path (`outcome_result` + `plan_reply` + `frame_pubs`), and `None` whenever the
general path must decide (wire-protocol §4.6, §8.1, §8.3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.backend.adapter import item_outcome
from sie_sidecar.bus.outbound import frame_pubs
from sie_sidecar.pipeline.replies import outcome_result
from sie_sidecar.wire.workitem import WorkItem
from tests.conftest import load_impl

NOW = 1_700_000_100.25
MAX_PAYLOAD = 1 << 20


@dataclass
class M:
    """The settle handle's ACK subject (what `acks=True` reads)."""

    reply: str


@dataclass
class D:
    """A Delivery-shaped record: the attributes the framer reads."""

    item: WorkItem
    worker_direct: bool = False
    payload_fetch_ms: float = 0.0
    msg: M = field(default_factory=lambda: M("$JS.ACK.pool.c.1.1.1.1.0"))


def work_item(i: int, **kw: Any) -> WorkItem:
    base: dict[str, Any] = {
        "work_item_id": f"r{i}.0",
        "request_id": f"r{i}",
        "item_index": i,
        "total_items": 1,
        "operation": "encode",
        "model_id": "m",
        "pool_name": "default",
        "machine_profile": "cpu",
        "reply_subject": f"_INBOX.gw.{i}",
        "timestamp": NOW - 0.5,
    }
    base.update(kw)
    return WorkItem(**base)


def outcomes(impl: ModuleType, maps: list[dict[str, Any]]) -> list[Any]:
    raw = msgpack.packb({"outcomes": maps, "batched_f16_multivectors": []}, use_bin_type=True)
    return list(impl.decode_batch_outcome(raw).outcomes)


def success(i: int, **kw: Any) -> dict[str, Any]:
    return item_outcome(f"r{i}.0", f"r{i}", i, "publish_and_ack", result_msgpack=b"\x81\xa1x\x01", **kw)


def general_path(ds: list[D], outs: list[Any], *, current_hash: str | None) -> bytes:
    """What the dispatcher's per-item path would write for the same batch."""
    from sie_sidecar import wire

    messages = []
    for d, o in zip(ds, outs, strict=True):
        if not d.item.reply_subject.strip():
            continue
        result = outcome_result(
            d.item,
            o,
            worker_id="w-1",
            worker_direct=d.worker_direct,
            current_hash=current_hash,
            now=NOW,
            payload_fetch_ms=d.payload_fetch_ms,
        )
        plan = wire.plan_reply(result, accepts_result_chunks=False, max_payload=MAX_PAYLOAD)
        assert plan.mode == "single"
        messages.append((d.item.reply_subject, plan.messages[0]))
    return frame_pubs(messages)


def deliveries(items: list[tuple[dict[str, Any], bool, float]]) -> list[D]:
    """One delivery per drawn (WorkItem fields, worker_direct, fetch ms), each with its ACK subject."""
    return [
        D(work_item(i, **kw), worker_direct=direct, payload_fetch_ms=ms, msg=M(f"$JS.ACK.s.c.1.{i}.{i}.0.0"))
        for i, (kw, direct, ms) in enumerate(items)
    ]


def frame(impl: ModuleType, ds: list[D], outs: list[Any], **kw: Any) -> Any:
    args: dict[str, Any] = {"worker_id": "w-1", "current_hash": None, "now": NOW, "max_payload": MAX_PAYLOAD}
    args.update(kw)
    return impl.frame_outcome_replies(ds, outs, **args)


def test_a_plain_batch_is_framed_like_the_general_path(impl: ModuleType) -> None:
    ds = [D(work_item(i)) for i in range(3)]
    outs = outcomes(impl, [success(i, inference_ms=1.5, units={"input_tokens": 4}) for i in range(3)])
    framed = frame(impl, ds, outs)
    assert framed is not None
    assert framed.buffer == general_path(ds, outs, current_hash=None)
    assert (framed.messages, framed.sent) == (3, b"\x01\x01\x01")
    assert framed.buffer.startswith(b"PUB _INBOX.gw.0 ")
    assert framed.payload_bytes == sum(len(m) for m in _payloads(framed.buffer))


def _payloads(buf: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(buf):
        end = buf.index(b"\r\n", pos)
        size = int(buf[pos:end].split()[-1])
        out.append(buf[end + 2 : end + 2 + size])
        pos = end + 2 + size + 2
    return out


def test_errors_hash_and_direct_flag_follow_outcome_result(impl: ModuleType) -> None:
    ds = [D(work_item(0, bundle_config_hash="h1")), D(work_item(1, bundle_config_hash="old"), worker_direct=True)]
    outs = outcomes(
        impl,
        [
            success(0),
            item_outcome("r1.0", "r1", 1, "publish_error_and_ack", error="boom", error_code="inference_error"),
        ],
    )
    framed = frame(impl, ds, outs, current_hash="h1")
    assert framed.buffer == general_path(ds, outs, current_hash="h1")
    first, second = (msgpack.unpackb(p) for p in _payloads(framed.buffer))
    assert first["executed_bundle_config_hash"] == "h1" and first["success"] is True
    assert "executed_bundle_config_hash" not in second
    assert (second["success"], second["error_code"], second["worker_direct"]) == (False, "inference_error", True)


def test_the_backends_retry_hint_is_passed_through(impl: ModuleType) -> None:
    """§6.1 (newer than v0.7.1): an item's `retry_after_s` reaches its reply unchanged, as the
    general path writes it (the twin once dropped it: the twin-only run of test_settlement caught it)."""
    ds = [D(work_item(0)), D(work_item(1))]
    outs = outcomes(
        impl,
        [
            item_outcome(
                "r0.0", "r0", 0, "publish_error_and_ack", error="busy", error_code="inference_error", retry_after_s=7
            ),
            success(1),
        ],
    )
    framed = frame(impl, ds, outs)
    assert framed is not None
    assert framed.buffer == general_path(ds, outs, current_hash=None)
    first, second = (msgpack.unpackb(p) for p in _payloads(framed.buffer))
    assert (first["success"], first["retry_after_s"]) == (False, 7)
    assert "retry_after_s" not in second


def test_an_empty_reply_subject_sends_nothing_but_counts(impl: ModuleType) -> None:
    ds = [D(work_item(0, reply_subject=" ")), D(work_item(1))]
    framed = frame(impl, ds, outcomes(impl, [success(0), success(1)]))
    assert (framed.messages, framed.sent) == (1, b"\x00\x01")
    assert framed.buffer.startswith(b"PUB _INBOX.gw.1 ")


@pytest.mark.parametrize(
    "case",
    ["nak_retry", "raw_output", "empty_success", "out_of_order", "count", "too_large"],
)
def test_batches_the_general_path_must_decide_return_none(impl: ModuleType, case: str) -> None:
    ds = [D(work_item(i)) for i in range(2)]
    maps = [success(0), success(1)]
    kw: dict[str, Any] = {}
    if case == "nak_retry":
        maps[1] = item_outcome("r1.0", "r1", 1, "nak_retry", nak_delay_ms=100)
    elif case == "raw_output":
        maps[1] = item_outcome("r1.0", "r1", 1, "publish_and_ack", raw_output={"dense": {"values": [1.0], "dim": 1}})
    elif case == "empty_success":
        maps[1] = item_outcome("r1.0", "r1", 1, "publish_and_ack")
    elif case == "out_of_order":
        maps.reverse()
    elif case == "count":
        maps.pop()
    else:
        kw["max_payload"] = 100
    assert frame(impl, ds, outcomes(impl, maps), **kw) is None


_text = st.text(max_size=12)
_opt_ms = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False))


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], bool, float]], str | None]:
    n = draw(st.integers(min_value=0, max_value=6))
    current = draw(st.one_of(st.none(), st.sampled_from(["h1", "h2"])))
    maps, items = [], []
    for i in range(n):
        fields: dict[str, Any] = {
            "inference_ms": draw(_opt_ms),
            "tokenization_ms": draw(_opt_ms),
            "postprocessing_ms": draw(_opt_ms),
            "units": draw(
                st.one_of(
                    st.none(),
                    st.fixed_dictionaries(
                        {}, optional={"input_tokens": st.integers(0, 2**40), "pairs": st.integers(0, 9)}
                    ),
                )
            ),
        }
        if draw(st.booleans()):
            maps.append(success(i, **fields) | {"result_msgpack": draw(st.binary(min_size=1, max_size=64))})
        else:
            maps.append(item_outcome(f"r{i}.0", f"r{i}", i, "publish_error_and_ack", error=draw(_text), **fields))
        item_kw = {
            "request_id": draw(_text),
            "bundle_config_hash": draw(st.sampled_from(["", "h1", "h2"])),
            "timestamp": draw(st.sampled_from([0.0, NOW - 3.0, NOW + 3.0])),
            "item_index": draw(st.integers(0, 2**32)),
        }
        items.append((item_kw, draw(st.booleans()), draw(st.sampled_from([0.0, 0.25, 12.5]))))
    return maps, items, current


@given(batch=batches(), acks=st.booleans())
def test_native_twin_and_general_path_agree(batch: Any, acks: bool) -> None:
    native, twin = load_impl("native"), load_impl("py")
    maps, items, current = batch
    ds = deliveries(items)
    expected = general_path(ds, outcomes(twin, maps), current_hash=current)
    if acks:
        expected += frame_pubs([(d.msg.reply, b"+ACK") for d in ds])
    for impl in (native, twin):
        framed = frame(impl, ds, outcomes(impl, maps), current_hash=current, acks=acks)
        assert framed is not None
        assert framed.buffer == expected
        assert framed.messages == len(ds)
        assert framed.acks == (len(ds) if acks else 0)


def test_acks_follow_every_reply_in_the_same_buffer(impl: ModuleType) -> None:
    """One write settles the batch: replies first, then one `+ACK` per delivery, the
    fire-and-forget one (no reply subject, nothing published) included."""
    ds = [D(work_item(0), msg=M("$JS.ACK.a.0")), D(work_item(1, reply_subject=""), msg=M("$JS.ACK.a.1"))]
    framed = frame(impl, ds, outcomes(impl, [success(0), success(1)]), acks=True)
    assert (framed.messages, framed.acks, framed.sent) == (1, 2, b"\x01\x00")
    replies = general_path(ds[:1], outcomes(impl, [success(0)]), current_hash=None)
    assert framed.buffer == replies + b"PUB $JS.ACK.a.0 4\r\n+ACK\r\nPUB $JS.ACK.a.1 4\r\n+ACK\r\n"


@pytest.mark.parametrize("subject", ["", "$JS.ACK a", "$JS.ACK.\ta", "$JS.ACK.\r\n"])
def test_an_ack_subject_unfit_for_a_pub_line_takes_the_general_path(impl: ModuleType, subject: str) -> None:
    ds = [D(work_item(0)), D(work_item(1), msg=M(subject))]
    assert frame(impl, ds, outcomes(impl, [success(0), success(1)]), acks=True) is None
    assert frame(impl, ds, outcomes(impl, [success(0), success(1)])) is not None  # without ACKs: fine


def test_payload_fetch_ms_is_written_only_when_a_payload_was_fetched(impl: ModuleType) -> None:
    """§6.1: `payload_fetch_ms` only if > 0 (nil otherwise)."""
    ds = [D(work_item(0), payload_fetch_ms=3.5), D(work_item(1))]
    framed = frame(impl, ds, outcomes(impl, [success(0), success(1)]))
    first, second = (msgpack.unpackb(p) for p in _payloads(framed.buffer))
    assert (first["payload_fetch_ms"], second["payload_fetch_ms"]) == (3.5, None)


def _response(maps: list[dict[str, Any]], **extra: Any) -> bytes:
    return bytes(msgpack.packb({"outcomes": maps, "batched_f16_multivectors": [], **extra}, use_bin_type=True))


@given(batch=batches(), acks=st.booleans())
def test_a_response_framed_in_place_matches_decode_then_frame(batch: Any, acks: bool) -> None:
    """`frame_batch_response` (no ItemOutcome per item) gives the bytes `frame_outcome_replies` gives
    over the decoded outcomes, and what the pipeline learns: first inference, successes, samples."""
    native, twin = load_impl("native"), load_impl("py")
    maps, items, current = batch
    ds = deliveries(items)
    raw = _response(maps)
    outs = outcomes(twin, maps)
    expected = frame(twin, ds, outs, current_hash=current, acks=acks)
    assert expected is not None
    args = {"worker_id": "w-1", "current_hash": current, "now": NOW, "max_payload": MAX_PAYLOAD, "acks": acks}
    for impl in (native, twin):
        got = impl.frame_batch_response(raw, ds, **args)
        assert got is not None
        assert (got.replies.buffer, got.replies.sent, got.replies.acks) == (
            expected.buffer,
            expected.sent,
            expected.acks,
        )
        assert got.inference_ms == (outs[0].inference_ms if outs else None)
        assert got.success == bytes(int(o.disposition == "publish_and_ack") for o in outs)
        assert got.totals == [
            (o.inference_ms or 0.0) + (o.postprocessing_ms or 0.0)
            for o, s in zip(outs, expected.sent, strict=True)
            if s and o.disposition == "publish_and_ack"
        ]
        assert got.request_ids == [d.item.request_id for d in ds]
        assert all(a is d.item.request_id for a, d in zip(got.request_ids, ds, strict=True))  # no copies


@pytest.mark.parametrize(
    "case",
    [
        "nak_retry",
        "f16",
        "raw_output",
        "bytes_as_array",
        "truncated",
        "missing_outcomes",
        "other_item",
        "bad_utf8_key_in_an_outcome",
        "bad_utf8_key_in_the_response",
    ],
)
def test_a_response_the_general_path_must_decide_is_not_framed_in_place(impl: ModuleType, case: str) -> None:
    ds = [D(work_item(0)), D(work_item(1))]
    maps = [success(0), success(1)]
    extra: dict[str, Any] = {}
    if case == "nak_retry":
        maps[1] = item_outcome("r1.0", "r1", 1, "nak_retry", nak_delay_ms=5)
    elif case == "f16":
        extra["batched_f16_multivectors"] = [{"values_f16": b"\x00\x00", "items": []}]
    elif case == "raw_output":
        maps[0] = maps[0] | {"raw_output": {"dense": [1.0]}}
    elif case == "bytes_as_array":
        maps[0] = maps[0] | {"result_msgpack": [0x81, 0xA1, 0x78, 0x01]}
    elif case == "other_item":
        maps[1] = success(7)
    elif case == "bad_utf8_key_in_an_outcome":
        maps[1] = maps[1] | {"zzzz": 1}
    elif case == "bad_utf8_key_in_the_response":
        extra["zzzz"] = 1
    raw = _response(maps, **extra)
    if case.startswith("bad_utf8_key"):  # an unknown key the framer skips, but not valid UTF-8
        raw = raw.replace(b"\xa4zzzz", b"\xa4\xff\xfe\xfd\xfc")
    if case == "truncated":
        raw = raw[:-3]
    elif case == "missing_outcomes":
        raw = msgpack.packb({"batched_f16_multivectors": []})
    args = {"worker_id": "w-1", "current_hash": None, "now": NOW, "max_payload": MAX_PAYLOAD}
    got = impl.frame_batch_response(raw, ds, **args)
    if case in ("bytes_as_array", "bad_utf8_key_in_the_response") and impl is load_impl("py"):
        # The twin decodes first: an array of byte values is a valid form, and the decoder
        # ignores an unknown top-level key whatever its bytes (the compiled framer leaves it to it).
        assert got is not None
        return
    assert got is None


def test_unknown_keys_are_skipped_where_the_response_is_framed_in_place(impl: ModuleType) -> None:
    ds = [D(work_item(0)), D(work_item(1))]
    maps = [success(0) | {"newer_field": {"a": [1, "é"]}}, success(1)]
    args = {"worker_id": "w-1", "current_hash": None, "now": NOW, "max_payload": MAX_PAYLOAD}
    got = impl.frame_batch_response(_response(maps, newer_top_level="x"), ds, **args)
    plain = impl.frame_batch_response(_response([success(0), success(1)]), ds, **args)
    assert got is not None and plain is not None
    assert got.replies.buffer == plain.replies.buffer


@given(batch=batches(), acks=st.booleans(), reply=st.sampled_from(["_INBOX.c.7", "_INBOX.confirm.123456"]))
def test_the_asking_ack_written_by_the_framer_is_the_rewritten_buffer(batch: Any, acks: bool, reply: str) -> None:
    """`ack_reply` (confirmed ACKs, issue 30): the framer writes the last ACK with the reply subject,
    byte for byte what `ask_last_ack` made of the plain buffer by rewriting (and copying) it."""
    from sie_sidecar.bus.ack_confirm import ask_last_ack

    native, twin = load_impl("native"), load_impl("py")
    maps, items, current = batch
    ds = deliveries(items)
    raw = _response(maps)
    plain = frame(twin, ds, outcomes(twin, maps), current_hash=current, acks=acks)
    assert plain is not None
    asked = ask_last_ack(plain.buffer, ds[-1].msg.reply, reply) if acks and ds else None
    args = {"worker_id": "w-1", "current_hash": current, "now": NOW, "max_payload": MAX_PAYLOAD, "acks": acks}
    for impl in (native, twin):
        got = impl.frame_batch_response(raw, ds, ack_reply=reply, **args)
        by_outcomes = frame(impl, ds, outcomes(impl, maps), current_hash=current, acks=acks, ack_reply=reply)
        for framed in (got.replies, by_outcomes):
            assert framed.buffer == (asked if asked is not None else plain.buffer)
            assert framed.ack_reply == (reply if asked is not None else None)
            assert (framed.sent, framed.acks) == (plain.sent, plain.acks)


@pytest.mark.parametrize("reply", ["", "_INBOX a", "_INBOX.\r\n"])
def test_an_ack_reply_unfit_for_a_pub_line_is_refused(impl: ModuleType, reply: str) -> None:
    ds = [D(work_item(0), msg=M("$JS.ACK.a.0"))]
    with pytest.raises(ValueError):
        frame(impl, ds, outcomes(impl, [success(0)]), acks=True, ack_reply=reply)
