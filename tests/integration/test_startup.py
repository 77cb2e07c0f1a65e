# SPDX-License-Identifier: Apache-2.0
"""Start-up and the NATS connection against real nats-servers: user/password and TLS authenticate, a
refusal or an unreachable server ends `sie-sidecar run` with one line (exit 1) instead of a retry
loop, a signal during the connect phase ends it at once, reconnects after the first connection go
on forever with rate-limited one-line logs, credentials never reach a log line, and a failure at any
start-up step closes what came before (sidecar-behaviour §2.1, §10, §15.4)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js import api as js_api

from sie_sidecar.bus.topology import TopologySpec, ensure_topology
from sie_sidecar.config import LIMITS, Settings
from sie_sidecar.runtime import run
from sie_sidecar.tools.localhost import free_port

from .conftest import NatsServer, NatsServerFactory
from .stack import BUNDLE, POOL, PROFILE, running_stack, work_item
from .tls_certs import TlsFiles, make_certs

USER, PASSWORD = "worker", "pw-0xC0FFEE-right"
WRONG = "pw-0xBADBAD-wrong"
EXIT_S = 10.0  # a bound for "promptly": the process needs ~0.5 s to import and start


# --------------------------------------------------------------------------------- a sidecar process


@dataclass
class Process:
    """`sie-sidecar run` as a child process, its stderr read line by line as JSON log records."""

    proc: asyncio.subprocess.Process
    records: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None
    _seen: asyncio.Event = field(default_factory=asyncio.Event)

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            text = line.decode(errors="replace").rstrip("\n")
            self.raw.append(text)
            try:
                self.records.append(json.loads(text))
            except ValueError:
                self.records.append({"level": "not-json", "msg": text})
            self._seen.set()

    async def wait_for(self, msg: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first record whose message starts with `msg`."""
        deadline = time.monotonic() + timeout
        while True:
            for record in self.records:
                if str(record.get("msg", "")).startswith(msg):
                    return record
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {msg!r} record; got {self.raw}")
            self._seen.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._seen.wait(), max(0.0, deadline - time.monotonic()))

    async def exit_code(self, timeout: float = EXIT_S) -> int:
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"still running after {timeout} s; log: {self.raw[-5:]}") from None
        if self._reader is not None:
            await self._reader
        return code

    def errors(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("level") in ("error", "critical", "not-json")]

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await self._reader


def sidecar_env(tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIE_") and k != "SSL_CERT_FILE"}
    return {
        **clean,
        "SIE_NATS_URL": url,
        "SIE_POOL": POOL,
        "SIE_BUNDLE": BUNDLE,
        "SIE_MACHINE_PROFILE": PROFILE,
        "SIE_WORKER_ID": "w-startup",
        "SIE_IPC_SOCKET_PATH": str(tmp_path / "no-backend.sock"),
        "SIE_WORKER_PROBE_PORT": str(free_port()),
        **extra,
    }


@contextlib.asynccontextmanager
async def sidecar(env: dict[str, str]) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sie_sidecar", "run", env=env, stderr=asyncio.subprocess.PIPE, start_new_session=True
    )
    process = Process(proc)
    process._reader = asyncio.create_task(process._read())
    try:
        yield process
    finally:
        await process.kill()


def assert_one_error_line(process: Process, *needles: str) -> str:
    """Exactly one error record, on one line, naming what went wrong; no traceback anywhere."""
    errors = process.errors()
    assert len(errors) == 1, process.raw
    assert all("exc" not in r for r in process.records), process.raw
    assert not any("Traceback" in line for line in process.raw)
    message = str(errors[0]["msg"])
    for needle in needles:
        assert needle in message, message
    return message


# -------------------------------------------------------------------------------- the connect phase


@pytest.mark.parametrize(
    "url", ["nats://127.0.0.1:{port}", "nats://no-such-host.invalid:4222"], ids=["unreachable", "unresolvable"]
)
async def test_no_nats_exits_1_at_the_connect_deadline_with_one_line(url: str, tmp_path: Path) -> None:
    """Defect 5: this retried forever, logging a traceback twice a second."""
    env = sidecar_env(tmp_path, url.format(port=free_port()), SIE_NATS_CONNECT_TIMEOUT_S="1")
    started = time.monotonic()
    async with sidecar(env) as process:
        assert await process.exit_code() == 1
    assert time.monotonic() - started < EXIT_S
    assert_one_error_line(process, "start-up failed: NATS connect", "within 1 s")
    assert len(process.records) <= 4  # starting, one rate-limited attempt warning (maybe two), the error


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_during_the_connect_phase_ends_the_process_promptly(sig: signal.Signals, tmp_path: Path) -> None:
    """Defect 5: signals were ignored while the first connection was being retried."""
    env = sidecar_env(tmp_path, f"nats://127.0.0.1:{free_port()}", SIE_NATS_CONNECT_TIMEOUT_S="300")
    async with sidecar(env) as process:
        await process.wait_for("NATS connection attempt failed")
        sent = time.monotonic()
        process.proc.send_signal(sig)
        assert await process.exit_code(timeout=5) == 0
        assert time.monotonic() - sent < 5
    assert process.records[-1]["msg"] == "stopped during start-up"
    assert process.errors() == []


# ----------------------------------------------------------------------------------- credentials


async def auth_server(factory: NatsServerFactory) -> NatsServer:
    return await factory(args=["--user", USER, "--pass", PASSWORD])


async def test_user_and_password_authenticate_the_connection(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    """SIE_NATS_USER / SIE_NATS_PASSWORD were validated, then ignored: the connection never authenticated."""
    server = await auth_server(nats_server_factory)
    env = {"SIE_NATS_USER": USER, "SIE_NATS_PASSWORD": PASSWORD}
    creds = {"user": USER, "password": PASSWORD}
    async with running_stack(server, tmp_path, env=env, gateway_options=creds) as stack:
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        assert stack.results_for(wid)[0]["success"] is True


@pytest.mark.parametrize("where", ["env", "url"])
async def test_wrong_credentials_exit_1_with_one_line(
    where: str, nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    """A refusal ends the first connection at once (well inside the 30 s default deadline), never a loop."""
    server = await auth_server(nats_server_factory)
    if where == "env":
        env = sidecar_env(tmp_path, server.url, SIE_NATS_USER=USER, SIE_NATS_PASSWORD=WRONG)
    else:
        env = sidecar_env(tmp_path, f"nats://{USER}:{WRONG}@127.0.0.1:{server.port}")
    async with sidecar(env) as process:
        assert await process.exit_code() == 1
    assert_one_error_line(process, "start-up failed: NATS connect", "refused", "Authorization Violation")
    assert not any(WRONG in line for line in process.raw)


async def test_url_credentials_are_not_used_and_never_reach_a_log_line(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    """sidecar-behaviour §1.2 (newer than v0.7.1): userinfo in SIE_NATS_URL does not authenticate (a
    warning says to use SIE_NATS_USER/SIE_NATS_PASSWORD) and is never logged; the user/password
    variables with the same URL connect."""
    server = await auth_server(nats_server_factory)
    url = f"nats://{USER}:{PASSWORD}@127.0.0.1:{server.port}"
    async with sidecar(sidecar_env(tmp_path, url, RUST_LOG="debug", SIE_NATS_CONNECT_TIMEOUT_S="5")) as process:
        assert await process.exit_code(timeout=30) == 1
    assert_one_error_line(process, "start-up failed: NATS connect", "refused", "Authorization Violation")
    assert any("is not used to authenticate" in r["msg"] for r in process.records)
    assert not any(PASSWORD in line for line in process.raw)
    env = sidecar_env(tmp_path, url, RUST_LOG="debug", SIE_NATS_USER=USER, SIE_NATS_PASSWORD=PASSWORD)
    async with sidecar(env) as process:
        await process.wait_for("running")
        process.proc.send_signal(signal.SIGTERM)
        assert await process.exit_code(timeout=30) == 0
    assert process.errors() == []
    assert not any(PASSWORD in line for line in process.raw)
    connected = next(r for r in process.records if r["msg"] == "NATS connected")
    assert connected["server"] == f"nats://127.0.0.1:{server.port}"


# --------------------------------------------------------------------------------------------- TLS


async def tls_server(factory: NatsServerFactory, certs: TlsFiles) -> NatsServer:
    return await factory(args=["--tls", "--tlscert", str(certs.cert), "--tlskey", str(certs.key)], tls=True)


async def test_tls_with_a_ca_trusted_through_ssl_cert_file(
    nats_server_factory: NatsServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = make_certs(tmp_path)
    server = await tls_server(nats_server_factory, certs)
    assert server.url.startswith("tls://")
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
    gateway_tls = ssl.create_default_context(cafile=str(certs.ca))
    async with running_stack(server, tmp_path, gateway_options={"tls": gateway_tls}) as stack:
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        assert stack.results_for(wid)[0]["success"] is True


async def test_an_untrusted_certificate_exits_1_with_one_line(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    server = await tls_server(nats_server_factory, make_certs(tmp_path))
    async with sidecar(sidecar_env(tmp_path, server.url)) as process:  # no SSL_CERT_FILE: the CA is unknown
        assert await process.exit_code() == 1
    assert_one_error_line(process, "start-up failed: NATS connect", "refused", "CERTIFICATE_VERIFY_FAILED")


# ------------------------------------------------------------------------------ after the first one


async def test_reconnects_go_on_forever_with_rate_limited_one_line_logs(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def quiet(exc: Exception) -> None:
        """The gateway client's own reconnect errors (nats-py would log each with a traceback)."""

    file_storage = {"SIE_STREAM_STORAGE": "file"}  # the streams survive the restart
    async with running_stack(nats_server, tmp_path, env=file_storage, gateway_options={"error_cb": quiet}) as stack:
        await nats_server.stop()

        def failures() -> list[int]:
            return [r.__dict__["failures"] for r in caplog.records if r.getMessage() == "NATS connection error"]

        await stack.wait_for(lambda: 5 in failures(), timeout=30)  # ~2 attempts a second
        assert failures() == [1, 5]  # counts 1, 5, 30, every 120
        assert not [r for r in caplog.records if r.name.startswith("nats")]  # nats-py's tracebacks
        assert all(r.exc_info is None for r in caplog.records if r.name.startswith("sie_sidecar"))
        assert any(r.getMessage() == "NATS disconnected; reconnecting" for r in caplog.records)
        await nats_server.start()
        await stack.wait_for(lambda: stack.nc.is_connected, timeout=20)
        await stack.wait_for(lambda: any(r.getMessage().startswith("NATS reconnected") for r in caplog.records))
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1, timeout=20)


# ------------------------------------------------------------------------- failures at each step


def _socket_fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                out.add(target)
    return out


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


async def _conflicting_stream(server: NatsServer) -> None:
    """Another stream already owns the pool's subjects, so the pool stream cannot be created."""
    nc = await nats.connect(server.url)
    try:
        await nc.jetstream().add_stream(name="SQUATTER", subjects=[f"sie.work.{POOL}.>"])
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("step", "code"),
    [
        ("payload store", 2),
        ("NATS connect", 1),
        ("NATS topology (no JetStream)", 1),
        ("NATS topology (stream conflict)", 1),
    ],
)
async def test_a_failed_start_up_step_exits_with_one_line_and_leaves_nothing_open(
    step: str, code: int, nats_server_factory: NatsServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    probe_port = free_port()
    env = {
        "SIE_POOL": POOL,
        "SIE_BUNDLE": BUNDLE,
        "SIE_MACHINE_PROFILE": PROFILE,
        "SIE_WORKER_ID": "w-fail",
        "SIE_IPC_SOCKET_PATH": str(tmp_path / "no-backend.sock"),
        "SIE_WORKER_PROBE_PORT": str(probe_port),
        "SIE_NATS_CONNECT_TIMEOUT_S": "0.5",
    }
    if step == "payload store":
        env |= {"SIE_NATS_URL": f"nats://127.0.0.1:{free_port()}", "SIE_PAYLOAD_STORE_URL": "s3://"}
    elif step == "NATS connect":
        env["SIE_NATS_URL"] = f"nats://127.0.0.1:{free_port()}"
    else:
        server = await nats_server_factory(jetstream="no JetStream" not in step)
        if "conflict" in step:
            await _conflicting_stream(server)
        env["SIE_NATS_URL"] = server.url
    settings = Settings.from_env(env)
    sockets_before = _socket_fds()
    tasks_before = asyncio.all_tasks()

    assert await asyncio.wait_for(run(settings, stop=asyncio.Event()), 30) == code

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()
    assert errors[0].getMessage().startswith(f"start-up failed: {step.partition(' (')[0]}")
    assert errors[0].exc_info is None
    if "no JetStream" in step:
        assert "JetStream is not enabled" in errors[0].getMessage()
    left = asyncio.all_tasks() - tasks_before
    if left:  # tasks being cancelled finish within a few loop turns; a leaked one would not
        _, pending = await asyncio.wait(left, timeout=2)
        assert not pending, pending
    assert _socket_fds() <= sockets_before
    assert _port_is_free(probe_port)


async def test_run_refuses_a_setting_this_build_lacks_before_opening_anything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runtime.run` called directly (the CLI refuses earlier) says so in one line and exits 2. Nothing is
    refused today (`NOT_YET` is empty), so the table is given one entry for the test."""
    from sie_sidecar import config

    monkeypatch.setattr(config.settings, "NOT_YET", (("nats_ack_confirm_s", "SIE_NATS_ACK_CONFIRM_S"),))
    port = free_port()
    env = {
        "SIE_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "SIE_POOL": POOL,
        "SIE_BUNDLE": BUNDLE,
        "SIE_MACHINE_PROFILE": PROFILE,
        "SIE_WORKER_PROBE_PORT": str(port),
        "SIE_NATS_ACK_CONFIRM_S": "7",
    }
    assert await asyncio.wait_for(run(Settings.from_env(env), stop=asyncio.Event()), 10) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["start-up failed: configuration: SIE_NATS_ACK_CONFIRM_S is not supported yet"]
    assert not any(r.getMessage().startswith("NATS") for r in caplog.records)


async def test_a_probe_port_in_use_is_logged_and_the_sidecar_serves(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """§10: a bind failure is logged and the probe task ends; the process keeps running."""
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = {"SIE_WORKER_PROBE_PORT": str(port)}
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            wid = await stack.publish(work_item())
            await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        assert await stack.task == 0
    binds = [r for r in caplog.records if r.getMessage() == "probe server could not bind"]
    assert len(binds) == 1 and binds[0].__dict__["port"] == port


async def test_the_largest_accepted_jetstream_values_are_accepted_by_the_server(nats_server: NatsServer) -> None:
    """LIMITS match the server: the top values create the topology (and one more is a ConfigError,
    tests/unit/test_settings_wired.py)."""
    settings = Settings.from_env(
        {
            "SIE_NATS_URL": nats_server.url,
            "SIE_POOL": POOL,
            "SIE_BUNDLE": BUNDLE,
            "SIE_MACHINE_PROFILE": PROFILE,
            "SIE_WORKER_ID": "w-limits",
            "SIE_MAX_ACK_PENDING": str(int(LIMITS["SIE_MAX_ACK_PENDING"])),
            "SIE_MAX_DELIVER": str(int(LIMITS["SIE_MAX_DELIVER"])),
            "SIE_STREAM_MAX_AGE_S": str(int(LIMITS["SIE_STREAM_MAX_AGE_S"])),
        }
    )
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        spec = TopologySpec.from_settings(settings)
        await ensure_topology(js, spec)
        durable = await js.consumer_info(spec.pool_stream, spec.pool_durable)
        assert durable.config.max_ack_pending == LIMITS["SIE_MAX_ACK_PENDING"]
        assert durable.config.max_deliver == LIMITS["SIE_MAX_DELIVER"]
        stream = await js.stream_info(spec.pool_stream)
        assert stream.config.retention == js_api.RetentionPolicy.WORK_QUEUE
        assert stream.config.max_age == pytest.approx(LIMITS["SIE_STREAM_MAX_AGE_S"])
    finally:
        await nc.close()
