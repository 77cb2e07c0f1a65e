# SPDX-License-Identifier: Apache-2.0
"""The bounded (model, profile) catalog behind every model/profile attribute (sidecar-behaviour §13).

A metric backend pays per series, and model ids come from work items, that is from customers. So
model/profile attributes are exact pairs from a catalog the operator or the control plane vouched
for: seeded from `SIE_METRIC_MODEL_ALLOWLIST` (profile `default`), extended only after a trusted
live config commit, replaced by each successful full export. At most `limit` (256) distinct pairs
are ever admitted in the process's life (admission is permanent, re-admitting one is free), so the
series count stays bounded however often the catalog changes. Anything else (unknown, invalid,
removed, ambiguous, over the limit) records as `(other, other)`, with at most one warning.

Recording sites resolve once per batch; `attrs` caches the resolved tuple until the catalog changes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from .registry import Attrs, Gauge, Registry

log = logging.getLogger(__name__)

OTHER: Final = "other"
DEFAULT_PROFILE: Final = "default"
MAX_PAIRS: Final = 256
MAX_MODEL_BYTES: Final = 512
MAX_PROFILE_BYTES: Final = 128
#: Closed vocabularies (§13): anything else records as `other`.
OPERATIONS: Final = frozenset({"encode", "score", "extract", "embeddings", "moderations", "generate"})
FLUSH_REASONS: Final = frozenset(
    {"cost_cap", "count_cap", "timeout", "coalesce", "single_oversize", "idle_bypass", "drain"}
)
#: IPC methods by their snake_case (§13); the other methods report `other`.
IPC_METHODS: Final = frozenset(
    {
        "apply_model_config",
        "drain",
        "ensure_model_ready",
        "ping",
        "process_encode_batch",
        "process_extract_batch",
        "process_generate",
        "process_score_batch",
        "replace_model_configs",
        "run_batch",
        "set_pinned_models",
        "signal_generate_cancel",
        "worker_capabilities",
    }
)

_MODEL_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*\Z")
_PROFILE_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
Pair = tuple[str, str]


def closed(value: str, vocabulary: frozenset[str]) -> str:
    """`value` when the closed vocabulary has it, else `other`."""
    return value if value in vocabulary else OTHER


def _valid(label: str, limit: int, segment: re.Pattern[str]) -> bool:
    if not label or label == OTHER or ".." in label or len(label.encode("utf-8")) > limit:
        return False
    return all(segment.match(part) for part in label.split(":"))


def valid_model(label: str) -> bool:
    """§13's model label rule: ≤512 bytes, not `other`, no `..`, every `:` segment `[A-Za-z0-9][A-Za-z0-9._/-]*`."""
    return _valid(label, MAX_MODEL_BYTES, _MODEL_SEGMENT)


def valid_profile(label: str) -> bool:
    """The profile rule: as the model's, ≤128 bytes and without `/`."""
    return _valid(label, MAX_PROFILE_BYTES, _PROFILE_SEGMENT)


class ModelCatalog:
    """The admitted and the current (model, profile) pairs, and the resolution of a batch's labels."""

    def __init__(
        self, allowlist: Iterable[str] = (), *, limit: int = MAX_PAIRS, warn: Callable[[str], None] | None = None
    ) -> None:
        self.limit = limit
        self._admitted: set[Pair] = set()  # every pair ever admitted (never shrinks)
        self._current: set[Pair] = set()
        self._warn = warn if warn is not None else log.warning
        self._warned = False
        self._cache: dict[tuple[str, str, str], Attrs] = {}
        #: Bumped whenever the current pairs change (what a cached resolution depends on).
        self.version = 0
        self.replace((m.strip(), DEFAULT_PROFILE) for m in allowlist if m.strip())

    @property
    def pairs(self) -> frozenset[Pair]:
        return frozenset(self._current)

    @property
    def admitted(self) -> int:
        return len(self._admitted)

    def _admit(self, pair: Pair) -> bool:
        model, profile = pair
        if not (valid_model(model) and valid_profile(profile)):
            self._collapse(f"invalid model/profile label {model[:64]!r}/{profile[:64]!r}")
            return False
        if pair in self._admitted:
            return True
        if len(self._admitted) >= self.limit:
            self._collapse(f"over {self.limit} (model, profile) pairs at {model[:64]!r}/{profile[:64]!r}")
            return False
        self._admitted.add(pair)
        return True

    def _changed(self) -> None:
        self.version += 1
        self._cache.clear()

    def extend(self, model: str, profiles: Iterable[str] = ()) -> None:
        """A trusted live config commit (§9.2 step 12): the model, with `default` and each added profile."""
        if not model:
            return
        wanted = [(model, DEFAULT_PROFILE), *((model, p or DEFAULT_PROFILE) for p in profiles)]
        added = [pair for pair in wanted if pair not in self._current and self._admit(pair)]
        if added:
            self._current.update(added)
            self._changed()

    def replace(self, pairs: Iterable[Pair]) -> None:
        """A successful full export (or the start-up seed): exactly these pairs, within the limit."""
        current = {pair for pair in ((m, p or DEFAULT_PROFILE) for m, p in pairs) if self._admit(pair)}
        if current != self._current:
            self._current = current
            self._changed()

    def replace_export(self, models: Iterable[str], profiles: Iterable[str]) -> None:
        """An export's `applied_models` / `applied_profiles`: every model with `default`; a
        `model:profile` profile id goes with its model, a bare profile name with every applied model."""
        applied = [m for m in models if m]
        pairs: list[Pair] = [(m, DEFAULT_PROFILE) for m in applied]
        for profile in profiles:
            model, sep, name = profile.rpartition(":")
            if sep and model in applied:
                pairs.append((model, name))
            elif not sep:
                pairs.extend((m, profile) for m in applied)
        self.replace(pairs)

    def resolve(self, model: str, profile: str = "") -> Pair:
        """The pair to record: exact, or a `model:profile` id split at its last `:`; `(other, other)`
        for anything not current or resolving two ways."""
        profile = profile or DEFAULT_PROFILE
        exact = (model, profile) in self._current
        head, sep, tail = model.rpartition(":")
        alias = bool(sep) and profile == DEFAULT_PROFILE and (head, tail) in self._current
        if exact and not alias:
            return model, profile
        if alias and not exact:
            return head, tail
        self._collapse(
            f"model {model[:64]!r} profile {profile[:64]!r} is {'ambiguous' if exact else 'not in the catalog'}"
        )
        return OTHER, OTHER

    def _collapse(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            self._warn(f"telemetry: {why}; recorded as (other, other) (this warning is logged once)")

    def attrs(self, operation: str, model: str, profile: str = "") -> Attrs:
        """`(operation, model, profile)` attributes, resolved and cached until the catalog changes."""
        key = (operation, model, profile)
        found = self._cache.get(key)
        if found is None:
            m, p = self.resolve(model, profile)
            found = self._cache[key] = (("operation", closed(operation, OPERATIONS)), ("model", m), ("profile", p))
        return found

    def model_attrs(self, model: str, profile: str = "") -> Attrs:
        """`(model, profile)` attributes (the scheduler's adaptive gauges, generation loading)."""
        return self.attrs("", model, profile)[1:]


class QueueDepth:
    """`sie.worker.queue.depth` by (operation, model, profile), read from each model's scheduler when
    a snapshot is taken (an asynchronous gauge): nothing is recorded as groups queue and batches
    leave, and the depth of a pair that left the catalog shows under `(other, other)` at the next
    snapshot. Models whose pairs collapse to the same attributes add up."""

    def __init__(self, registry: Registry, catalog: ModelCatalog, name: str) -> None:
        self._catalog, self._name = catalog, name
        self._sources: dict[str, Callable[[], Mapping[str, int]]] = {}
        self._shown: dict[Attrs, Gauge] = {}
        registry.observe(self._observe)

    def watch(self, model: str, pending: Callable[[], Mapping[str, int]]) -> None:
        """`pending()`: the model's items queued per operation, now."""
        self._sources[model] = pending

    def _observe(self, registry: Registry) -> None:
        totals: dict[Attrs, int] = {}
        for model, pending in self._sources.items():
            for operation, n in pending().items():
                attrs = self._catalog.attrs(operation, model)
                totals[attrs] = totals.get(attrs, 0) + n
        for attrs, shown in self._shown.items():
            if attrs not in totals:
                shown.set(0)
        for attrs, n in totals.items():
            gauge = self._shown.get(attrs)
            if gauge is None:
                gauge = self._shown[attrs] = registry.gauge(self._name, attrs)
            gauge.set(n)


__all__ = [
    "DEFAULT_PROFILE",
    "FLUSH_REASONS",
    "IPC_METHODS",
    "MAX_PAIRS",
    "OPERATIONS",
    "OTHER",
    "ModelCatalog",
    "QueueDepth",
    "closed",
    "valid_model",
    "valid_profile",
]
