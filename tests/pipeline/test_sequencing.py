# SPDX-License-Identifier: Apache-2.0
"""The pipeline's sequencing without NATS: an in-memory `Source`, the real reference backend over a real
Unix socket, and every delivery counted (exactly one final settlement each, sidecar-behaviour §4)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter

from .memory import MemoryMessage, memory_pipeline

POOL, PROFILE, BUNDLE = "default", "cpu", "default"


def _item(rid: str, *, model: str = "org/model-a", operation: str = "encode", **extra: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "work_item_id": f"{rid}.0",
        "request_id": rid,
        "item_index": 0,
        "total_items": 1,
        "operation": operation,
        "model_id": model,
        "profile_id": "default",
        "engine": "",
        "pool_name": POOL,
        "machine_profile": PROFILE,
        "item": {"text": f"text of {rid}"},
        "payload_ref": None,
        "output_types": ["dense"],
        "bundle_config_hash": "",
        "router_id": "gw",
        "reply_subject": f"_INBOX.gw.{rid}",
        "timestamp": time.time(),
        "accepts_result_chunks": True,
    }
    item.update(extra)
    return item


def _msg(item: dict[str, Any], *, subject: str | None = None, data: bytes | None = None) -> MemoryMessage:
    subject = subject or wire.pool_work_subject(POOL, PROFILE, BUNDLE, item["model_id"])
    return MemoryMessage(subject=subject, data=data if data is not None else msgpack.packb(item, use_bin_type=True))


@pytest.mark.parametrize(
    ("framed", "acks"), [(True, False), (True, True), (False, False)], ids=["native-framed", "acks-framed", "per-reply"]
)
async def test_every_delivery_is_settled_once_with_one_reply(tmp_path: Path, framed: bool, acks: bool) -> None:
    async with memory_pipeline(tmp_path, framed=framed, acks_with_replies=acks) as p:
        good = [_msg(_item(f"r{i}", model="org/model-a" if i % 2 else "org/model-b")) for i in range(40)]
        p.send(good)
        await p.until_settled(good)
        assert all(m.final == [("ack", None)] for m in good)
        replied = {r["work_item_id"]: r for _, r in p.sink.replies}
        assert sorted(replied) == sorted(f"r{i}.0" for i in range(40))
        assert all(r["success"] for r in replied.values())
        assert {s for s, _ in p.sink.replies} == {f"_INBOX.gw.r{i}" for i in range(40)}
        assert p.source.unsettled == 0


async def test_intake_verdicts_settle_each_message_by_its_rule(tmp_path: Path) -> None:
    """§4.1: undecodable and malformed-subject work is NAKed with the base delay, an unsafe reply
    subject is dropped without a reply, an unknown operation gets one error reply and an ACK."""
    async with memory_pipeline(tmp_path, nak_delay_ms=7000) as p:
        ok = _msg(_item("ok"))
        undecodable = _msg(_item("bad"), data=b"\xc1not msgpack")
        malformed = _msg(_item("subj"), subject="sie.work.nope")
        unsafe = _msg(_item("unsafe", reply_subject="_INBOX.gw.x y"))
        # A CR/LF in the reply subject would inject a second command into the PUB line of the reply.
        injected = _msg(_item("inj", reply_subject="_INBOX.gw.x\r\nPUB sie.config.models.default 5\r\nevil!"))
        unknown_op = _msg(_item("op", operation="fold"))
        batch = [ok, undecodable, malformed, unsafe, injected, unknown_op]
        p.send(batch)
        await p.until_settled(batch)
        assert ok.final == [("ack", None)]
        assert undecodable.final == [("nak", 7.0)]
        assert malformed.final == [("nak", 7.0)]
        assert unsafe.final == [("ack", None)]
        assert injected.final == [("ack", None)]
        assert unknown_op.final == [("ack", None)]
        by_id = {r["work_item_id"]: r for _, r in p.sink.replies}
        assert set(by_id) == {"ok.0", "op.0"}
        assert by_id["op.0"]["success"] is False and by_id["op.0"]["error_code"] == "bad_operation"
        counts = p.settler.counts
        assert (counts.acked, counts.dropped, counts.naked) == (2, 2, 2)


async def test_cancelled_work_is_dropped_before_the_backend(tmp_path: Path) -> None:
    async with memory_pipeline(tmp_path) as p:
        p.dispatcher.tombstones.record("gw", "gone")
        gone, kept = _msg(_item("gone")), _msg(_item("kept"))
        p.send([gone, kept])
        await p.until_settled([gone, kept])
        assert gone.final == [("ack", None)] and kept.final == [("ack", None)]
        assert [r["work_item_id"] for _, r in p.sink.replies] == ["kept.0"]
        assert p.settler.counts.dropped == 1


async def test_a_model_that_failed_to_load_gets_one_error_reply_each(tmp_path: Path) -> None:
    """§4.2: `failed` from EnsureModelReady is final: MODEL_LOAD_FAILED to every item, then ACK."""
    adapter = NullAdapter(dim=8, preloaded_models=["org/model-a"], failed_models=["org/broken"])
    async with memory_pipeline(tmp_path, adapter=adapter) as p:
        broken = [_msg(_item(f"b{i}", model="org/broken")) for i in range(3)]
        fine = _msg(_item("fine"))
        p.send([*broken, fine])
        await p.until_settled([*broken, fine])
        assert all(m.final == [("ack", None)] for m in [*broken, fine])
        by_id = {r["work_item_id"]: r for _, r in p.sink.replies}
        assert {by_id[f"b{i}.0"]["error_code"] for i in range(3)} == {"MODEL_LOAD_FAILED"}
        assert by_id["fine.0"]["success"] is True


async def test_hostile_reply_subjects_cost_one_warning_not_one_per_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Log volume under hostile input: 50 unsafe reply subjects are dropped with one warning line."""
    async with memory_pipeline(tmp_path) as p:
        bad = [_msg(_item(f"x{i}", reply_subject=f"_INBOX.gw.x {i}")) for i in range(50)]
        with caplog.at_level("WARNING", logger="sie_sidecar.pipeline.intake"):
            p.send(bad)
            await p.until_settled(bad)
        assert all(m.final == [("ack", None)] for m in bad) and not p.sink.replies
        # At most one line (none when an earlier test's line for the same subject is still inside the
        # throttle's window); 50 without the throttle.
        assert [r.getMessage() for r in caplog.records].count("unsafe reply subject; dropped") <= 1
