# SPDX-License-Identifier: Apache-2.0
"""The (model, profile) catalog rule of sidecar-behaviour §13 and the queue-depth migration."""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.telemetry import QUEUE_DEPTH, ModelCatalog, QueueDepth, Registry
from sie_sidecar.telemetry.catalog import OPERATIONS, closed, valid_model, valid_profile


def catalog(*allow: str) -> tuple[ModelCatalog, list[str]]:
    warnings: list[str] = []
    return ModelCatalog(allow, warn=warnings.append), warnings


def test_the_allowlist_seeds_default_profiles_and_anything_else_is_other_with_one_warning() -> None:
    c, warnings = catalog("bge-m3", " e5 ", "")
    assert c.pairs == {("bge-m3", "default"), ("e5", "default")}
    assert c.resolve("bge-m3") == ("bge-m3", "default")
    assert c.resolve("bge-m3", "default") == ("bge-m3", "default")
    assert c.resolve("bge-m3", "fast") == ("other", "other")
    assert c.resolve("unknown") == ("other", "other")
    assert c.resolve("also-unknown", "x") == ("other", "other")
    assert len(warnings) == 1


def test_at_most_256_pairs_are_admitted_for_the_process_lifetime() -> None:
    c, warnings = catalog()
    c.replace((f"m{i}", "default") for i in range(256))
    assert c.admitted == 256 and not warnings
    c.extend("m256")  # the 257th pair
    assert c.resolve("m256") == ("other", "other")
    assert c.resolve("m255") == ("m255", "default")
    assert len(warnings) == 1 and "256" in warnings[0]
    # An export that drops every pair does not give the room back: admission is permanent...
    c.replace([])
    assert c.resolve("m0") == ("other", "other")
    c.replace([("m999", "default")])
    assert c.pairs == frozenset()
    # ...and re-admitting a known pair is free.
    c.replace([("m0", "default"), ("m7", "default")])
    assert c.resolve("m0") == ("m0", "default") and c.resolve("m7") == ("m7", "default")
    assert len(warnings) == 1


def test_a_trusted_commit_extends_with_the_model_and_its_added_profiles() -> None:
    c, _ = catalog("a")
    c.extend("b", ["fast", ""])
    assert c.pairs == {("a", "default"), ("b", "default"), ("b", "fast")}
    c.extend("")  # an epoch bump names no model
    assert len(c.pairs) == 3


def test_a_full_export_replaces_the_catalog() -> None:
    c, _ = catalog("a")
    c.replace_export(["b", "c"], ["b:fast", "slow", "zzz:nope"])
    assert c.pairs == {
        ("b", "default"),
        ("c", "default"),
        ("b", "fast"),
        ("b", "slow"),
        ("c", "slow"),
    }
    assert c.resolve("a") == ("other", "other")  # removed


def test_model_profile_ids_resolve_and_ambiguous_ones_are_other() -> None:
    c, _ = catalog()
    c.replace([("org/model", "fast"), ("x", "p"), ("x:p", "default")])
    assert c.resolve("org/model:fast") == ("org/model", "fast")
    assert c.resolve("x:p") == ("other", "other")  # both (x, p) and (x:p, default) exist
    assert c.resolve("x", "p") == ("x", "p")


def test_invalid_labels_are_never_admitted() -> None:
    c, warnings = catalog()
    c.replace(
        [
            ("other", "default"),
            ("a..b", "default"),
            ("m" * 513, "default"),
            ("ok", "p" * 129),
            ("-lead", "default"),
            ("a:", "default"),
            ("ok", "with/slash"),
            ("spa ce", "default"),
            ("fine/model:v1.2_x-y", "default"),
        ]
    )
    assert c.pairs == {("fine/model:v1.2_x-y", "default")}
    assert len(warnings) == 1


@given(st.text(max_size=40))
def test_labels_follow_the_rule(label: str) -> None:
    segments = label.split(":")
    ok = (
        bool(label)
        and label != "other"
        and ".." not in label
        and all(s and s[0].isascii() and s[0].isalnum() for s in segments)
        and all(ch.isascii() and (ch.isalnum() or ch in "._-/") for s in segments for ch in s)
    )
    assert valid_model(label) == ok
    assert valid_profile(label) == (ok and "/" not in label)


def test_attrs_are_cached_until_the_catalog_changes_and_vocabularies_are_closed() -> None:
    c, _ = catalog("a")
    first = c.attrs("encode", "a", "")
    assert first == (("operation", "encode"), ("model", "a"), ("profile", "default"))
    assert c.attrs("encode", "a", "") is first
    assert c.attrs("summarise", "a")[0] == ("operation", "other")
    c.replace([])
    assert c.attrs("encode", "a", "") == (("operation", "encode"), ("model", "other"), ("profile", "other"))
    assert closed("generate", OPERATIONS) == "generate" and closed("x", OPERATIONS) == "other"


def test_queue_depth_is_read_at_snapshot_and_a_removed_pair_migrates_to_other() -> None:
    registry = Registry()
    c, _ = catalog("a", "b", "c")
    depth = QueueDepth(registry, c, QUEUE_DEPTH)
    pending = {"a": {"encode": 5}, "b": {"encode": 2}, "c": {"encode": 1}}
    for model in ("a", "b", "c"):
        depth.watch(model, functools.partial(pending.__getitem__, model))
    a = (("operation", "encode"), ("model", "a"), ("profile", "default"))
    other = (("operation", "encode"), ("model", "other"), ("profile", "other"))
    assert registry.value(QUEUE_DEPTH, a) == 0  # nothing recorded as items move
    registry.snapshot()
    assert registry.value(QUEUE_DEPTH, a) == 5
    c.replace([("b", "default")])
    pending["a"]["encode"] = 4
    registry.snapshot()
    assert registry.value(QUEUE_DEPTH, a) == 0
    assert registry.value(QUEUE_DEPTH, other) == 5  # a's 4 and c's 1: collapsed pairs add up
    assert registry.total(QUEUE_DEPTH) == 7
    pending["a"] = {}
    registry.snapshot()
    assert registry.value(QUEUE_DEPTH, other) == 1
