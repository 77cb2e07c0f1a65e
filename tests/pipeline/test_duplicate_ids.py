# SPDX-License-Identifier: Apache-2.0
"""Duplicate `work_item_id`s in one batch (sidecar-behaviour §4.3, wire-protocol §4.5,
scheduler-and-prep §5 and §10 case 85): outcomes are bound FIFO, the first outcome for an id to the
first delivery of that id to arrive. A proxy in front of the reference backend answers RunBatch
itself over the real socket, with the outcomes for the duplicated id in a known order and the items
of the batch answered in reverse; every delivery is counted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from .memory import memory_pipeline
from .test_hostile_backend import HostileProxy, _frame, hostile_proxy
from .test_sequencing import _item, _msg

#: The delay the second outcome asks for (above the 1 s floor a backend may ask for).
NAK_DELAY_MS = 2500
DUPLICATE = "dup.0"


class DuplicateProxy(HostileProxy):
    """Answers each RunBatch with one outcome per item, last item first; the outcomes for
    `DUPLICATE` come in the order `dispositions` gives, whatever the items' order, so only the
    binding rule decides which delivery each one lands on."""

    dispositions: tuple[str, ...] = ("publish_and_ack", "nak_retry", "publish_error_and_ack")

    async def _answer(self, mode: str, request: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        items = request["body"]["items"]
        outcomes: list[dict[str, Any]] = []
        turns = iter(self.dispositions)
        for item in reversed(items):
            wid = item["work_item_id"]
            if wid == DUPLICATE:
                continue
            outcomes.append(_outcome(wid, item["request_id"], "publish_and_ack", tag=wid))
        duplicates = sum(1 for item in items if item["work_item_id"] == DUPLICATE)
        for n in range(duplicates):
            outcomes.append(_outcome(DUPLICATE, "dup", next(turns), tag=f"outcome-{n}"))
        envelope = {
            "version": 1,
            "request_id": request["request_id"],
            "ok": True,
            "body": {"outcomes": outcomes},
            "error": None,
        }
        writer.write(_frame(msgpack.packb(envelope, use_bin_type=True)))
        await writer.drain()
        return True


def _outcome(work_item_id: str, request_id: str, disposition: str, *, tag: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        "work_item_id": work_item_id,
        "request_id": request_id,
        "item_index": 0,
        "disposition": disposition,
        "nak_delay_ms": NAK_DELAY_MS if disposition == "nak_retry" else None,
    }
    if disposition == "publish_and_ack":
        outcome["result_msgpack"] = msgpack.packb({"tag": tag})
    elif disposition == "publish_error_and_ack":
        outcome |= {"error": tag, "error_code": "inference_error"}
    return outcome


@pytest.mark.parametrize(
    ("framed", "acks"), [(True, False), (True, True), (False, False)], ids=["native-framed", "acks-framed", "per-reply"]
)
async def test_outcomes_for_a_duplicated_id_bind_first_in_first_out(tmp_path: Path, framed: bool, acks: bool) -> None:
    """Three deliveries of `dup.0` between two other items, in one batch: the first gets the first
    outcome (a result), the second the second (a NAK with its delay), the third the third (an
    error reply); the other items are answered as usual."""
    async with (
        hostile_proxy(tmp_path, DuplicateProxy) as (proxy, proxy_sock),
        memory_pipeline(
            tmp_path,
            framed=framed,
            acks_with_replies=acks,
            ipc_socket=proxy_sock,
            ipc_timeout_s=5.0,
            nak_delay_ms=5000,
        ) as p,
    ):
        warm = [_msg(_item("warm"))]
        p.send(warm)  # the handshake and a first batch through the proxy, untouched
        await p.until_settled(warm)
        proxy.mode = "duplicates"

        def duplicate(order: str) -> dict[str, Any]:
            return _item("dup", reply_subject=f"_INBOX.gw.dup-{order}")

        first, second, third = (_msg(duplicate(order)) for order in ("first", "second", "third"))
        before, after = _msg(_item("before")), _msg(_item("after"))
        batch = [before, first, second, third, after]
        p.send(batch)
        await p.until_settled(batch)
        assert proxy.hostile_answers == 1, "the five items went out as one batch"

        assert first.final == [("ack", None)]
        assert second.final == [("nak", NAK_DELAY_MS / 1000)]
        assert third.final == [("ack", None)]
        assert before.final == after.final == [("ack", None)]
        replies = dict(p.sink.replies)
        assert msgpack.unpackb(replies["_INBOX.gw.dup-first"]["result_msgpack"]) == {"tag": "outcome-0"}
        assert "_INBOX.gw.dup-second" not in replies  # NAKed: no reply
        third_reply = replies["_INBOX.gw.dup-third"]
        assert (third_reply["success"], third_reply["error"]) == (False, "outcome-2")
        for name in ("before", "after"):
            assert msgpack.unpackb(replies[f"_INBOX.gw.{name}"]["result_msgpack"]) == {"tag": f"{name}.0"}
        assert p.settler.counts.settled == 6
