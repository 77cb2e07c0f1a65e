# SPDX-License-Identifier: Apache-2.0
"""A bundle's model-config registry for backends that keep configs as text (the reference backend).

It answers ApplyModelConfig and ReplaceModelConfigs (wire-protocol §3.3, §3.4) with the hash of what
it now holds, so the sidecar's hash commit rules (§9.2 steps 11-12) meet a backend that can agree or
disagree with the control plane. The hash is the lowercase hex SHA-256 over the bundle id and the
entries sorted by model id, every string prefixed by its UTF-8 length as a little-endian u64 and the
entry count written as one before the entries: a control plane (or a test's config service) that
holds the same configs computes the same hash with `registry_hash`.

What a config means is the adapter's. This registry reads three marker lines, so tests and demos can
drive every answer: `unsupported: true` lists the model in `unsupported_models`, `reject: true` makes
the write answer `applied=false` (nothing changes), and `invalid: true` fails it with an error.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping

from .model_config import ApplyModelConfigRequest, ConfigApplied, ReplaceModelConfigsRequest

UNSUPPORTED_MARKER = "unsupported: true"
REJECT_MARKER = "reject: true"
INVALID_MARKER = "invalid: true"


def _field(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def registry_hash(bundle_id: str, configs: Mapping[str, str]) -> str:
    """The hash a registry holding `configs` (model id → config text) reports; "" when empty."""
    if not configs:
        return ""
    parts = [_field(bundle_id), struct.pack("<Q", len(configs))]
    for model_id in sorted(configs):
        parts += (_field(model_id), _field(configs[model_id]))
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _has(text: str, marker: str) -> bool:
    return any(line.strip().lower() == marker for line in text.splitlines())


class ModelConfigRegistry:
    """Configs by model id for one bundle, a version counter, and the profiles configs created."""

    def __init__(self) -> None:
        self.bundle_id = ""
        self.configs: dict[str, str] = {}
        self.profiles: dict[str, tuple[str, ...]] = {}
        self.version = 0
        self.writes = 0

    @property
    def bundle_config_hash(self) -> str:
        return registry_hash(self.bundle_id, self.configs)

    def unsupported(self) -> list[str]:
        return sorted(m for m, text in self.configs.items() if _has(text, UNSUPPORTED_MARKER))

    def _refusal(self, texts: Iterable[str]) -> ConfigApplied | None:
        texts = list(texts)
        if any(_has(t, INVALID_MARKER) for t in texts):
            raise ValueError("model config refused: invalid")
        if any(_has(t, REJECT_MARKER) for t in texts):
            return ConfigApplied(False, self.bundle_config_hash, self.version, self.unsupported())
        return None

    def apply(self, request: ApplyModelConfigRequest) -> ConfigApplied:
        """One model's delta: its config replaced, its profiles added."""
        refused = self._refusal([request.model_config])
        if refused is not None:
            return refused
        if self.bundle_id != request.bundle_id:
            self.bundle_id, self.configs, self.profiles = request.bundle_id, {}, {}
        self.configs[request.model_id] = request.model_config
        self.profiles[request.model_id] = tuple(request.profiles_added)
        self.version += 1
        self.writes += 1
        return ConfigApplied(True, self.bundle_config_hash, self.version, self.unsupported())

    def replace(self, request: ReplaceModelConfigsRequest) -> ConfigApplied:
        """An authoritative snapshot: exactly these configs afterwards."""
        refused = self._refusal(entry.model_config for entry in request.models)
        if refused is not None:
            return refused
        self.bundle_id = request.bundle_id
        self.configs = {entry.model_id: entry.model_config for entry in request.models}
        self.profiles = {m: self.profiles.get(m, ()) for m in self.configs}
        self.version += 1
        self.writes += 1
        return ConfigApplied(
            True,
            self.bundle_config_hash,
            self.version,
            self.unsupported(),
            applied_models=sorted(self.configs),
            applied_profiles=sorted({p for ps in self.profiles.values() for p in ps}),
        )


__all__ = ["INVALID_MARKER", "REJECT_MARKER", "UNSUPPORTED_MARKER", "ModelConfigRegistry", "registry_hash"]
