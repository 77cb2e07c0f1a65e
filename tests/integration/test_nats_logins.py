# SPDX-License-Identifier: Apache-2.0
"""The NATS logins other than user/password (issue 32), each against a real nats-server configured
for it: a token, an NKey seed file, client-certificate TLS (`verify: true`) and a creds file in
operator mode, with operator, account and user JWTs minted by nats-jwt. With the right secret the
sidecar connects and serves a work item; with a wrong one the first connection is refused
(`ConnectError`, exit code 1 for `sie-sidecar run`) and the secret appears in no line."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from sie_sidecar.bus.connect import ConnectError, NatsEvents, close, connect, login_kind
from sie_sidecar.config import Settings

from ..nats_credentials import STORAGE, OperatorSetup, Pki, make_pki, public_key, user_seed
from .conftest import NatsServer, NatsServerFactory
from .stack import BUNDLE, POOL, PROFILE, running_stack, work_item
from .test_startup import assert_one_error_line, sidecar, sidecar_env

TOKEN = "tok-0xC0FFEE-right"
WRONG_TOKEN = "tok-0xBADBAD-wrong"


def settings_for(server: NatsServer, **env: str) -> Settings:
    base = {"SIE_POOL": POOL, "SIE_BUNDLE": BUNDLE, "SIE_MACHINE_PROFILE": PROFILE, "HOSTNAME": "pod-0"}
    return Settings.from_env({**base, "SIE_NATS_URL": server.url, "SIE_NATS_CONNECT_TIMEOUT_S": "5", **env})


async def refusal(settings: Settings) -> str:
    """The `ConnectError` line of a first connection the server refuses (never the deadline's)."""
    nc = NatsClient()
    events = NatsEvents(settings.redact_text)
    began = time.monotonic()
    try:
        with pytest.raises(ConnectError) as info:
            await connect(nc, settings, events)
    finally:
        await close(nc, events)
    assert time.monotonic() - began < 4.0, "refused at once, not retried until the deadline"
    return str(info.value)


async def serves(server: NatsServer, tmp_path: Path, env: dict[str, str], gateway: dict[str, Any]) -> None:
    """The sidecar connects with `env`'s login and answers a work item the gateway publishes."""
    async with running_stack(server, tmp_path, env=env, gateway_options=gateway) as stack:
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        assert stack.results_for(wid)[0]["success"] is True


# --------------------------------------------------------------------------------------------- token


async def test_a_token_connects_and_serves(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    server = await nats_server_factory(args=["--auth", TOKEN])
    await serves(server, tmp_path, {"SIE_NATS_TOKEN": TOKEN}, {"token": TOKEN})
    assert login_kind(settings_for(server, SIE_NATS_TOKEN=TOKEN)) == "token"


async def test_a_wrong_token_is_refused_and_never_shown(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    server = await nats_server_factory(args=["--auth", TOKEN])
    line = await refusal(settings_for(server, SIE_NATS_TOKEN=WRONG_TOKEN))
    assert "refused" in line and "Authorization Violation" in line
    async with sidecar(sidecar_env(tmp_path, server.url, SIE_NATS_TOKEN=WRONG_TOKEN, RUST_LOG="debug")) as process:
        assert await process.exit_code() == 1
    assert_one_error_line(process, "start-up failed: NATS connect", "Authorization Violation")
    assert not any(WRONG_TOKEN in line for line in process.raw)
    starting = next(r for r in process.records if r["msg"] == "starting")
    assert starting["settings"]["nats_token"] == "<redacted>"


# ------------------------------------------------------------------------------------------ NKey seed


def nkey_config(tmp_path: Path, *seeds: str) -> Path:
    path = tmp_path / "nkeys.conf"
    users = "\n".join(f"    {{nkey: {public_key(seed)}}}" for seed in seeds)
    path.write_text(f"authorization {{\n  users = [\n{users}\n  ]\n}}\n")
    return path


async def test_an_nkey_seed_file_connects_and_serves(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    worker, gateway = user_seed(), user_seed()
    server = await nats_server_factory(args=["-c", str(nkey_config(tmp_path, worker, gateway))])
    seed_file = tmp_path / "worker.nk"
    seed_file.write_text(worker + "\n")
    await serves(server, tmp_path, {"SIE_NATS_NKEY_SEED_FILE": str(seed_file)}, {"nkeys_seed_str": gateway})


async def test_an_unknown_nkey_is_refused(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    server = await nats_server_factory(args=["-c", str(nkey_config(tmp_path, user_seed()))])
    stranger = user_seed()
    seed_file = tmp_path / "stranger.nk"
    seed_file.write_text(stranger)
    line = await refusal(settings_for(server, SIE_NATS_NKEY_SEED_FILE=str(seed_file)))
    assert "refused" in line and "Authorization Violation" in line
    assert stranger not in line


# ---------------------------------------------------------------------------------- client-cert TLS


def verifying_server_config(tmp_path: Path, pki: Pki) -> Path:
    """TLS with `verify: true`: a client without a certificate the CA signed is refused."""
    path = tmp_path / "tls.conf"
    path.write_text(
        "tls {\n"
        f'  cert_file: "{pki.server_cert}"\n'
        f'  key_file: "{pki.server_key}"\n'
        f'  ca_file: "{pki.ca}"\n'
        "  verify: true\n"
        "  timeout: 2\n"
        "}\n"
    )
    return path


def tls_env(pki: Pki) -> dict[str, str]:
    return {
        "SIE_NATS_TLS_CERT_FILE": str(pki.client_cert),
        "SIE_NATS_TLS_KEY_FILE": str(pki.client_key),
        "SIE_NATS_TLS_CA_FILE": str(pki.ca),
    }


async def test_a_client_certificate_connects_and_serves(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    server = await nats_server_factory(args=["-c", str(verifying_server_config(tmp_path, pki))], tls=True)
    gateway_tls = ssl.create_default_context(cafile=str(pki.ca))
    gateway_tls.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    await serves(server, tmp_path, tls_env(pki), {"tls": gateway_tls})
    assert login_kind(settings_for(server, **tls_env(pki))) == "none+client-cert"


async def test_a_nats_url_upgrades_to_the_servers_required_tls(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    """A server that requires TLS upgrades a `nats://` URL too: the client certificate goes with it."""
    pki = make_pki(tmp_path / "pki")
    server = await nats_server_factory(args=["-c", str(verifying_server_config(tmp_path, pki))], tls=True)
    plain = server.url.replace("tls://", "nats://")
    nc = NatsClient()
    settings = Settings.from_env(
        {"SIE_POOL": POOL, "SIE_BUNDLE": BUNDLE, "SIE_MACHINE_PROFILE": PROFILE, "SIE_NATS_URL": plain, **tls_env(pki)}
    )
    events = NatsEvents(settings.redact_text)
    try:
        await connect(nc, settings, events)
        await nc.flush(timeout=2)
    finally:
        await close(nc, events)


@pytest.mark.parametrize(
    ("client", "alert"), [("none", "CERTIFICATE_REQUIRED"), ("another CA's", "UNKNOWN_CA")], ids=["none", "foreign"]
)
async def test_a_missing_or_foreign_client_certificate_is_refused(
    client: str, alert: str, nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    """The server's TLS alert ends the first connection at once, as a refusal (not retried)."""
    pki = make_pki(tmp_path / "pki")
    server = await nats_server_factory(args=["-c", str(verifying_server_config(tmp_path, pki))], tls=True)
    env = {"SIE_NATS_TLS_CA_FILE": str(pki.ca)}
    if client != "none":
        foreign = make_pki(tmp_path / "foreign", name="another CA")
        env |= {"SIE_NATS_TLS_CERT_FILE": str(foreign.client_cert), "SIE_NATS_TLS_KEY_FILE": str(foreign.client_key)}
    line = await refusal(settings_for(server, **env))
    assert "refused the connection" in line and alert in line


async def test_the_ca_file_replaces_the_system_store(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    """SIE_NATS_TLS_CA_FILE alone (a private CA, no client certificate): the server is verified
    against it; another CA's file makes the same server untrusted."""
    pki = make_pki(tmp_path / "pki")
    args = ["--tls", "--tlscert", str(pki.server_cert), "--tlskey", str(pki.server_key)]
    server = await nats_server_factory(args=args, tls=True)
    nc = NatsClient()
    settings = settings_for(server, SIE_NATS_TLS_CA_FILE=str(pki.ca))
    events = NatsEvents(settings.redact_text)
    try:
        await connect(nc, settings, events)
    finally:
        await close(nc, events)
    foreign = make_pki(tmp_path / "foreign", name="another CA")
    line = await refusal(settings_for(server, SIE_NATS_TLS_CA_FILE=str(foreign.ca)))
    assert "CERTIFICATE_VERIFY_FAILED" in line


# ------------------------------------------------------------------------------- creds, operator mode


async def operator_server(factory: NatsServerFactory, tmp_path: Path, setup: OperatorSetup) -> NatsServer:
    config = tmp_path / "operator.conf"
    config.write_text(setup.server_config())
    return await factory(args=["-c", str(config)])


async def test_a_creds_file_connects_and_serves_in_operator_mode(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    setup = OperatorSetup.create()
    server = await operator_server(nats_server_factory, tmp_path, setup)
    worker = setup.write_creds(tmp_path / "worker.creds", "worker")
    gateway = setup.write_creds(tmp_path / "gateway.creds", "gateway")
    env = {"SIE_NATS_CREDS_FILE": str(worker), **STORAGE}
    await serves(server, tmp_path, env, {"user_credentials": str(gateway)})


async def test_a_user_of_an_account_the_server_does_not_know_is_refused(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    """Well-formed creds (they pass the start-up check) from another operator's account."""
    setup = OperatorSetup.create()
    server = await operator_server(nats_server_factory, tmp_path, setup)
    stranger = OperatorSetup.create("another-operator")
    creds = stranger.write_creds(tmp_path / "stranger.creds", "worker")
    seed = creds.read_text().split("-----BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
    line = await refusal(settings_for(server, SIE_NATS_CREDS_FILE=str(creds)))
    assert "refused" in line and "Authorization Violation" in line
    assert seed not in line
    async with sidecar(sidecar_env(tmp_path, server.url, SIE_NATS_CREDS_FILE=str(creds), RUST_LOG="debug")) as process:
        assert await process.exit_code() == 1
    assert_one_error_line(process, "start-up failed: NATS connect", "Authorization Violation")
    assert not any(seed in line for line in process.raw)
    connected_kind = login_kind(settings_for(server, SIE_NATS_CREDS_FILE=str(creds)))
    assert connected_kind == "creds"


async def test_creds_and_a_client_certificate_together(nats_server_factory: NatsServerFactory, tmp_path: Path) -> None:
    """A TLS client certificate combines with a login: operator mode behind `verify: true`."""
    setup = OperatorSetup.create()
    pki = make_pki(tmp_path / "pki")
    config = tmp_path / "both.conf"
    config.write_text(setup.server_config() + verifying_server_config(tmp_path, pki).read_text())
    server = await nats_server_factory(args=["-c", str(config)], tls=True)
    creds = setup.write_creds(tmp_path / "worker.creds", "worker")
    settings = settings_for(server, SIE_NATS_CREDS_FILE=str(creds), **tls_env(pki))
    assert login_kind(settings) == "creds+client-cert"
    nc = NatsClient()
    events = NatsEvents(settings.redact_text)
    try:
        await connect(nc, settings, events)
        await nc.flush(timeout=2)
    finally:
        await close(nc, events)
    without_cert = settings_for(server, SIE_NATS_CREDS_FILE=str(creds), SIE_NATS_TLS_CA_FILE=str(pki.ca))
    assert "CERTIFICATE_REQUIRED" in await refusal(without_cert)
