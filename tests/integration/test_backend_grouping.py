# SPDX-License-Identifier: Apache-2.0
"""The backend library as a backend that owns inference (scheduler-and-prep §1.3, §2.2, §2.3 [P]):
a RunBatch (or per-op batch) is split into compatible sub-groups, one adapter call each, over the
real Unix socket; items the Python builders refuse (candidate, label and schema limits) are
answered `invalid_input` on their own while the rest of the batch runs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sie_sidecar.backend import BackendServer, NullAdapter
from sie_sidecar.backend.grouping import (
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_VALUES,
    limit_error,
    schema_shape,
    sub_group_key,
    sub_groups,
)
from sie_sidecar.ipc.client import IpcClient

from .test_ipc import MODEL, pack, payload, run_batch_body, wrapped

pytestmark = pytest.mark.timeout(30)


class CallRecorder(NullAdapter):
    """The null adapter, remembering the work item ids of each adapter call."""

    def __init__(self) -> None:
        super().__init__(16, preloaded_models=(MODEL,))
        self.calls: list[list[str]] = []

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        self.calls.append([item["work_item_id"] for item in items])
        return await super().run_batch(model_id, op, items, lora_key)


@pytest.fixture
async def served(sock_dir: str) -> AsyncIterator[tuple[CallRecorder, IpcClient]]:
    adapter = CallRecorder()
    server = BackendServer(adapter, os.path.join(sock_dir, "grouping.sock"), worker_id="g")
    await server.start()
    client = IpcClient(server.socket_path, request_timeout_s=10.0)
    try:
        yield adapter, client
    finally:
        await client.close()
        await server.close()


async def test_a_run_batch_is_one_adapter_call_per_sub_group_in_first_item_order(
    served: tuple[CallRecorder, IpcClient],
) -> None:
    adapter, client = served
    items = [
        wrapped("encode", 0),
        wrapped("encode", 1, instruction="query: "),
        wrapped("encode", 2),
        wrapped("encode", 3, is_query=True),
        wrapped("encode", 4, instruction="query: "),
    ]
    result = await client.run_batch(run_batch_body(items))
    assert adapter.calls == [["r.0", "r.2"], ["r.1", "r.4"], ["r.3"]]
    assert sorted(o.work_item_id for o in result.outcomes) == [f"r.{i}" for i in range(5)]
    assert all(o.disposition == "publish_and_ack" for o in result.outcomes)


async def test_a_homogeneous_batch_stays_one_call(served: tuple[CallRecorder, IpcClient]) -> None:
    adapter, client = served
    await client.run_batch(run_batch_body([wrapped("score", i) for i in range(4)]))
    body = pack({"model_id": MODEL, "items": [payload("extract", i) for i in range(3)]})
    await client.process_batch("ProcessExtractBatch", body)

    assert adapter.calls == [["r.0", "r.1", "r.2", "r.3"], ["r.0", "r.1", "r.2"]]


async def test_builder_limits_refuse_one_item_and_the_rest_runs(served: tuple[CallRecorder, IpcClient]) -> None:
    adapter, client = served
    no_candidates = wrapped("score", 1)
    no_candidates["score"]["score_items"] = []
    too_many = wrapped("score", 2)
    too_many["score"]["score_items"] = [{"text": f"c{i}"} for i in range(1001)]
    result = await client.run_batch(run_batch_body([wrapped("score", 0), no_candidates, too_many]))
    by_id = {o.work_item_id: o for o in result.outcomes}
    assert by_id["r.0"].disposition == "publish_and_ack"
    assert (by_id["r.1"].error_code, by_id["r.1"].error) == ("INVALID_INPUT", "score request has no candidates")
    assert by_id["r.2"].error == "score request has 1001 candidates; at most 1000 are allowed"
    assert adapter.calls == [["r.0"]]

    labels = wrapped("extract", 3, labels=[f"l{i}" for i in range(1001)])
    # 65 nested objects: 130 schema levels (a property adds two), well inside msgpack's nesting limit.
    deep: Any = "leaf"
    for _ in range(MAX_SCHEMA_DEPTH // 2 + 1):
        deep = {"p": deep}
    schema = wrapped("extract", 4, output_schema=deep)
    extracted = await client.run_batch(run_batch_body([labels, schema, wrapped("extract", 5, labels=["x"])]))
    errors = {o.work_item_id: o.error for o in extracted.outcomes}
    assert errors == {
        "r.3": "extract request has 1001 labels; at most 1000 are allowed",
        "r.4": f"output_schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
        "r.5": None,
    }


def test_sub_group_keys_follow_the_spec_table() -> None:
    base = payload("encode", 0)
    # Absent output_types means ("dense",); an explicit empty list is its own group.
    assert sub_group_key("encode", base) == sub_group_key("encode", {**base, "output_types": ["dense"]})
    assert sub_group_key("encode", base) != sub_group_key("encode", {**base, "output_types": []})
    # Key order inside options counts (msgpack bytes); profile_id and bundle_config_hash split.
    a, b = {**base, "options": {"x": 1, "y": 2}}, {**base, "options": {"y": 2, "x": 1}}
    assert sub_group_key("encode", a) != sub_group_key("encode", b)
    assert sub_group_key("encode", base) != sub_group_key("encode", {**base, "profile_id": "p"})
    assert sub_group_key("encode", base) != sub_group_key("encode", {**base, "bundle_config_hash": "h"})
    # Extract: label order counts; an empty lora is no lora; score ignores labels.
    ex = payload("extract", 0)
    assert sub_group_key("extract", {**ex, "labels": ["a", "b"]}) != sub_group_key(
        "extract", {**ex, "labels": ["b", "a"]}
    )
    assert sub_group_key("extract", {**ex, "options": {"lora": ""}})[0] is None
    assert sub_group_key("extract", {**ex, "options": {"lora": "l"}})[0] == "l"
    sc = payload("score", 0)
    assert sub_group_key("score", sc) == sub_group_key("score", {**sc, "labels": ["a"]})
    groups = sub_groups("score", [sc, {**sc, "instruction": "i"}, sc])
    assert [len(g) for g in groups] == [2, 1]


def test_schema_shape_counts_levels_and_values() -> None:
    assert schema_shape("x") == (0, 1)
    assert schema_shape([1, 2]) == (1, 3)
    assert schema_shape({"a": 1}) == (2, 2)  # an object property adds two levels
    assert schema_shape({"a": {"b": [1]}}) == (5, 4)
    wide = {"properties": {f"p{i}": {"type": "string"} for i in range(MAX_SCHEMA_VALUES // 2)}}
    assert limit_error("extract", {"output_schema": wide}) == f"output_schema has more than {MAX_SCHEMA_VALUES} values"
    assert limit_error("extract", {"output_schema": {"type": "object"}}) is None
    assert limit_error("encode", {"score_items": []}) is None
