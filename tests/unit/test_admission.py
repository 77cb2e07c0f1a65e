# SPDX-License-Identifier: Apache-2.0
"""Pool admission decisions (sidecar-behaviour §8): the physical table row by row, logical pools,
the stale window, and fail-closed named pools."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.errors import PoolsResponseError
from sie_sidecar.pipeline.admission import Admission, PoolDecision, decide, item_admitted, pool_key

WORKER = "worker-7"


def pool(
    name: str | None,
    *,
    caps: Any = None,
    workers: Any = (WORKER,),
    queue_pool: str | None = None,
    status: bool = True,
) -> dict[str, Any]:
    spec: dict[str, Any] = {} if name is None else {"name": name}
    if caps is not None:
        spec["gpu_caps"] = caps
    if queue_pool is not None:
        spec["queue_pool"] = queue_pool
    entry: dict[str, Any] = {"spec": spec}
    if status:
        listed = workers if not isinstance(workers, tuple) else [{"name": w} for w in workers]
        entry["status"] = {"assigned_workers": listed}
    return entry


def physical(pools: list[Any], own: str = "gpu-a", profile: str = "l4") -> tuple[bool, str]:
    d = decide({"pools": pools}, pool=own, worker=WORKER, machine_profile=profile)
    return d.admitted, d.reason


@pytest.mark.parametrize(
    ("pools", "own", "expected"),
    [
        ([pool("other")], "gpu-a", (False, "pool_missing")),
        ([pool("other")], "default", (True, "pool_missing")),
        ([pool("gpu-a")], "gpu-a", (True, "uncapped")),
        ([pool("gpu-a", caps={})], "gpu-a", (True, "uncapped")),
        ([pool("gpu-a", caps={"a100": 2})], "gpu-a", (True, "profile_uncapped")),
        ([pool("gpu-a", caps={"L4": 0})], "gpu-a", (False, "cap_exhausted")),
        ([pool("gpu-a", caps={"l4": -1})], "gpu-a", (False, "cap_exhausted")),
        ([pool("gpu-a", caps={"l4": "0"})], "gpu-a", (False, "cap_exhausted")),
        ([pool("gpu-a", caps={"l4": "two"})], "gpu-a", (False, "malformed_gpu_cap")),
        ([pool("gpu-a", caps={"l4": 1.5})], "gpu-a", (False, "malformed_gpu_cap")),
        ([pool("gpu-a", caps={"l4": True})], "gpu-a", (False, "malformed_gpu_cap")),
        ([pool("gpu-a", caps={"l4": 2}, status=False)], "gpu-a", (False, "malformed_assigned_workers")),
        ([pool("gpu-a", caps={"l4": 2}, workers="w")], "gpu-a", (False, "malformed_assigned_workers")),
        ([pool("gpu-a", caps={"l4": "3"})], "gpu-a", (True, "assigned")),
        ([pool(" GPU-A ", caps={"l4": 2}, workers=(" Worker-7 ",))], "gpu-a", (True, "assigned")),
        ([pool("gpu-a", caps={"l4": 2}, workers=("worker-8",))], "gpu-a", (False, "not_assigned")),
        ([pool("gpu-a", caps={"l4": 2}, workers=[{"id": WORKER}, "x"])], "gpu-a", (False, "not_assigned")),
        ([pool(None), pool("gpu-a", caps={"l4": 1})], "gpu-a", (True, "assigned")),
    ],
)
def test_the_physical_decision_follows_the_table_row_by_row(
    pools: list[Any], own: str, expected: tuple[bool, str]
) -> None:
    assert physical(pools, own) == expected


def test_a_bare_array_is_a_pool_list_too_and_other_shapes_are_errors() -> None:
    assert decide([pool("gpu-a")], pool="gpu-a", worker=WORKER, machine_profile="l4").reason == "uncapped"
    bodies: list[Any] = [{"pools": {}}, {"items": []}, "pools", 3, None]
    for body in bodies:
        with pytest.raises(PoolsResponseError):
            decide(body, pool="gpu-a", worker=WORKER, machine_profile="l4")


def test_logical_pools_are_those_that_queue_onto_the_own_pool_and_list_this_worker() -> None:
    pools = [
        pool("gpu-a", caps={"l4": 0}),  # physically exhausted
        pool("tenant-x", queue_pool="GPU-A"),  # queues onto gpu-a, lists me: logical
        pool("tenant-y", queue_pool="gpu-a", workers=("someone-else",)),  # does not list me
        pool("tenant-z", queue_pool="gpu-b"),  # queues elsewhere
        pool("gpu-a-alias"),  # no queue_pool: its own name, so not onto gpu-a
    ]
    d = decide({"pools": pools}, pool="gpu-a", worker=WORKER, machine_profile="l4")
    assert (d.admitted, d.reason, d.logical) == (False, "cap_exhausted", frozenset({"tenant-x"}))
    assert d.pull_allowed  # a logical assignment is enough to pull
    rule = (d.admitted, "gpu-a", d.logical)
    assert [item_admitted(p, rule) for p in ["", "gpu-a", " Tenant-X ", "tenant-y"]] == [False, False, True, False]


def test_the_own_pool_is_never_one_of_its_logical_pools() -> None:
    unnamed_queue = pool("tenant-q", queue_pool="  ")  # blank: falls back to its name
    d = decide({"pools": [unnamed_queue]}, pool="tenant-q", worker=WORKER, machine_profile="l4")
    assert d.logical == frozenset()  # it is the own pool, never a logical one of itself


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_errors_keep_the_last_decision_inside_the_stale_window_then_fail_closed() -> None:
    clock = Clock()
    changes: list[bool] = []
    admission = Admission("gpu-a", stale_after_s=30.0, clock=clock)
    admission.on_change = lambda: changes.append(admission.decision.pull_allowed)
    assert admission.pull_reason() == "pool admission pending (the first gateway poll)"
    assert admission.decision == PoolDecision(False, "initial")
    admission.record(PoolDecision(True, "assigned", frozenset({"tenant-x"})))
    assert admission.pull_reason() is None and changes == [True]
    clock.now += 29.0
    admission.record_error("HTTP 503")
    assert admission.decision.reason == "assigned" and admission.decision.logical == frozenset({"tenant-x"})
    clock.now += 2.0  # 31 s after the last success
    admission.record_error("HTTP 503")
    assert admission.decision == PoolDecision(False, "status_error:HTTP 503")
    assert admission.pull_reason() == "pool not admitted (status_error:HTTP 503)"
    assert changes == [True, False] and admission.errors == 2


def test_the_default_pool_keeps_pulling_through_errors_and_starts_admitted() -> None:
    admission = Admission(" Default ", stale_after_s=0.0)
    assert admission.decision.admitted and admission.decision.reason == "initial"
    admission.record_error("timeout")
    assert admission.pull_reason() is None
    assert admission.decision == PoolDecision(True, "status_error:timeout")


def test_a_first_poll_that_fails_leaves_a_named_pool_closed_and_ends_the_pending_state() -> None:
    admission = Admission("gpu-a")
    admission.record_error("connection refused")
    assert admission.polled and admission.pull_reason() == "pool not admitted (status_error:connection refused)"


@given(name=st.text(max_size=12))
def test_pool_keys_are_trimmed_and_lowercase(name: str) -> None:
    key = pool_key(name)
    assert key == pool_key(f" {name}\t\u3000") == key.lower()
    assert key == key.strip(" \t\n\r\u3000")
