# SPDX-License-Identifier: Apache-2.0
"""The model-configuration methods of the IPC server (wire-protocol §3.3-3.5): `ApplyModelConfig`,
`ReplaceModelConfigs`, `SetPinnedModels`.

The server decodes and checks each request here (a malformed body is `bad body for <Method>:
<detail>` before any adapter code runs), hands the typed request to the adapter's hook, and writes
the hook's answer back in the spec's key order with its defaults. An adapter without the hook gets
a typed "not supported" error (`NotImplementedError: <Method> is not supported by this backend`).
What a config *means* (registry updates) is the adapter's: the library only carries it, after one
check the real server makes: the text must be a YAML mapping, and a non-empty `model_id` must equal
its `sie_id` when the config names one (`model_id mismatch`, wire-protocol §3.3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from .bodies import BadBody, opt_str_list, req_list, req_str, req_uint


@dataclass(frozen=True, slots=True)
class ApplyModelConfigRequest:
    """One model's config delta (§3.3)."""

    bundle_id: str
    model_id: str
    epoch: int
    bundle_config_hash: str
    model_config: str  # YAML text, for the adapter to parse
    profiles_added: tuple[str, ...] = ()
    bundle_adapters: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ModelConfigEntry:
    model_id: str
    model_config: str


@dataclass(frozen=True, slots=True)
class ReplaceModelConfigsRequest:
    """An authoritative snapshot of a bundle's model configs (§3.4; an empty `models` is an empty snapshot)."""

    bundle_id: str
    epoch: int
    bundle_config_hash: str
    models: tuple[ModelConfigEntry, ...]
    bundle_adapters: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ConfigApplied:
    """What an adapter's config hook answers (ApplyModelConfig and ReplaceModelConfigs responses)."""

    applied: bool
    bundle_config_hash: str
    config_version: int = 0
    unsupported_models: Sequence[str] = ()
    #: ReplaceModelConfigs only.
    applied_models: Sequence[str] = ()
    applied_profiles: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class PinnedApplied:
    """SetPinnedModels response (§3.5)."""

    applied: bool
    pinned_count: int = 0


def _config_text(body: Mapping[str, Any], where: str = "") -> str:
    """The YAML text of `model_config`, checked: not blank, a mapping, and naming the request's
    `model_id` as its `sie_id` when both are given."""
    field = f"{where + '.' if where else ''}model_config"
    text = req_str(body, "model_config", where)
    if not text.strip():
        raise BadBody(f"{field} must not be blank")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        raise BadBody(f"{field} is not valid YAML") from None
    if not isinstance(config, dict):
        raise BadBody(f"{field} must be a YAML mapping")
    model_id = body.get("model_id")
    sie_id = config.get("sie_id")
    if isinstance(model_id, str) and model_id and isinstance(sie_id, str) and sie_id and sie_id != model_id:
        raise BadBody(f"model_id mismatch: {field} is for {sie_id!r}, not {model_id!r}")
    return text


def decode_apply_model_config(body: Mapping[str, Any]) -> ApplyModelConfigRequest:
    bundle_id = req_str(body, "bundle_id")
    if not bundle_id:
        raise BadBody("bundle_id must not be empty")
    profiles = opt_str_list(body, "profiles_added")
    return ApplyModelConfigRequest(
        bundle_id=bundle_id,
        model_id=req_str(body, "model_id"),
        epoch=req_uint(body, "epoch"),
        bundle_config_hash=req_str(body, "bundle_config_hash"),
        model_config=_config_text(body),
        profiles_added=profiles or (),
        bundle_adapters=opt_str_list(body, "bundle_adapters"),
    )


def decode_replace_model_configs(body: Mapping[str, Any]) -> ReplaceModelConfigsRequest:
    models = []
    # Strictly required (Appendix: a missing key must not read as an empty snapshot).
    for n, entry in enumerate(req_list(body, "models")):
        where = f"models[{n}]"
        if not isinstance(entry, dict):
            raise BadBody(f"{where} must be a map")
        models.append(ModelConfigEntry(req_str(entry, "model_id", where), _config_text(entry, where)))
    return ReplaceModelConfigsRequest(
        bundle_id=req_str(body, "bundle_id"),
        epoch=req_uint(body, "epoch"),
        bundle_config_hash=req_str(body, "bundle_config_hash"),
        models=tuple(models),
        bundle_adapters=opt_str_list(body, "bundle_adapters"),
    )


def decode_set_pinned_models(body: Mapping[str, Any]) -> tuple[str, ...]:
    models = req_list(body, "models")
    if not all(isinstance(m, str) for m in models):
        raise BadBody("models must be an array of strings")
    return tuple(models)


def _checked(answer: object, cls: type[Any], method: str) -> Any:
    if not isinstance(answer, cls):
        raise TypeError(f"the adapter's {method} hook must return {cls.__name__}, got {type(answer).__name__}")
    return answer


def apply_response(answer: object) -> dict[str, Any]:
    a: ConfigApplied = _checked(answer, ConfigApplied, "ApplyModelConfig")
    return {
        "applied": a.applied,
        "bundle_config_hash": a.bundle_config_hash,
        "config_version": a.config_version,
        "unsupported_models": sorted(a.unsupported_models),
    }


def replace_response(answer: object) -> dict[str, Any]:
    a: ConfigApplied = _checked(answer, ConfigApplied, "ReplaceModelConfigs")
    return {
        "applied": a.applied,
        "bundle_config_hash": a.bundle_config_hash,
        "config_version": a.config_version,
        "applied_models": list(a.applied_models),
        "applied_profiles": list(a.applied_profiles),
        "unsupported_models": sorted(a.unsupported_models),
    }


def pinned_response(answer: object) -> dict[str, Any]:
    a: PinnedApplied = _checked(answer, PinnedApplied, "SetPinnedModels")
    return {"applied": a.applied, "pinned_count": a.pinned_count}


__all__ = [
    "ApplyModelConfigRequest",
    "ConfigApplied",
    "ModelConfigEntry",
    "PinnedApplied",
    "ReplaceModelConfigsRequest",
    "apply_response",
    "decode_apply_model_config",
    "decode_replace_model_configs",
    "decode_set_pinned_models",
    "pinned_response",
    "replace_response",
]
