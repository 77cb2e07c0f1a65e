# SPDX-License-Identifier: Apache-2.0
"""The config reconciler (sidecar-behaviour §9.3): polls the config service's epoch and fingerprint,
and applies a full export when it sees drift, so a notification this worker missed (or one the
backend answered with another hash: quarantine) is repaired without anyone acting.

`GET {base}/v1/configs/epoch` every poll interval and `GET {base}/v1/configs/export` on drift, each
with the bearer, 10 s, non-2xx an error. At start-up it reads the fingerprint, then reconciles from
an export. Drift is a remote epoch ahead (`epoch_ahead`) or behind (`epoch_rewind`, which forces the
epoch down), a changed non-empty fingerprint, or, with remote epoch 0, a periodic export that is
due. The fingerprint is remembered only after an export fully succeeded.

While degraded it polls sooner (1 s, doubling up to the period). `wake()` makes it poll at once
(at most once per `WAKE_MIN_INTERVAL_S`): the gate calls it when it refuses an item's hash and live
config calls it when a write left this worker behind, so quarantined work waits a round trip rather
than a poll period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from ..errors import ConfigServiceError
from ..logs import should_log
from .config_messages import EpochInfo, Export, parse_epoch, parse_export
from .http import get_json
from .live_config import ExportRequest, LiveConfig

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S: Final = 10.0
#: An export lists every model config of the deployment, each up to 1 MiB.
MAX_EXPORT_BYTES: Final = 256 << 20
MAX_EPOCH_BYTES: Final = 1 << 20
WAKE_MIN_INTERVAL_S: Final = 1.0
#: While the config is degraded (a failed poll, export or write), the next poll comes after this,
#: doubling up to the poll interval: a known drift is repaired soon after the service is back.
DEGRADED_RETRY_FIRST_S: Final = 1.0
DEGRADED_POLL_MAX_S: Final = 5.0
_SUCCESS: Final = frozenset({"applied", "no_change", "no_relevant_models"})


class ConfigServiceClient:
    """The two GETs of §9.3 against one base URL (a trailing `/` is ignored)."""

    def __init__(self, base_url: str, bearer: str | None, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        base = base_url.strip().rstrip("/")
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigServiceError("client: the config service URL must be http(s)://host[:port][/path]")
        self._base = base
        self._bearer = bearer
        self._timeout_s = timeout_s

    async def epoch(self, session: aiohttp.ClientSession) -> EpochInfo:
        body = await get_json(
            session,
            self._base + "/v1/configs/epoch",
            self._bearer,
            timeout_s=self._timeout_s,
            max_bytes=MAX_EPOCH_BYTES,
            error=ConfigServiceError,
        )
        return parse_epoch(body)

    async def export(self, session: aiohttp.ClientSession) -> Export:
        body = await get_json(
            session,
            self._base + "/v1/configs/export",
            self._bearer,
            timeout_s=self._timeout_s,
            max_bytes=MAX_EXPORT_BYTES,
            error=ConfigServiceError,
        )
        return parse_export(body)


class Reconciler:
    """The poll loop; `run()` until the stop event, `wake()` from anywhere on the loop."""

    def __init__(
        self,
        live: LiveConfig,
        base_url: str,
        bearer: str | None,
        *,
        poll_interval_s: float,
        full_export_interval_s: float,
        stop: asyncio.Event,
    ) -> None:
        self.live = live
        self._base_url = base_url
        self._bearer = bearer
        self.poll_interval_s = poll_interval_s
        self.full_export_interval_s = full_export_interval_s
        self._stop = stop
        self._woken = asyncio.Event()
        self._last_wake_poll = float("-inf")
        self.fingerprint = ""
        self.polls = 0
        self.exports = 0
        self._last_full_export = float("-inf")
        self._retry_s = DEGRADED_RETRY_FIRST_S
        #: After a failed export, the next one waits 1 s doubling up to the poll interval, however
        #: often the reconciler is woken: a backend that keeps answering another hash is not rewritten
        #: in a loop (each write holds the execution barrier).
        self._export_backoff_s = DEGRADED_RETRY_FIRST_S
        self._export_not_before = float("-inf")
        self._resync = False

    def wake(self) -> None:
        """Poll now rather than at the next period (rate-limited by the loop)."""
        self._woken.set()

    def resync(self) -> None:
        """A backend child does not hold the advertised config (restarted, say): export at the next
        round even though the control plane shows no drift (within the export backoff)."""
        self._resync = True
        self._woken.set()

    async def run(self) -> None:
        import aiohttp

        try:
            client = ConfigServiceClient(self._base_url, self._bearer)
        except ConfigServiceError as exc:
            self.live.record("export", "poll", "client_error", error=exc.detail)
            return  # §9.3: the reconciler stops
        async with aiohttp.ClientSession() as session:
            first = True
            while not self._stop.is_set():
                if not first:
                    await self._sleep()
                    if self._stop.is_set():
                        break
                try:
                    await self._round(client, session, startup=first)
                except Exception as exc:  # a defect must not end reconciliation silently
                    log.error("config reconcile round failed", exc_info=exc)
                first = False

    async def _round(self, client: ConfigServiceClient, session: aiohttp.ClientSession, *, startup: bool) -> None:
        """One poll, and an export on drift (at start-up, always)."""
        info = await self._poll(client, session)
        if startup:
            await self._export(client, session, ExportRequest("startup"), info)
            return
        if info is None:
            return
        request = self._drift(info)
        if request is None and self._resync:
            request = ExportRequest("backend_diverged")
        if request is None:
            return
        if time.monotonic() < self._export_not_before:
            return  # the last export failed: the next one waits out its backoff
        self._resync = False
        await self._export(client, session, request, info)

    async def _sleep(self) -> None:
        """One period (shorter while degraded: 1 s doubling to `DEGRADED_POLL_MAX_S`), or less when
        woken (never two wake-driven polls within `WAKE_MIN_INTERVAL_S`)."""
        period = self.poll_interval_s
        if self.live.degraded:
            period = min(period, self._retry_s)
            self._retry_s = min(self._retry_s * 2, DEGRADED_POLL_MAX_S)
        else:
            self._retry_s = DEGRADED_RETRY_FIRST_S
        deadline = time.monotonic() + period
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._woken.wait())]
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if self._woken.is_set():
                self._woken.clear()
                early = self._last_wake_poll + WAKE_MIN_INTERVAL_S - time.monotonic()
                if early > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), min(early, max(left, 0.0)))
                self._last_wake_poll = time.monotonic()
                return

    async def _poll(self, client: ConfigServiceClient, session: aiohttp.ClientSession) -> EpochInfo | None:
        self.polls += 1
        try:
            return await client.epoch(session)
        except ConfigServiceError as exc:
            if should_log(self.polls):
                log.warning("config epoch poll failed", extra={"error": exc.detail})
            self.live.record("export", "poll", "epoch_error", error=exc.detail)
            return None

    def _drift(self, info: EpochInfo) -> ExportRequest | None:
        local = self.live.state.epoch
        if info.epoch > local:
            return ExportRequest("epoch_ahead")
        if info.epoch < local:
            return ExportRequest("epoch_rewind", forced=True)
        if info.fingerprint and info.fingerprint != self.fingerprint:
            return ExportRequest("bundle_config_hashes_hash")
        due = (
            self.full_export_interval_s > 0 and time.monotonic() - self._last_full_export >= self.full_export_interval_s
        )
        if info.epoch == 0 and due:
            return ExportRequest("periodic_export", periodic=True)
        return None

    async def _export(
        self,
        client: ConfigServiceClient,
        session: aiohttp.ClientSession,
        request: ExportRequest,
        info: EpochInfo | None,
    ) -> str:
        self.exports += 1
        self._last_full_export = time.monotonic()
        try:
            export = await client.export(session)
        except ConfigServiceError as exc:
            outcome = self.live.record("export", "full_export", "fetch_error", error=exc.detail, reason=request.reason)
        else:
            outcome = await self.live.apply_export(export, request)
        if outcome in _SUCCESS:
            if info is not None:
                self.fingerprint = info.fingerprint
            self._export_backoff_s = DEGRADED_RETRY_FIRST_S
            self._export_not_before = float("-inf")
        else:
            self._export_not_before = time.monotonic() + self._export_backoff_s
            self._export_backoff_s = min(self._export_backoff_s * 2, max(self.poll_interval_s, DEGRADED_RETRY_FIRST_S))
        return outcome

    def snapshot(self) -> dict[str, object]:
        return {"polls": self.polls, "exports": self.exports, "fingerprint": self.fingerprint}


__all__ = ["MAX_EXPORT_BYTES", "REQUEST_TIMEOUT_S", "ConfigServiceClient", "Reconciler"]
