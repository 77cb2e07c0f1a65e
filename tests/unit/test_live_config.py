# SPDX-License-Identifier: Apache-2.0
"""Live config's pure parts (sidecar-behaviour §5.5, §9): the notification and export documents, the
allow-list, the commit rules of the advertised state, the execution barrier, the export signature and
the reconciler's drift rules."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.control.config_messages import (
    EpochInfo,
    ExportedModel,
    control_plane_hash,
    normalise_pool,
    parse_epoch,
    parse_export,
    parse_notification,
)
from sie_sidecar.control.config_service import ConfigServiceClient, Reconciler
from sie_sidecar.control.export_signature import export_signature
from sie_sidecar.control.live_config import LiveConfig, trusted, untrusted_envelope
from sie_sidecar.errors import ConfigServiceError, NotificationError
from sie_sidecar.pipeline.config_gate import ConfigState, ExecutionBarrier
from sie_sidecar.wire.workitem import WorkItem

REQUIRED = {"producer_id": "sie-config", "bundle_id": "b", "epoch": 3, "bundle_config_hash": "h"}


def note(**fields: Any) -> bytes:
    return json.dumps(REQUIRED | fields).encode()


# -- the notification (§9.1) -------------------------------------------------------------------


def test_a_notification_defaults_every_optional_field() -> None:
    n = parse_notification(note())
    assert (n.producer_id, n.bundle_id, n.epoch, n.bundle_config_hash) == ("sie-config", "b", 3, "h")
    assert (n.model_id, n.model_config, n.profiles_added, n.affected_bundles, n.pool) == ("", "", (), (), None)
    assert n.bundle_pool_config_hashes == {} and n.bundle_adapters is None
    assert n.epoch_bump


def test_router_id_is_the_producer_alias_and_nulls_take_defaults() -> None:
    body = {k: v for k, v in REQUIRED.items() if k != "producer_id"} | {"router_id": "sie-config-1", "model_id": None}
    n = parse_notification(json.dumps(body).encode())
    assert (n.producer_id, n.model_id) == ("sie-config-1", "")


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_each_identifying_field_is_required(missing: str) -> None:
    body = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(NotificationError, match="required"):
        parse_notification(json.dumps(body).encode())


@pytest.mark.parametrize(
    "fields",
    [
        {"epoch": -1},
        {"epoch": 1 << 64},
        {"epoch": True},
        {"epoch": 1.5},
        {"model_config": 3},
        {"profiles_added": "p"},
        {"pool": 1},
        {"bundle_pool_config_hashes": {"b": {"p": 1}}},
        {"bundle_adapters": {"b": "m"}},
    ],
)
def test_a_field_of_the_wrong_type_is_a_parse_error(fields: dict[str, Any]) -> None:
    with pytest.raises(NotificationError):
        parse_notification(note(**fields))


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_the_typed_error(data: bytes) -> None:
    with contextlib.suppress(NotificationError):
        parse_notification(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from([*REQUIRED, "model_config", "pool", "profiles_added", "x"]), json_values))
def test_any_json_object_parses_or_raises_the_typed_error(body: dict[str, Any]) -> None:
    with contextlib.suppress(NotificationError):
        parse_notification(json.dumps(body).encode())


def test_the_allow_list_takes_entries_and_pod_suffixes() -> None:
    allow = ("sie-config", "ops")
    assert trusted("sie-config", allow) and trusted("sie-config-7f9c-x", allow) and trusted("ops", allow)
    assert not trusted("sie-configx", allow) and not trusted("evil", allow) and not trusted("", allow)
    assert trusted("anyone", ())


def test_a_reply_subject_or_nats_header_marks_an_untrusted_envelope() -> None:
    assert untrusted_envelope("_INBOX.x", [])
    assert untrusted_envelope("", ["NATS-Msg-Id"])
    assert not untrusted_envelope("", ["X-Trace"])


def test_the_control_plane_hash_for_our_pool() -> None:
    pools = {"b": {"default": "pool-h"}}
    assert control_plane_hash("b", "default", pools, "bundle-h") == "pool-h"
    assert control_plane_hash("b", "gpu", pools, "bundle-h") == ""  # bundle listed, pool absent
    assert control_plane_hash("c", "default", pools, "bundle-h") == "bundle-h"
    assert normalise_pool("  GPU ") == "gpu" and normalise_pool(" ") == "default"


# -- the advertised state (§9.2 step 12, §9.4) --------------------------------------------------


def item(config_hash: str) -> WorkItem:
    return WorkItem(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        total_items=1,
        operation="encode",
        model_id="m",
        pool_name="default",
        machine_profile="cpu",
        reply_subject="_INBOX.gw.r",
        bundle_config_hash=config_hash,
    )


def test_commit_rules() -> None:
    state = ConfigState()
    assert state.commit(0, "h0")  # epoch 0: the hash moves, the epoch does not
    assert (state.epoch, state.current) == (0, "h0")
    assert state.commit(5, "h5", [" b ", "a", "b", ""])
    assert (state.epoch, state.current, state.unsupported_models) == (5, "h5", ("a", "b"))
    assert not state.commit(5, "other")  # not greater: nothing changes
    assert not state.commit(4, "other")
    assert state.current == "h5"
    assert state.commit(2, "h2", force=True)  # an export's rewind
    assert (state.epoch, state.current) == (2, "h2")
    assert state.is_stale(2) and state.is_stale(1) and not state.is_stale(3)


def test_the_ping_hash_is_adopted_only_before_any_commit() -> None:
    state = ConfigState()
    state.adopt("ping-h")
    assert state.current == "ping-h"
    state.adopt("later")
    assert state.current == "ping-h"  # a non-empty hash is never replaced by Ping
    empty = ConfigState()
    empty.commit(0, "")
    empty.adopt("ping-h")
    assert empty.current is None  # a committed (empty) pair is not overwritten either


def test_the_gate_accepts_legacy_and_the_current_hash_only() -> None:
    refused: list[int] = []
    state = ConfigState("h")
    state.on_refused = lambda: refused.append(1)
    assert state.accepts_all([item(""), item("h"), None])
    assert not state.accepts_all([item("h"), item("other")])
    assert refused == [1]
    assert not ConfigState().accepts_all([item("h")])  # no hash advertised: pinned work waits
    state.commit(1, "h", ["Org/A"])
    assert not state.supports("org/a") and state.supports("org/b")


# -- the execution barrier (§5.5) -----------------------------------------------------------------


async def test_a_writer_waits_for_executions_and_blocks_new_ones() -> None:
    barrier = ExecutionBarrier()
    order: list[str] = []
    release = asyncio.Event()

    async def execution(name: str, hold: asyncio.Event | None = None) -> None:
        async with barrier.shared():
            order.append(f"{name} in")
            if hold is not None:
                await hold.wait()
            order.append(f"{name} out")

    async def writer() -> None:
        async with barrier.exclusive():
            order.append("write")

    first = asyncio.create_task(execution("e1", release))
    await asyncio.sleep(0)
    write = asyncio.create_task(writer())
    await asyncio.sleep(0)
    late = asyncio.create_task(execution("e2"))
    await asyncio.sleep(0.01)
    assert order == ["e1 in"] and barrier.writing  # the writer waits; e2 waits behind it
    release.set()
    await asyncio.gather(first, write, late)
    assert order == ["e1 in", "e1 out", "write", "e2 in", "e2 out"]


async def test_a_cancelled_writer_lets_held_back_executions_go() -> None:
    barrier = ExecutionBarrier()
    release = asyncio.Event()

    async def hold() -> None:
        async with barrier.shared():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)

    async def write() -> None:
        async with barrier.exclusive():
            pass

    writer = asyncio.create_task(write())
    await asyncio.sleep(0)
    entered = asyncio.Event()

    async def late() -> None:
        async with barrier.shared():
            entered.set()

    waiting = asyncio.create_task(late())
    await asyncio.sleep(0.01)
    assert not entered.is_set()
    writer.cancel()
    await asyncio.wait_for(entered.wait(), 1)
    release.set()
    await asyncio.gather(holder, waiting)
    assert not barrier.writing and barrier.executions == 0


# -- the export (§9.3) -----------------------------------------------------------------------------


def field(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_the_export_signature_is_sha256_over_length_prefixed_fields() -> None:
    expected = hashlib.sha256(
        field("b")
        + field("h")
        + struct.pack("<Q", 2)
        + field("a")
        + field("x: 1")
        + field("c")
        + field("y: 2")
        + b"\x00"
    ).hexdigest()
    assert export_signature("b", "h", [("c", "y: 2"), ("a", "x: 1")]) == expected
    assert export_signature("b", "h", [("a", "x: 1"), ("c", "y: 2")], ["m"]) != expected


@given(st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=6), st.randoms())
def test_the_signature_ignores_entry_order(entries: list[tuple[str, str]], rnd: Any) -> None:
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert export_signature("b", "", entries) == export_signature("b", "", shuffled)


def test_an_exported_model_body_and_pool() -> None:
    assert ExportedModel("m", "  x: 1\n", None, ("b",), None).body() == "x: 1"
    assert ExportedModel("m", "", {"pool": "GPU", "k": [1]}, ("b",), None).body() == '{"pool":"GPU","k":[1]}'
    assert ExportedModel("m", "", {"pool": "GPU"}, ("b",), None).pool_name() == "gpu"
    assert ExportedModel("m", "", {"pool": "GPU"}, ("b",), "Edge").pool_name() == "edge"
    assert ExportedModel("m", " ", None, ("b",), None).body() is None


def test_export_and_epoch_documents_default_every_field_and_refuse_wrong_shapes() -> None:
    export = parse_export({})
    assert (export.epoch, export.models, export.bundle_config_hashes) == (0, (), {})
    assert parse_epoch({}) == EpochInfo(0, "")
    bad: Any
    for bad in ([], {"models": {}}, {"models": [1]}, {"epoch": "1"}, {"bundle_config_hashes": {"b": 1}}):
        with pytest.raises(ConfigServiceError, match="shape"):
            parse_export(bad)


class _Unused:
    async def apply_model_config(self, body: dict[str, Any]) -> Any:
        raise AssertionError("no IPC expected")

    async def replace_model_configs(self, body: dict[str, Any]) -> Any:
        raise AssertionError("no IPC expected")


async def test_an_oversized_export_entry_is_partial_and_writes_nothing() -> None:
    live = LiveConfig(ConfigState(), _Unused(), bundle="b", pool="default", allow_list=(), stop=asyncio.Event())
    export = parse_export({"models": [{"model_id": "m", "raw_yaml": "x" * ((1 << 20) + 1), "affected_bundles": ["b"]}]})
    from sie_sidecar.control.live_config import ExportRequest

    assert await live.apply_export(export, ExportRequest("startup")) == "partial"
    assert live.degraded


def test_the_reconciler_drift_rules() -> None:
    state = ConfigState()
    state.commit(5, "h")
    live = LiveConfig(state, _Unused(), bundle="b", pool="default", allow_list=(), stop=asyncio.Event())
    rec = Reconciler(live, "http://cfg", None, poll_interval_s=30, full_export_interval_s=0, stop=asyncio.Event())
    rec.fingerprint = "fp"
    ahead, rewind, changed = (
        rec._drift(EpochInfo(6, "fp")),
        rec._drift(EpochInfo(4, "fp")),
        rec._drift(EpochInfo(5, "x")),
    )
    assert ahead is not None and ahead.reason == "epoch_ahead" and not ahead.forced
    assert rewind is not None and rewind.reason == "epoch_rewind" and rewind.forced
    assert changed is not None and changed.reason == "bundle_config_hashes_hash"
    assert rec._drift(EpochInfo(5, "fp")) is None and rec._drift(EpochInfo(5, "")) is None
    zero = Reconciler(
        LiveConfig(ConfigState(), _Unused(), bundle="b", pool="default", allow_list=(), stop=asyncio.Event()),
        "http://cfg",
        None,
        poll_interval_s=30,
        full_export_interval_s=0.001,
        stop=asyncio.Event(),
    )
    periodic = zero._drift(EpochInfo(0, ""))
    assert periodic is not None and periodic.periodic


@pytest.mark.parametrize("url", ["cfg:8080", "ftp://cfg", "http://", ""])
def test_a_config_service_url_that_is_not_http_is_a_client_error(url: str) -> None:
    with pytest.raises(ConfigServiceError, match="client"):
        ConfigServiceClient(url, None)


def test_a_child_must_attest_the_advertised_config_for_pinned_work() -> None:
    diverged: list[int] = []
    state = ConfigState("h")
    state.on_diverged = lambda: diverged.append(1)
    assert state.executes_on("h")
    assert state.executes_on("")  # a legacy backend attests nothing: trusted while nothing is committed
    assert not state.executes_on(None)  # unknown: no Ping since a lost connection
    assert not state.executes_on("other")
    state.commit(1, "h")
    assert not state.executes_on("")  # committed: "" is a backend that lost its config
    assert diverged == [1, 1, 1]
    assert state.gate([item(""), None]) is False and state.gate([item("h")]) is True
    assert state.gate([item("x")]) is None
