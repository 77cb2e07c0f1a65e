# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run`: the one life cycle of both ingest modes. Start in order (sidecar-behaviour
§2.1), run until SIGTERM/SIGINT, drain (§15.4), close in reverse; which mode is a setting
(`SIE_SIDECAR_INGEST`), and local mode's modules are imported only when it is chosen."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..config import Settings
from ..errors import ConfigError, StartupError
from ..prep.audio import configure_permits as configure_audio_permits
from .nats_mode import drain_nats, log_stopped_nats, start_nats

log = logging.getLogger(__name__)
_T = TypeVar("_T")


async def _unless_stopped(coro: Coroutine[Any, Any, _T], stop: asyncio.Event) -> _T | None:
    """Run the start-up, giving up (cancelled) as soon as `stop` is set: a signal while NATS is still
    unreachable ends the process at once instead of after the connect deadline."""
    task = asyncio.ensure_future(coro)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


async def _run(settings: Settings, stop: asyncio.Event, started: asyncio.Event | None) -> int:
    from .. import __version__  # nats-py imported importlib.metadata already: ~0.6 ms CPU here

    log.info("starting", extra={"version": __version__, "settings": settings.redacted()})
    for warning in settings.warnings:
        log.warning(warning)
    try:
        settings.require_supported()
    except ConfigError as exc:
        log.error(f"start-up failed: configuration: {exc}", extra={"step": "configuration", "exit_code": 2})
        return 2
    configure_audio_permits(settings.concurrency.audio_decodes)  # concurrent audio decodes (§7.3)
    if settings.ingest == "local":
        from .local_mode import drain_local, log_stopped_local, start_local

        return await _serve(
            settings,
            stop,
            started,
            start=start_local,
            drain=drain_local,
            stopped=log_stopped_local,
            where={"ingest": "local"},
        )
    return await _serve(
        settings,
        stop,
        started,
        start=start_nats,
        drain=drain_nats,
        stopped=log_stopped_nats,
        where={"pool": settings.pool},
    )


async def _serve(
    settings: Settings,
    stop: asyncio.Event,
    started: asyncio.Event | None,
    *,
    start: Callable[[Settings, asyncio.Event, contextlib.AsyncExitStack], Coroutine[Any, Any, _T]],
    drain: Callable[[_T], Coroutine[Any, Any, None]],
    stopped: Callable[[_T], None],
    where: dict[str, str],
) -> int:
    """Start (giving up as soon as `stop` is set), run until `stop`, drain, close in reverse order:
    the one life cycle of both ingest modes. A start-up failure is one log line and its exit code; a
    defect is one line with its traceback and exit code 1."""
    running: _T | None = None
    try:
        async with contextlib.AsyncExitStack() as resources:
            running = await _unless_stopped(start(settings, stop, resources), stop)
            if running is not None:
                log.info("running", extra={"worker_id": settings.worker_id, **where})
                if started is not None:
                    started.set()
                await stop.wait()
                log.info("draining")
                await drain(running)
    except StartupError as exc:
        log.error(f"start-up failed: {exc.step}: {exc.reason}", extra={"step": exc.step, "exit_code": exc.code})
        return exc.code
    except Exception as exc:  # a defect: one line (the traceback inside it), exit code 1
        log.error("sidecar failed", exc_info=exc, extra={"exit_code": 1})
        return 1
    if running is None:
        log.info("stopped during start-up")
        return 0
    stopped(running)
    return 0


async def run(settings: Settings, *, stop: asyncio.Event | None = None, started: asyncio.Event | None = None) -> int:
    """Run the sidecar until `stop` is set (SIGTERM/SIGINT set it when not given, from the first line
    on, so a signal during start-up ends it too); returns the exit code: 0 after a clean stop, 2 for
    a configuration refused at start-up, 1 for any other failure (one log line, everything opened
    so far closed in reverse order)."""
    handled: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
    try:
        return await _run(settings, stop, started)
    finally:
        for sig in handled:
            asyncio.get_running_loop().remove_signal_handler(sig)


__all__ = ["run"]
