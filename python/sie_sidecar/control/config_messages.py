# SPDX-License-Identifier: Apache-2.0
"""The live-config documents (sidecar-behaviour §9.1, §9.3), decoded into typed values.

A notification must carry its four identifying fields (`producer_id` or its alias `router_id`,
`bundle_id`, `epoch`, `bundle_config_hash`); everything else takes its default when missing or null.
A field of the wrong type is refused too: a notification we cannot read fully is never half-applied.
Config-service bodies default every field, as v0.7.1 does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ConfigServiceError, NotificationError

E = TypeVar("E", bound=Exception)

U64_MAX = (1 << 64) - 1


def normalise_pool(pool: str) -> str:
    """Trimmed, lowercase, empty → `default` (§9.2 step 7)."""
    return pool.strip().lower() or "default"


def _str(body: Mapping[str, Any], key: str, error: Callable[[str], E], default: str | None = "") -> str:
    value = body.get(key)
    if value is None:
        if default is None:
            raise error(f"{key!r} is required")
        return default
    if not isinstance(value, str):
        raise error(f"{key!r} must be a string")
    return value


def _u64(body: Mapping[str, Any], key: str, error: Callable[[str], E], *, required: bool) -> int:
    value = body.get(key)
    if value is None:
        if required:
            raise error(f"{key!r} is required")
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise error(f"{key!r} must be an unsigned 64-bit integer")
    return value


def _strs(body: Mapping[str, Any], key: str, error: Callable[[str], E]) -> tuple[str, ...]:
    value = body.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise error(f"{key!r} must be an array of strings")
    return tuple(value)


def _map_of(body: Mapping[str, Any], key: str, error: Callable[[str], E]) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(f"{key!r} must be an object")
    return value


def _str_map(value: Any, key: str, error: Callable[[str], E]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise error(f"{key!r} must map names to strings")
    return value


def _pool_hashes(body: Mapping[str, Any], error: Callable[[str], E]) -> dict[str, dict[str, str]]:
    key = "bundle_pool_config_hashes"
    return {bundle: _str_map(pools, key, error) for bundle, pools in _map_of(body, key, error).items()}


def _adapters(body: Mapping[str, Any], error: Callable[[str], E]) -> dict[str, tuple[str, ...]] | None:
    value = body.get("bundle_adapters")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise error("'bundle_adapters' must be an object")
    out: dict[str, tuple[str, ...]] = {}
    for bundle, modules in value.items():
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise error("'bundle_adapters' must map bundles to arrays of strings")
        out[bundle] = tuple(modules)
    return out


def control_plane_hash(
    bundle: str, pool: str, pool_hashes: Mapping[str, Mapping[str, str]], bundle_hash: str | None
) -> str:
    """The hash the control plane attests for our pool (§9.2 step 11): the bundle's per-pool entry
    (empty when the bundle is listed but our pool is not), else the bundle-wide hash."""
    if bundle in pool_hashes:
        return pool_hashes[bundle].get(pool, "")
    return bundle_hash or ""


@dataclass(frozen=True, slots=True)
class Notification:
    """One `sie.config.models.{bundle}` message (§9.1)."""

    producer_id: str
    bundle_id: str
    epoch: int
    bundle_config_hash: str
    bundle_pool_config_hashes: dict[str, dict[str, str]] = field(default_factory=dict)
    model_id: str = ""
    profiles_added: tuple[str, ...] = ()
    model_config: str = ""
    affected_bundles: tuple[str, ...] = ()
    pool: str | None = None
    bundle_adapters: dict[str, tuple[str, ...]] | None = None

    @property
    def epoch_bump(self) -> bool:
        """A notification without a config only raises the epoch (§9.1: blank after trimming)."""
        return not self.model_config.strip()


def parse_notification(data: bytes) -> Notification:
    """The §9.1 document, or `NotificationError` (outcome `parse_error`)."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise NotificationError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise NotificationError("a notification is a JSON object")
    error = NotificationError
    producer_key = "producer_id" if body.get("producer_id") is not None else "router_id"
    pool = body.get("pool")
    if pool is not None and not isinstance(pool, str):
        raise NotificationError("'pool' must be a string")
    return Notification(
        producer_id=_str(body, producer_key, error, default=None),
        bundle_id=_str(body, "bundle_id", error, default=None),
        epoch=_u64(body, "epoch", error, required=True),
        bundle_config_hash=_str(body, "bundle_config_hash", error, default=None),
        bundle_pool_config_hashes=_pool_hashes(body, error),
        model_id=_str(body, "model_id", error),
        profiles_added=_strs(body, "profiles_added", error),
        model_config=_str(body, "model_config", error),
        affected_bundles=_strs(body, "affected_bundles", error),
        pool=pool,
        bundle_adapters=_adapters(body, error),
    )


@dataclass(frozen=True, slots=True)
class EpochInfo:
    """`GET /v1/configs/epoch`: the control plane's epoch and its hashes' fingerprint."""

    epoch: int
    fingerprint: str


def parse_epoch(body: Any) -> EpochInfo:
    if not isinstance(body, dict):
        raise ConfigServiceError("shape: the epoch answer is not an object")
    error = _shape
    return EpochInfo(_u64(body, "epoch", error, required=False), _str(body, "bundle_config_hashes_hash", error))


@dataclass(frozen=True, slots=True)
class ExportedModel:
    model_id: str
    raw_yaml: str
    model_config: Any  # the parsed config when the service sends one, else None
    affected_bundles: tuple[str, ...]
    pool: str | None

    def pool_name(self) -> str:
        """The model's pool: its own field, else the config's `pool`, else `default`; normalised."""
        if self.pool is not None:
            return normalise_pool(self.pool)
        if isinstance(self.model_config, dict) and isinstance(self.model_config.get("pool"), str):
            return normalise_pool(self.model_config["pool"])
        return "default"

    def body(self) -> str | None:
        """What goes to the backend: the trimmed YAML, else the config as JSON; None when neither."""
        text = self.raw_yaml.strip()
        if text:
            return text
        if self.model_config is None:
            return None
        return json.dumps(self.model_config, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Export:
    """`GET /v1/configs/export`: the authoritative snapshot (§9.3)."""

    epoch: int
    bundle_config_hashes: dict[str, str]
    bundle_pool_config_hashes: dict[str, dict[str, str]]
    models: tuple[ExportedModel, ...]
    bundle_adapters: dict[str, tuple[str, ...]] | None


def _shape(detail: str) -> ConfigServiceError:
    return ConfigServiceError(f"shape: {detail}")


def parse_export(body: Any) -> Export:
    if not isinstance(body, dict):
        raise ConfigServiceError("shape: the export is not an object")
    error = _shape
    raw_models = body.get("models")
    if raw_models is None:
        raw_models = []
    if not isinstance(raw_models, list):
        raise _shape("'models' must be an array")
    models = []
    for entry in raw_models:
        if not isinstance(entry, dict):
            raise _shape("each model must be an object")
        pool = entry.get("pool")
        if pool is not None and not isinstance(pool, str):
            raise _shape("a model's 'pool' must be a string")
        models.append(
            ExportedModel(
                model_id=_str(entry, "model_id", error),
                raw_yaml=_str(entry, "raw_yaml", error),
                model_config=entry.get("model_config"),
                affected_bundles=_strs(entry, "affected_bundles", error),
                pool=pool,
            )
        )
    return Export(
        epoch=_u64(body, "epoch", error, required=False),
        bundle_config_hashes=_str_map(_map_of(body, "bundle_config_hashes", error), "bundle_config_hashes", error),
        bundle_pool_config_hashes=_pool_hashes(body, error),
        models=tuple(models),
        bundle_adapters=_adapters(body, error),
    )


__all__ = [
    "EpochInfo",
    "Export",
    "ExportedModel",
    "Notification",
    "control_plane_hash",
    "normalise_pool",
    "parse_epoch",
    "parse_export",
    "parse_notification",
]
