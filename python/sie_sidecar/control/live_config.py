# SPDX-License-Identifier: Apache-2.0
"""Live config (sidecar-behaviour §9.2-9.4): notifications and exports turned into backend writes and
commits of the advertised (epoch, hash, unsupported models) state.

Every write runs under the execution barrier's exclusive side, so no batch executes while the
backend holds a half-applied config, and the commit happens in the same critical section as the
write it attests. A write that the backend answers with a different hash than the control plane's
commits nothing: the old hash stays advertised and work pinned to the new one is NAKed at the gate
(quarantine) until a later write or export agrees. Each outcome is one `sie.worker.config.applies`
count (`source`, `operation`, `outcome`), and `degraded` follows the §13 rule.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ..errors import IpcTimeout, IpcTransportError, NotificationError
from ..pipeline.config_gate import ConfigState
from ..telemetry import Registry
from .config_messages import Export, Notification, control_plane_hash, normalise_pool, parse_notification
from .export_signature import export_signature

log = logging.getLogger(__name__)

#: A model config larger than this is refused before any IPC (§9.2 step 8, §9.3).
MAX_MODEL_CONFIG_BYTES: Final = 1_048_576
#: The apply retry of §9.2 step 9: 250 ms, doubling, capped at 5 s, until shutdown.
RETRY_FIRST_S: Final = 0.25
RETRY_MAX_S: Final = 5.0

APPLIES: Final = "sie.worker.config.applies"
EPOCH: Final = "sie.worker.config.epoch"
DEGRADED: Final = "sie.worker.config.degraded"

#: Outcomes that set / clear the degraded gauge (§13); the others leave it.
_DEGRADING: Final = frozenset(
    {"client_error", "fetch_error", "epoch_error", "apply_error", "apply_rejected", "hash_mismatch", "partial"}
)
_HEALTHY: Final = frozenset({"applied", "no_change", "no_relevant_models"})
#: Outcomes after which the control plane is probably ahead of us: the reconciler looks at once.
BEHIND: Final = frozenset({"apply_error", "apply_rejected", "hash_mismatch"})


class ConfigAnswer(Protocol):
    """What a backend write answers (ipc.types.ConfigResponse, or a multi-child merge)."""

    @property
    def applied(self) -> bool: ...
    @property
    def bundle_config_hash(self) -> str: ...
    @property
    def applied_models(self) -> Sequence[str]: ...
    @property
    def applied_profiles(self) -> Sequence[str]: ...
    @property
    def unsupported_models(self) -> Sequence[str]: ...


class ConfigBackend(Protocol):
    """The backend's config methods (one IPC client, or the fan-out over every child)."""

    async def apply_model_config(self, body: dict[str, Any]) -> ConfigAnswer: ...

    async def replace_model_configs(self, body: dict[str, Any]) -> ConfigAnswer: ...


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """Why an export is applied: `forced` may lower the epoch (a rewind), `periodic` may skip the IPC."""

    reason: str
    forced: bool = False
    periodic: bool = False


class _Shutdown(Exception):
    """The stop signal arrived while a write was being retried: nothing advanced."""


def trusted(producer: str, allow_list: Sequence[str]) -> bool:
    """§9.2 step 3: any producer with an empty list, else an entry exactly or an entry plus `-suffix`."""
    if not allow_list:
        return True
    return any(producer == entry or producer.startswith(entry + "-") for entry in allow_list)


def untrusted_envelope(reply: str, headers: Iterable[str]) -> bool:
    """§9.2 step 1: a notification is a plain publish; a reply subject or a `Nats-` header means it
    was sent as something else (a request, a JetStream republish) and is dropped."""
    return bool(reply) or any(h.lower().startswith("nats-") for h in headers)


class LiveConfig:
    """The worker's side of live config: one per process, shared by the subscriber and the reconciler."""

    def __init__(
        self,
        state: ConfigState,
        backend: ConfigBackend,
        *,
        bundle: str,
        pool: str,
        allow_list: Sequence[str],
        stop: asyncio.Event,
        telemetry: Registry | None = None,
        on_behind: Callable[[], None] | None = None,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.state = state
        self.backend = backend
        self.bundle = bundle
        self.pool = normalise_pool(pool)
        self.allow_list = tuple(allow_list)
        self._stop = stop
        self.telemetry = telemetry or Registry()
        self.on_behind = on_behind
        self.on_commit = on_commit
        self._degraded: dict[str, bool] = {}
        self.last_signature: str | None = None
        self.last_outcome: dict[str, str] = {}
        #: `source/operation/outcome` → count, for /debug/state (the telemetry counter has the same).
        self.counts: collections.Counter[str] = collections.Counter()

    # -- recording ----------------------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        """Whether the last outcome of either source left the config degraded (§13)."""
        return any(self._degraded.values())

    def snapshot(self) -> dict[str, object]:
        """For /debug/state."""
        return {
            "degraded": self.degraded,
            "last_outcome": dict(self.last_outcome),
            "outcomes": dict(self.counts),
        } | self.state.snapshot()

    def record(self, source: str, operation: str, outcome: str, **details: object) -> str:
        """Count one outcome, move `degraded`, log it; returns the outcome."""
        attrs = (("source", source), ("operation", operation), ("outcome", outcome))
        self.telemetry.add(APPLIES, 1, attrs)
        if outcome in _DEGRADING:
            self._degraded[source] = True
        elif outcome in _HEALTHY:
            self._degraded[source] = False
        self.telemetry.set(DEGRADED, float(self._degraded.get(source, False)), (("source", source),))
        self.telemetry.set(EPOCH, float(self.state.epoch), (("source", source),))
        self.last_outcome[source] = outcome
        self.counts[f"{source}/{operation}/{outcome}"] += 1
        extra = {"source": source, "operation": operation, "outcome": outcome, "epoch": self.state.epoch} | details
        if outcome in _DEGRADING:
            log.warning("config write not applied", extra=extra)
        elif outcome in ("applied", "shutdown"):
            log.info("config " + outcome, extra=extra)
        else:
            log.debug("config skipped", extra=extra)
        # A notification that did not apply means the control plane is ahead: look now. An export's
        # own failure does not wake it (that would repeat the export at once, §9.3: once per poll).
        if outcome in BEHIND and source == "notification" and self.on_behind is not None:
            self.on_behind()
        return outcome

    # -- the retry of §9.2 step 9 -------------------------------------------------------------

    async def _retrying(self, call: Callable[[], Awaitable[ConfigAnswer]]) -> ConfigAnswer:
        """The write, retried on transient IPC failures (the §9.2 transport kinds and timeouts) 250 ms
        doubling to 5 s until it answers or the stop signal arrives (`_Shutdown`). Server errors,
        undecodable answers and other transport failures are not transient: they raise."""
        delay = RETRY_FIRST_S
        attempt = 0
        while True:
            if self._stop.is_set():
                raise _Shutdown
            try:
                return await call()
            except (IpcTransportError, IpcTimeout) as exc:
                if isinstance(exc, IpcTransportError) and not exc.transient:
                    raise  # a closed client, a permission error, a bad path: `apply_error`
                attempt += 1
                if attempt in (1, 5) or attempt % 30 == 0:
                    log.warning("config write: backend unreachable, retrying", extra={"error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, RETRY_MAX_S)

    # -- notifications (§9.2) -----------------------------------------------------------------

    async def handle_notification(self, data: bytes, *, reply: str = "", headers: Iterable[str] = ()) -> str:
        """The twelve checks of §9.2 in order; returns the outcome."""
        source = "notification"
        if untrusted_envelope(reply, headers):
            return self.record(source, "model_config", "rejected_untrusted", why="reply subject or Nats- header")
        try:
            note = parse_notification(data)
        except NotificationError as exc:
            return self.record(source, "unknown", "parse_error", error=str(exc))
        operation = "epoch_bump" if note.epoch_bump else "model_config"
        if not trusted(note.producer_id, self.allow_list):
            return self.record(source, operation, "rejected_untrusted", producer=note.producer_id)
        if note.bundle_id != self.bundle:
            return self.record(source, operation, "rejected_bundle", bundle=note.bundle_id)
        if self.state.is_stale(note.epoch):
            return self.record(source, operation, "stale", notified_epoch=note.epoch)
        if note.epoch_bump:
            async with self.state.barrier.exclusive():
                if self.state.is_stale(note.epoch):
                    return self.record(source, operation, "stale", notified_epoch=note.epoch)
                self.state.raise_epoch(note.epoch)
            return self.record(source, operation, "applied")
        if note.pool is not None and normalise_pool(note.pool) != self.pool:
            return self.record(source, operation, "skipped_pool", notified_pool=note.pool)
        if len(note.model_config.encode("utf-8")) > MAX_MODEL_CONFIG_BYTES:
            return self.record(source, operation, "rejected_oversized", model=note.model_id)
        return await self._apply(note)

    async def _apply(self, note: Notification) -> str:
        source, operation = "notification", "model_config"
        expected = control_plane_hash(self.bundle, self.pool, note.bundle_pool_config_hashes, note.bundle_config_hash)
        body: dict[str, Any] = {
            "bundle_id": self.bundle,
            "model_id": note.model_id,
            "epoch": note.epoch,
            "bundle_config_hash": expected,
            "profiles_added": list(note.profiles_added),
            "model_config": note.model_config,
        }
        if note.bundle_adapters is not None and self.bundle in note.bundle_adapters:
            body["bundle_adapters"] = list(note.bundle_adapters[self.bundle])
        async with self.state.barrier.exclusive():
            if self.state.is_stale(note.epoch):
                return self.record(source, operation, "stale", notified_epoch=note.epoch)
            try:
                answer = await self._retrying(lambda: self.backend.apply_model_config(body))
            except _Shutdown:
                return self.record(source, operation, "shutdown")
            except Exception as exc:  # the backend refused the call: nothing advanced
                return self.record(source, operation, "apply_error", model=note.model_id, error=str(exc)[:200])
            if not answer.applied:
                return self.record(source, operation, "apply_rejected", model=note.model_id)
            if expected and answer.bundle_config_hash != expected:
                return self.record(
                    source, operation, "hash_mismatch", model=note.model_id, backend_hash=answer.bundle_config_hash
                )
            if self.state.commit(note.epoch, expected, answer.unsupported_models) and self.on_commit is not None:
                self.on_commit()
            self.state.catalog.extend(note.model_id, note.profiles_added)
        return self.record(source, operation, "applied", model=note.model_id, bundle_config_hash=expected)

    # -- exports (§9.3) -----------------------------------------------------------------------

    def _entries(self, export: Export) -> tuple[list[tuple[str, str]], int]:
        """The models of our bundle and pool with their bodies; and how many failed (over 1 MiB)."""
        entries: list[tuple[str, str]] = []
        failed = 0
        for model in export.models:
            if self.bundle not in model.affected_bundles or model.pool_name() != self.pool:
                continue
            body = model.body()
            if body is None:
                continue  # skipped: nothing to write
            if len(body.encode("utf-8")) > MAX_MODEL_CONFIG_BYTES:
                failed += 1
                continue
            entries.append((model.model_id, body))
        return entries, failed

    async def apply_export(self, export: Export, request: ExportRequest) -> str:
        """One export reconcile under the exclusive barrier; returns the outcome."""
        source, operation = "export", "full_export"
        async with self.state.barrier.exclusive():
            if not request.forced and export.epoch < self.state.epoch:
                return self.record(source, operation, "stale", export_epoch=export.epoch, reason=request.reason)
            entries, failed = self._entries(export)
            if failed:
                return self.record(source, operation, "partial", failed=failed, reason=request.reason)
            expected = control_plane_hash(
                self.bundle, self.pool, export.bundle_pool_config_hashes, export.bundle_config_hashes.get(self.bundle)
            )
            adapters = None if export.bundle_adapters is None else export.bundle_adapters.get(self.bundle)
            signature = export_signature(self.bundle, expected, entries, adapters)
            if request.periodic and signature == self.last_signature:
                return self.record(source, operation, "no_change", reason=request.reason)
            body: dict[str, Any] = {
                "bundle_id": self.bundle,
                "epoch": export.epoch,
                "bundle_config_hash": expected,
                "models": [{"model_id": m, "model_config": c} for m, c in sorted(entries)],
            }
            if adapters is not None:
                body["bundle_adapters"] = list(adapters)
            try:
                answer = await self._retrying(lambda: self.backend.replace_model_configs(body))
            except _Shutdown:
                return self.record(source, operation, "shutdown")
            except Exception as exc:
                return self.record(source, operation, "partial", error=str(exc)[:200], reason=request.reason)
            if not answer.applied:
                return self.record(source, operation, "partial", why="not applied", reason=request.reason)
            if expected and answer.bundle_config_hash != expected:
                return self.record(
                    source, operation, "hash_mismatch", backend_hash=answer.bundle_config_hash, reason=request.reason
                )
            # An export is authoritative: at the same epoch it still commits, and a forced one (a
            # rewind) lowers the epoch; an older unforced one was refused above.
            committed = self.state.commit(export.epoch, expected, answer.unsupported_models, force=True)
            if committed and self.on_commit is not None:
                self.on_commit()
            self.state.catalog.replace_export(answer.applied_models, answer.applied_profiles)
            self.last_signature = signature
        outcome = "applied" if answer.applied_models else "no_relevant_models"
        return self.record(source, operation, outcome, reason=request.reason, bundle_config_hash=expected)


__all__ = [
    "MAX_MODEL_CONFIG_BYTES",
    "ConfigAnswer",
    "ConfigBackend",
    "ExportRequest",
    "LiveConfig",
    "trusted",
    "untrusted_envelope",
]
