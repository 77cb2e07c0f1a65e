# SPDX-License-Identifier: Apache-2.0
"""LoRA keys (scheduler-and-prep §1.1, §10 cases 28, 29, 34): which batcher of a model an item joins.

Only a non-empty string under `options["lora"]` names an adapter, byte for byte; everything else is
the base weights, so malformed clients cannot fragment a model's batchers. Score always runs on base.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sie_sidecar.ipc.requests import lora_from_options, lora_key
from sie_sidecar.sched.scheduler import Formed, ModelScheduler, SchedulerConfig
from sie_sidecar.wire.workitem import WorkItem

#: (options, expected key): the §1.1 table and the §10 case 34 list.
OPTION_CASES: list[tuple[Any, str]] = [
    (None, ""),  # options absent / null
    ({}, ""),  # object without `lora`
    ({"pooling": "cls"}, ""),
    ({"lora": None}, ""),  # non-string values: base
    ({"lora": 7}, ""),
    ({"lora": 1.5}, ""),
    ({"lora": True}, ""),
    ({"lora": {"name": "a"}}, ""),
    ({"lora": ["a"]}, ""),
    ({"lora": b"adapter"}, ""),  # bytes are not a string either
    ({"lora": ""}, ""),  # the empty string normalises to base
    ({"lora": "adapter-a"}, "adapter-a"),
    ({"lora": "Adapter-A"}, "Adapter-A"),  # case-sensitive
    ({"lora": " adapter-a "}, " adapter-a "),  # byte-exact: no trimming
    ({"lora": "ü/ß"}, "ü/ß"),
]


def item(operation: str, options: dict[str, Any] | None) -> WorkItem:
    return WorkItem(
        work_item_id="w",
        request_id="r",
        item_index=0,
        total_items=1,
        operation=operation,
        model_id="m",
        pool_name="p",
        machine_profile="gpu",
        reply_subject="reply",
        options=options,
    )


@pytest.mark.parametrize(("options", "expected"), OPTION_CASES)
def test_lora_from_options(options: Any, expected: str) -> None:
    assert lora_from_options(options) == expected


@pytest.mark.parametrize("options", ["lora", ["lora", "a"], 3, ("lora", "a")])
def test_options_that_are_not_a_map_mean_base(options: Any) -> None:
    assert lora_from_options(options) == ""


@pytest.mark.parametrize("operation", ["encode", "extract"])
@pytest.mark.parametrize(("options", "expected"), [c for c in OPTION_CASES if c[0] is None or isinstance(c[0], dict)])
def test_encode_and_extract_items_are_keyed_per_lora(operation: str, options: Any, expected: str) -> None:
    assert lora_key(item(operation, options)) == expected


@pytest.mark.parametrize("options", [None, {"lora": "adapter-a"}, {"lora": ""}, {"lora": 3}])
def test_score_items_always_use_the_base_key(options: dict[str, Any] | None) -> None:
    assert lora_key(item("score", options)) == ""


async def test_an_empty_lora_joins_the_base_batcher() -> None:
    """Case 29: `""`, an absent option and a malformed one form one batch with the base items; a
    named adapter gets its own batcher (case 28)."""
    batches: list[Formed[str]] = []

    async def dispatch(formed: Formed[str]) -> float | None:
        batches.append(formed)
        return None

    config = SchedulerConfig(idle_bypass=False, max_batch_wait_ms=60_000.0, coalesce_ms=60_000.0, max_batch_cost=5)
    scheduler: ModelScheduler[str] = ModelScheduler("m", dispatch, config)
    named: list[tuple[str, dict[str, Any] | None]] = [
        ("absent", None),
        ("no-key", {}),
        ("empty", {"lora": ""}),
        ("number", {"lora": 4}),
        ("adapter", {"lora": "a"}),
    ]
    for name, options in named:
        scheduler.submit("encode", lora_key(item("encode", options)), [name], [1])
    assert sorted(scheduler._formers) == [("encode", ""), ("encode", "a")]
    scheduler.submit("encode", "", ["fifth"], [1])  # the base batcher reaches its cost cap (5)
    async with asyncio.timeout(5):
        while not batches:
            await asyncio.sleep(0.001)
    assert (batches[0].lora, sorted(batches[0].items)) == ("", ["absent", "empty", "fifth", "no-key", "number"])
    assert scheduler.pending_for("encode", "a") == 1
    await scheduler.close(0.5)
