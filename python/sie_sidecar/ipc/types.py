# SPDX-License-Identifier: Apache-2.0
"""Typed bodies of the small IPC methods (wire-protocol §3.1, §3.2).

The backend may be older or newer than us, so every optional field takes the §3 default when it is
missing (or nil), unknown keys are ignored, and a field of the wrong type is a `DecodeError`: a
backend that answers nonsense must not turn into an `AttributeError` deep inside the dispatcher.
Each type also has `to_body()`, the map the reference backend writes (keys in spec order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from ..errors import DecodeError

READY: Final = "ready"
LOADING_STARTED: Final = "loading_started"
LOADING_IN_PROGRESS: Final = "loading_in_progress"
RETRY_LATER: Final = "retry_later"
FAILED: Final = "failed"

#: Every `EnsureModelReadyResponse.state` v0.7.1 defines (wire-protocol §3.2).
READINESS_STATES: Final = (READY, LOADING_STARTED, LOADING_IN_PROGRESS, RETRY_LATER, FAILED)


def _mapping(body: object, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise DecodeError(f"{what} must be a map, got {type(body).__name__}")
    return body


def _str(body: Mapping[str, Any], key: str, what: str, default: str) -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise DecodeError(f"{what} {key!r} must be a string")
    return value


def _opt_str(body: Mapping[str, Any], key: str, what: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise DecodeError(f"{what} {key!r} must be a string or nil")
    return value


def _bool(body: Mapping[str, Any], key: str, what: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DecodeError(f"{what} {key!r} must be a bool")
    return value


def _opt_uint(body: Mapping[str, Any], key: str, what: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DecodeError(f"{what} {key!r} must be an unsigned integer or nil")
    return value


def _float(body: Mapping[str, Any], key: str, what: str) -> float:
    value = body.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(f"{what} {key!r} must be a number")
    return float(value)


def _str_list(body: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    value = body.get(key)
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise DecodeError(f"{what} {key!r} must be an array of strings")
    return tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class PingResponse:
    """The backend's heartbeat answer; a minimal `{timestamp_ms, worker_id}` map is valid (TV-I10)."""

    timestamp_ms: float = 0.0
    worker_id: str = ""
    ready: bool = False
    bundle_config_hash: str = ""
    loaded_models: tuple[str, ...] = ()
    loading_models: tuple[str, ...] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PingResponse:
        what = "PingResponse"
        body = _mapping(body, what)
        return cls(
            timestamp_ms=_float(body, "timestamp_ms", what),
            worker_id=_str(body, "worker_id", what, ""),
            ready=_bool(body, "ready", what),
            bundle_config_hash=_str(body, "bundle_config_hash", what, ""),
            loaded_models=_str_list(body, "loaded_models", what),
            loading_models=_str_list(body, "loading_models", what),
        )

    def to_body(self) -> dict[str, Any]:
        """The v0.7.1 keys; `loading_models` (newer) only when non-empty."""
        body: dict[str, Any] = {
            "timestamp_ms": float(self.timestamp_ms),
            "worker_id": self.worker_id,
            "ready": self.ready,
            "bundle_config_hash": self.bundle_config_hash,
            "loaded_models": list(self.loaded_models),
        }
        if self.loading_models:
            body["loading_models"] = list(self.loading_models)
        return body


#: The GenerateEvent kinds of wire-protocol §5.2 (others are logged and ignored by the sidecar).
GENERATE_EVENT_KINDS: Final = ("publish", "ack", "nak", "in_progress", "done")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateEvent:
    """One event of a ProcessGenerate stream (§5.2); `kind` is required, the rest defaulted."""

    kind: str
    reply_subject: str = ""
    payload: bytes = b""
    delay_ms: int | None = None
    error: str | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> GenerateEvent:
        what = "GenerateEvent"
        body = _mapping(body, what)
        kind = body.get("kind")
        if not isinstance(kind, str):
            raise DecodeError(f"{what} 'kind' is required and must be a string")
        payload = body.get("payload")
        if payload is None:
            payload = b""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise DecodeError(f"{what} 'payload' must be binary")
        return cls(
            kind=kind,
            reply_subject=_str(body, "reply_subject", what, ""),
            payload=bytes(payload),
            delay_ms=_opt_uint(body, "delay_ms", what),
            error=_opt_str(body, "error", what),
        )

    def to_body(self) -> dict[str, Any]:
        """All five keys, as the Python backend writes them."""
        return {
            "kind": self.kind,
            "reply_subject": self.reply_subject,
            "payload": self.payload,
            "delay_ms": self.delay_ms,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigResponse:
    """ApplyModelConfig / ReplaceModelConfigs answer (§3.3, §3.4): `applied` and the hash are required;
    `applied_models` and `applied_profiles` are ReplaceModelConfigs only (empty for Apply)."""

    applied: bool
    bundle_config_hash: str
    config_version: int = 0
    applied_models: tuple[str, ...] = ()
    applied_profiles: tuple[str, ...] = ()
    unsupported_models: tuple[str, ...] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ConfigResponse:
        what = "ConfigResponse"
        body = _mapping(body, what)
        if not isinstance(body.get("applied"), bool):
            raise DecodeError(f"{what} 'applied' is required and must be a bool")
        if not isinstance(body.get("bundle_config_hash"), str):
            raise DecodeError(f"{what} 'bundle_config_hash' is required and must be a string")
        return cls(
            applied=body["applied"],
            bundle_config_hash=body["bundle_config_hash"],
            config_version=_opt_uint(body, "config_version", what) or 0,
            applied_models=_str_list(body, "applied_models", what),
            applied_profiles=_str_list(body, "applied_profiles", what),
            unsupported_models=_str_list(body, "unsupported_models", what),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDescriptor:
    """Per-model capabilities reported with `ready` (every field defaulted, wire-protocol §3.2)."""

    tokenizer_path: str | None = None
    tokenizer_id: str | None = None
    max_seq_len: int | None = None
    output_types: tuple[str, ...] = ()
    supports_run_batch: bool = False
    default_query_template: str | None = None
    default_doc_template: str | None = None
    max_concurrent_dispatch: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ModelDescriptor:
        what = "ModelDescriptor"
        body = _mapping(body, what)
        return cls(
            tokenizer_path=_opt_str(body, "tokenizer_path", what),
            tokenizer_id=_opt_str(body, "tokenizer_id", what),
            max_seq_len=_opt_uint(body, "max_seq_len", what),
            output_types=_str_list(body, "output_types", what),
            supports_run_batch=_bool(body, "supports_run_batch", what),
            default_query_template=_opt_str(body, "default_query_template", what),
            default_doc_template=_opt_str(body, "default_doc_template", what),
            max_concurrent_dispatch=_opt_uint(body, "max_concurrent_dispatch", what),
        )

    def to_body(self) -> dict[str, Any]:
        """The v0.7.1 keys in order; `max_concurrent_dispatch` (newer) only when set."""
        body: dict[str, Any] = {
            "tokenizer_path": self.tokenizer_path,
            "tokenizer_id": self.tokenizer_id,
            "max_seq_len": self.max_seq_len,
            "output_types": list(self.output_types),
            "supports_run_batch": self.supports_run_batch,
            "default_query_template": self.default_query_template,
            "default_doc_template": self.default_doc_template,
        }
        if self.max_concurrent_dispatch is not None:
            body["max_concurrent_dispatch"] = self.max_concurrent_dispatch
        return body


@dataclass(frozen=True, slots=True)
class ReadyResponse:
    """EnsureModelReady's answer; `batch_budget`, `descriptor` and `max_batch_tokens` only on `ready`."""

    state: str
    _: KW_ONLY
    batch_budget: int | None = None
    descriptor: ModelDescriptor | None = None
    max_batch_tokens: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ReadyResponse:
        what = "EnsureModelReadyResponse"
        body = _mapping(body, what)
        state = body.get("state")
        if not isinstance(state, str):
            raise DecodeError(f"{what} 'state' is required and must be a string")
        if state not in READINESS_STATES:
            raise DecodeError(f"{what} 'state' {state!r} is not one of {', '.join(READINESS_STATES)}")
        raw_descriptor = body.get("descriptor")
        return cls(
            state=state,
            batch_budget=_opt_uint(body, "batch_budget", what),
            descriptor=None if raw_descriptor is None else ModelDescriptor.from_body(raw_descriptor),
            max_batch_tokens=_opt_uint(body, "max_batch_tokens", what),
        )

    def to_body(self) -> dict[str, Any]:
        """`max_batch_tokens` (newer than v0.7.1) is written only when set."""
        body: dict[str, Any] = {
            "state": self.state,
            "batch_budget": self.batch_budget,
            "descriptor": None if self.descriptor is None else self.descriptor.to_body(),
        }
        if self.max_batch_tokens is not None:
            body["max_batch_tokens"] = self.max_batch_tokens
        return body


__all__ = [
    "FAILED",
    "LOADING_IN_PROGRESS",
    "LOADING_STARTED",
    "READINESS_STATES",
    "READY",
    "RETRY_LATER",
    "ModelDescriptor",
    "PingResponse",
    "ReadyResponse",
]
