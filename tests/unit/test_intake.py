# SPDX-License-Identifier: Apache-2.0
"""Intake for a whole pulled batch (`Intake.verdicts`) gives every message the verdict the
per-message rules (`Intake.verdict`, sidecar-behaviour §4.1) give it, groups the accepted ones by
model in arrival order, and never loses or duplicates one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar._twins.intake import intake_batch as intake_batch_py
from sie_sidecar.pipeline import intake as intake_module
from sie_sidecar.pipeline.intake import ACCEPT, NAK, Intake, server_copied


class Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data, self.reply = subject, data, "$JS.ACK.x"

    async def ack(self) -> None: ...
    async def nak(self, delay: int | float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


SUBJECTS = [
    wire.pool_work_subject("default", "cpu", "b", "org/m-a"),
    wire.pool_work_subject("default", "cpu", "b", "org/m-b"),
    wire.worker_direct_subject("default", "cpu", "b", "org/m-a", "w-1"),
    "sie.work.bad",
    "not.a.work.subject",
]


def item(i: int, *, model: str, reply: str, router: str, operation: str) -> dict[str, Any]:
    return {
        "work_item_id": f"r{i}.0",
        "request_id": f"r{i}",
        "item_index": 0,
        "total_items": 1,
        "operation": operation,
        "model_id": model,
        "pool_name": "default",
        "machine_profile": "cpu",
        "reply_subject": reply,
        "router_id": router,
    }


@st.composite
def messages(draw: st.DrawFn) -> list[Msg]:
    out = []
    for i in range(draw(st.integers(0, 20))):
        subject = draw(st.sampled_from(SUBJECTS))
        kind = draw(st.sampled_from(["good", "good", "good", "junk", "unsafe", "cancelled", "other-model"]))
        if kind == "junk":
            out.append(Msg(subject, draw(st.binary(max_size=12))))
            continue
        model = "org/m-a" if kind != "other-model" else "org/elsewhere"
        reply = {"unsafe": "_INBOX.a b", "good": f"_INBOX.gw.{i}"}.get(kind, f"_INBOX.gw.{i}")
        router = "gw-cancel" if kind == "cancelled" else "gw"
        op = draw(st.sampled_from(["encode", "score", "generate"]))
        out.append(Msg(subject, msgpack.packb(item(i, model=model, reply=reply, router=router, operation=op))))
    return out


@given(batch=messages(), cancel=st.booleans())
def test_batch_intake_matches_the_per_message_rules(batch: list[Msg], cancel: bool) -> None:
    intake = Intake()
    if cancel:
        for i in range(20):
            intake.tombstones.record("gw-cancel", f"r{i}")
    released: list[int] = []
    release = released.append
    expected: dict[str, list[Any]] = {}
    expected_naks, expected_drops = [], []
    for msg in batch:
        d, verdict = Intake(intake.tombstones, intake.batch_tombstones).verdict(msg, release)
        if verdict is ACCEPT:
            expected.setdefault(d.model, []).append((msg, d.worker_direct, d.item))
        elif verdict is NAK:
            expected_naks.append(msg)
        else:
            expected_drops.append(msg)
    groups, naks, drops = intake.verdicts(batch, release)
    got = {m: [(d.msg, d.worker_direct, d.item) for d in ds] for m, ds in groups.items()}
    assert got == expected
    assert [d.msg for d in naks] == expected_naks and [d.msg for d in drops] == expected_drops
    assert all(d.release == release and not d.settled for ds in groups.values() for d in ds)
    assert all(d.model == m and d.item is not None and d.item.model_id == m for m, ds in groups.items() for d in ds)


def _fields(d: Any) -> tuple[Any, ...]:
    return (
        d.msg,
        d.worker_direct,
        d.item,
        d.model,
        d.settled,
        d.payload_fetch_ms,
        d.prepared_tokens,
        d.prepared_audio,
        d.release,
    )


REPLIES = st.sampled_from(
    ["", "_INBOX.gw.1", "_INBOX.gw.é", "_INBOX", "_INBOX.a\x7f", "_INBOX.a\tb", "sie.x", "_INBOX.a\r\n"]
)


@st.composite
def wild_messages(draw: st.DrawFn) -> list[Msg]:
    """Good items with any reply subject, junk, truncated payloads and non-map msgpack."""
    out = []
    for i in range(draw(st.integers(0, 16))):
        subject = draw(st.sampled_from(SUBJECTS))
        good = msgpack.packb(item(i, model="org/m-a", reply=draw(REPLIES), router="gw", operation="encode"))
        data = draw(
            st.sampled_from(
                [
                    good,
                    good[: max(1, len(good) // 2)],
                    msgpack.packb([1, 2]),
                    msgpack.packb({"work_item_id": 1}),
                    draw(st.binary(max_size=8)),
                ]
            )
        )
        out.append(Msg(subject, data))
    return out


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the native intake is the extension's")
@given(batch=st.one_of(messages(), wild_messages()))
def test_native_batch_intake_matches_its_twin_field_for_field(batch: list[Msg]) -> None:
    """`wire.intake_batch` (one native call, no tombstones) and the loop it replaces give every
    message the same verdict and the same Delivery, field for field, in the same order."""
    released: list[int] = []
    release = released.append
    native = Intake()
    assert intake_module._intake_batch is not None
    groups, naks, drops = native.verdicts(batch, release)
    twin = Intake()
    twin_groups, twin_naks, twin_drops = intake_batch_py(batch, twin._subject_info, twin._decide, release, False)
    assert list(groups) == list(twin_groups)
    for model in groups:
        assert [_fields(d) for d in groups[model]] == [_fields(d) for d in twin_groups[model]]
    assert [_fields(d) for d in naks] == [_fields(d) for d in twin_naks]
    assert [_fields(d) for d in drops] == [_fields(d) for d in twin_drops]


def test_native_intake_warns_and_makes_the_subject_model_win(caplog: pytest.LogCaptureFixture) -> None:
    subject = wire.pool_work_subject("default", "cpu", "warned-once", "org/m-a")  # a key not yet throttled
    other = Msg(
        subject, msgpack.packb(item(1, model="org/elsewhere", reply="_INBOX.gw.1", router="gw", operation="encode"))
    )
    junk = Msg(subject, b"\xc1")
    unsafe = Msg(subject, msgpack.packb(item(2, model="org/m-a", reply="_INBOX.a b", router="gw", operation="encode")))
    with caplog.at_level("WARNING", logger="sie_sidecar.pipeline.intake"):
        groups, naks, drops = Intake().verdicts([other, junk, unsafe], None)
    (d,) = groups["org/m-a"]
    assert d.item is not None and d.item.model_id == "org/m-a"
    assert [x.msg for x in naks] == [junk] and [x.msg for x in drops] == [unsafe]
    messages = {r.getMessage() for r in caplog.records}
    assert {"payload model differs from the subject; the subject wins", "undecodable WorkItem"} <= messages
    assert "unsafe reply subject; dropped" in messages


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the native intake is the extension's")
def test_native_intake_declines_a_delivery_class_it_does_not_know() -> None:
    """Another class than the Delivery it read the slots of: None, and the caller's loop decides."""
    from sie_sidecar._native import intake_batch
    from sie_sidecar.pipeline.delivery import Delivery
    from sie_sidecar.wire.workitem import WorkItem

    @dataclass(slots=True)
    class Other:
        msg: Any

    batch = [Msg(SUBJECTS[0], msgpack.packb(item(1, model="org/m-a", reply="", router="gw", operation="encode")))]
    assert intake_batch(batch, Intake()._subject_info, Other, WorkItem, None) is None
    assert intake_batch(batch, Intake()._subject_info, Delivery, WorkItem, None) is not None


@st.composite
def mixed_groups(draw: st.DrawFn) -> list[Msg]:
    """Good items of two models with any operation, options and payload refs."""
    out = []
    for i in range(draw(st.integers(0, 12))):
        model = draw(st.sampled_from(["org/m-a", "org/m-b"]))
        subject = wire.pool_work_subject("default", "cpu", "b", model)
        body = item(
            i, model=model, reply="", router="gw", operation=draw(st.sampled_from(["encode", "score", "extract"]))
        )
        extra: dict[str, Any] = draw(
            st.sampled_from(
                [
                    {},
                    {},
                    {"options": {}},
                    {"options": {"lora": "x"}},
                    {"payload_ref": "s3://b/k"},
                    {"query_payload_ref": "s3://b/q"},
                ]
            )
        )
        out.append(Msg(subject, msgpack.packb(body | extra)))
    return out


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the native intake gives the hints")
@given(batch=mixed_groups())
def test_plain_hints_name_exactly_the_groups_the_dispatcher_would_pass_untouched(batch: list[Msg]) -> None:
    """`Verdicts.plain[model]` is the op of a group that is all one op (encode or score), with no
    options and no offloaded payload: the dispatcher's own checks would split nothing off and fetch
    nothing for it, so skipping them changes nothing."""
    from sie_sidecar.payloads.resolve import payload_ref_of
    from sie_sidecar.pipeline.preparation import _inline_text_only, _split_by_op

    found = Intake().intake(batch, None)
    expected = {}
    for model, ds in found.groups.items():
        ops = {d.item.operation for d in ds if d.item is not None}
        if (
            len(ops) == 1
            and ops <= {"encode", "score"}
            and all(d.item is not None and not d.item.options and payload_ref_of(d.item) is None for d in ds)
        ):
            expected[model] = ops.pop()
    assert found.plain == expected
    for model, op in found.plain.items():
        ds = found.groups[model]
        assert _split_by_op(ds) == ({(op, ""): ds}, []) and _inline_text_only(ds)


@pytest.mark.parametrize(
    ("headers", "copied"),
    [
        (None, False),
        ({}, False),
        ({"Nats-Msg-Id": "x"}, False),
        ({"NATS-MSG-ID": "x", "X-Trace": "t"}, False),
        ({"Nats-Stream-Source": "ORIGIN 1"}, True),
        ({"nats-stream": "ORIGIN"}, True),
        ({"Nats-Msg-Id": "x", "Nats-Sequence": "4"}, True),
        ({"Natsy": "x"}, False),
    ],
)
def test_a_nats_header_other_than_the_msg_id_marks_a_server_copied_message(
    headers: dict[str, str] | None, copied: bool
) -> None:
    """§4.1 row 1: ACK-dropped before any other rule (even a malformed subject), natively and in the twin."""

    class WithHeaders(Msg):
        def __init__(self, subject: str, data: bytes, headers: dict[str, str] | None) -> None:
            super().__init__(subject, data)
            self.headers = headers

    assert server_copied(headers) is copied
    good = msgpack.packb(item(1, model="org/m-a", reply="_INBOX.gw.1", router="gw", operation="encode"))
    for subject in (SUBJECTS[0], "sie.work.bad"):
        msg = WithHeaders(subject, good, headers)
        twin = Intake()
        for found in (
            Intake().verdicts([msg], None),
            intake_batch_py([msg], twin._subject_info, twin._decide, None, False),
        ):
            groups, naks, drops = found
            assert ([d.msg for d in drops] == [msg]) is copied
            if copied:
                assert not groups and not naks


# -- §4.1 row 11: pool admission ----------------------------------------------------------------------

#: Admission pools as gateways and clients write them: empty, the own pool in any case and padding,
#: logical pools, others, and padding that Rust's `trim` and Python's `strip` disagree on.
ADMISSION_POOLS = st.sampled_from(
    ["", "  ", "pool-a", " Pool-A\t", "POOL-A", "pool-l", "\u3000pool-l\u2028", "other", "\x1cpool-a", "pool-a\x1f"]
)
RULES = st.tuples(
    st.booleans(), st.sampled_from(["pool-a", "default"]), st.sampled_from([frozenset(), frozenset({"pool-l"})])
)


@st.composite
def admission_messages(draw: st.DrawFn) -> list[Msg]:
    out = []
    for i in range(draw(st.integers(0, 12))):
        body = item(i, model="org/m-a", reply=draw(REPLIES), router="gw", operation="encode")
        body["admission_pool"] = draw(ADMISSION_POOLS)
        if draw(st.booleans()):
            body["options"] = {"x": 1}  # the decoder's path as well as the in-place one
        out.append(Msg(draw(st.sampled_from(SUBJECTS)), msgpack.packb(body)))
    return out


def _verdict_of(found: Any) -> list[tuple[str, Any]]:
    groups, naks, drops = found
    out = [("nak", d.msg) for d in naks] + [("drop", d.msg) for d in drops]
    return out + [("accept", d.msg) for ds in groups.values() for d in ds]


@given(batch=admission_messages(), rule=RULES)
def test_an_item_whose_admission_pool_is_not_admitted_is_naked(batch: list[Msg], rule: Any) -> None:
    """Row 11 by the per-message rules: an item whose `admission_pool` (trimmed, lowercase) is empty or
    the own pool takes the physical decision, any other must be a logical pool; else NAK."""
    from sie_sidecar.pipeline.admission import Admission, PoolDecision, item_admitted

    physical, own, logical = rule
    admission = Admission(own)
    admission.record(PoolDecision(physical, "assigned" if physical else "not_assigned", logical))
    intake = Intake()
    intake.admission = admission
    for msg in batch:
        d, verdict = intake.verdict(msg, None)
        if d.item is None or not wire.is_safe_reply_subject(d.item.reply_subject):
            continue
        key = msgpack.unpackb(msg.data)["admission_pool"].strip(" \t\u3000\u2028").lower()
        admitted = physical if key in ("", own) else key in logical
        assert item_admitted(d.item.admission_pool, admission.item_rule()) is admitted
        assert (verdict is NAK) is (not admitted or wire.model_from_subject(msg.subject) is None)


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the native intake is the extension's")
@given(batch=admission_messages(), rule=RULES)
def test_native_admission_check_matches_its_twin(batch: list[Msg], rule: Any) -> None:
    """The native intake (in place and decoded) and the twin NAK the same items, with the same notes."""
    from sie_sidecar._native import intake_batch
    from sie_sidecar.pipeline.admission import Admission, PoolDecision
    from sie_sidecar.pipeline.delivery import Delivery
    from sie_sidecar.wire.workitem import WorkItem

    admission = Admission(rule[1])
    admission.record(PoolDecision(rule[0], "r", rule[2]))
    twin = Intake()
    twin.admission = admission
    twin_found = intake_batch_py(batch, twin._subject_info, twin._decide, None, False, admission.item_rule())
    expected = _verdict_of(twin_found)
    for lazy in (True, False):
        found = intake_batch(batch, twin._subject_info, Delivery, WorkItem, None, lazy, admission.item_rule())
        assert found is not None
        groups, naks, drops, notes, _ = found
        assert _verdict_of((groups, naks, drops)) == expected
        assert [_fields(d) for d in naks] == [_fields(d) for d in twin_found[1]]  # model "" when NAKed
        unadmitted = [(d.msg, detail) for kind, d, detail in notes if kind == "unadmitted"]
        assert unadmitted == [
            (d.msg, msgpack.unpackb(d.msg.data)["admission_pool"]) for d in naks if d.item is not None
        ]


def test_unadmitted_items_are_counted_and_logged_once_per_pool(caplog: pytest.LogCaptureFixture) -> None:
    from sie_sidecar.pipeline.admission import Admission, PoolDecision

    intake = Intake()
    intake.admission = Admission("pool-a")
    intake.admission.record(PoolDecision(True, "assigned", frozenset()))
    body = item(1, model="org/m-a", reply="_INBOX.gw.1", router="gw", operation="encode")
    batch = [
        Msg(SUBJECTS[0], msgpack.packb(body | {"admission_pool": p}))
        for p in ["not-yet-logged", "not-yet-logged", "", "Pool-A"]
    ]
    with caplog.at_level("WARNING", logger="sie_sidecar.pipeline.intake"):
        groups, naks, _ = intake.verdicts(batch, None)
    assert [d.msg for d in naks] == batch[:2] and [d.msg for d in groups["org/m-a"]] == batch[2:]
    assert intake.unadmitted == 2
    lines = [r for r in caplog.records if r.getMessage() == "work item's admission pool is not admitted; NAKed"]
    assert len(lines) == 1 and getattr(lines[0], "admission_pool", None) == "not-yet-logged"
