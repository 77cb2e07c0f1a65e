# SPDX-License-Identifier: Apache-2.0
"""Early, clear refusals (issue 32): `SIE_NATS_URL` parsed at start-up, unknown boolean words
refused, secrets never taken from flags, the NATS logins checked (each error one line naming the
variable, never the secret), and one warning for an `SIE_*` variable nothing reads, naming the
closest known one. The known list is held to the code here, so it cannot drift."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import time
from pathlib import Path

import pytest

import sie_sidecar
from sie_sidecar import config
from sie_sidecar.config import (
    ENV_ONLY,
    READ_ELSEWHERE,
    REDACTED,
    RUN_FLAGS,
    ConfigError,
    Settings,
    add_run_arguments,
    known_env,
    redact_text,
    unknown_env_warnings,
)
from sie_sidecar.sched.controller_params import ENV_VARS as CONTROLLER_ENV_VARS

from ..deploy.manifests import RecordingEnviron
from ..nats_credentials import OperatorSetup, creds_text, encrypt_key, make_pki, public_key, user_seed

BASE = {
    "SIE_NATS_URL": "nats://127.0.0.1:4222",
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "l4",
    "HOSTNAME": "pod-0",
}
PACKAGE = Path(sie_sidecar.__file__).resolve().parent
#: The settings package: what its modules read is the env-only list; the rest of the package is "elsewhere".
CONFIG = Path(config.__file__).resolve().parent


def build(argv: list[str] | None = None, /, **env: str) -> Settings:
    return Settings.from_env({**BASE, **env}, argv or [])


def refusal(argv: list[str] | None = None, /, **env: str) -> str:
    """The ConfigError line (one line, as the CLI prints it after `sie-sidecar: `)."""
    with pytest.raises(ConfigError) as info:
        build(argv, **env)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------ NATS URLs


@pytest.mark.parametrize(
    ("url", "servers"),
    [
        ("nats://nats-0.nats:4222", ["nats://nats-0.nats:4222"]),
        ("nats://nats-0.nats", ["nats://nats-0.nats"]),  # nats-py adds 4222
        ("tls://10.0.0.1:4443,tls://10.0.0.2:4443", ["tls://10.0.0.1:4443", "tls://10.0.0.2:4443"]),
        ("ws://nats:8080,wss://nats.example.com", ["ws://nats:8080", "wss://nats.example.com"]),
        ("NATS://Host:4222", ["nats://Host:4222"]),  # nats-py reads schemes case-sensitively
        ("nats://[::1]:4222", ["nats://[::1]:4222"]),
        (" nats://a:4222 , ,nats://b:4222 ", ["nats://a:4222", "nats://b:4222"]),
    ],
)
def test_nats_urls_accepted(url: str, servers: list[str]) -> None:
    assert build(SIE_NATS_URL=url).nats_servers == servers


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://x", "'http://x': http:// is not a NATS scheme (nats, tls, ws or wss)"),
        ("not a url", "'not a url' is not a URL: expected nats://host:port (or tls://, ws://, wss://)"),
        ("127.0.0.1:4222", "'127.0.0.1:4222' is not a URL"),
        ("nats://:4222", "'nats://:4222' names no host"),
        ("nats://host:0", "'nats://host:0': the port is not a number in 1..65535"),
        ("nats://host:65536", "'nats://host:65536': the port is not a number in 1..65535"),
        ("nats://host:http", "'nats://host:http': the port is not a number in 1..65535"),
        ("nats://a:4222,http://b:80", "'http://b:80': http:// is not a NATS scheme"),
        ("nats://a:4222,ws://b:80", "mixes ws:// or wss:// with nats:// or tls:// URLs, which nats-py refuses"),
        (" , ", "names no server"),
    ],
)
def test_nats_urls_refused_at_start_up(url: str, problem: str) -> None:
    """Issue 32: these were accepted, then retried for 30 s with an error naming no host."""
    message = refusal(SIE_NATS_URL=url) if url.strip(" ,") else refusal(["--nats-url", url])
    assert message.startswith("SIE_NATS_URL (--nats-url): ")
    assert problem in message


def test_a_refused_url_is_shown_without_its_userinfo() -> None:
    message = refusal(SIE_NATS_URL="nats://worker:pw-0xSECRET@nats:99999")
    assert "pw-0xSECRET" not in message and "worker" not in message
    assert "nats://<redacted>@nats:99999" in message


def test_a_flag_url_is_checked_the_same_way() -> None:
    assert refusal(["--nats-url", "http://x"]).startswith("SIE_NATS_URL (--nats-url): 'http://x'")


def test_local_ingest_checks_a_url_only_when_one_is_set() -> None:
    local = {"SIE_SIDECAR_INGEST": "local", "SIE_SIDECAR_LOCAL_SOCKET": "/s.sock"}
    assert Settings.from_env({**BASE, **local, "SIE_NATS_URL": ""}).nats_url is None
    with pytest.raises(ConfigError, match=r"^SIE_NATS_URL"):
        Settings.from_env({**BASE, **local, "SIE_NATS_URL": "http://x"})


# ------------------------------------------------------------------------------------------- booleans

#: Every boolean variable the sidecar reads, with its default. SIE_SIDECAR_DEBUG_ENDPOINT takes the
#: boolean words too (in FIELDS below) but also `loopback` and `all`: its refusal is in test_config.py.
BOOLEANS: dict[str, bool] = {
    "SIE_POOL_ADMISSION_ENABLED": True,
    "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER": False,
    "SIE_NATS_CONSERVATIVE_CLEANUP": False,
    "SIE_RUST_WAVE_CADENCE": True,
    "SIE_BATCHER_IDLE_BYPASS_ENABLED": True,
    "SIE_BATCHER_JIT_DISPATCH_ENABLED": True,
    "SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS": False,
    "SIE_HEALTH_PUBLISH_ENABLED": True,
    "SIE_IPC_MUX": False,
    "SIE_METRICS_ENABLED": False,
    "SIE_TRACING_ENABLED": False,
    "SIE_WORK_DEADLINE_ENFORCE": False,
    "SIE_SIDECAR_NO_EXTENSIONS": False,
}
FIELDS = {
    "SIE_POOL_ADMISSION_ENABLED": "pool_admission_enabled",
    "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER": "nats_config_trust_any_producer",
    "SIE_NATS_CONSERVATIVE_CLEANUP": "nats_conservative_cleanup",
    "SIE_RUST_WAVE_CADENCE": "wave_cadence",
    "SIE_BATCHER_IDLE_BYPASS_ENABLED": "batcher_idle_bypass_enabled",
    "SIE_BATCHER_JIT_DISPATCH_ENABLED": "batcher_jit_dispatch_enabled",
    "SIE_SIDECAR_DEBUG_ENDPOINT": "debug_endpoint",
    "SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS": "pull_quantum_include_queue_ms",
    "SIE_HEALTH_PUBLISH_ENABLED": "health_publish_enabled",
    "SIE_WORK_DEADLINE_ENFORCE": "work_deadline_enforce",
}


@pytest.mark.parametrize("word", ["maybe", "enabled", "2", "tru", "y"])
@pytest.mark.parametrize("var", sorted(BOOLEANS))
def test_an_unknown_boolean_word_is_refused(var: str, word: str) -> None:
    """`SIE_METRICS_ENABLED=maybe` was silently off; every boolean now refuses the word, by name."""
    message = refusal(**{var: word})
    label = next((f"{s.env} ({s.flag})" for s in RUN_FLAGS if s.env == var), var)
    assert message.startswith(f"{label}: expected ")
    assert message.endswith(f"got {word!r}")
    assert "(on)" in message and "(off)" in message


@pytest.mark.parametrize("var", sorted(FIELDS))
@pytest.mark.parametrize(
    ("word", "value"),
    [("true", True), ("TRUE", True), (" 1 ", True), ("0", False), ("False", False), ("NO", False), ("off", False)],
)
def test_the_usual_words_in_any_case(var: str, word: str, value: bool) -> None:
    assert getattr(build(**{var: word}), FIELDS[var]) is value


@pytest.mark.parametrize("var", sorted(set(FIELDS) - {"SIE_NATS_CONSERVATIVE_CLEANUP"}))
@pytest.mark.parametrize("word", ["yes", "On", "YES"])
def test_yes_and_on_are_on(var: str, word: str) -> None:
    assert getattr(build(**{var: word}), FIELDS[var]) is True


def test_metrics_and_tracing_take_the_usual_words() -> None:
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert build(**otlp, SIE_METRICS_ENABLED="Yes", SIE_TRACING_ENABLED="ON").metrics_enabled is True
    assert build(**otlp, SIE_METRICS_ENABLED="no").metrics_enabled is False


def test_a_refused_boolean_stops_start_up_before_any_warning_is_logged() -> None:
    """The refusal is a ConfigError (the CLI's exit 2), not a warning line among others."""
    with pytest.raises(ConfigError):
        build(SIE_METRICS_ENABLED="maybe", SIE_MAX_DELIVER="x")


# --------------------------------------------------------------------------------------- secret flags

SECRET_FLAGS = [spec for spec in RUN_FLAGS if spec.secret]


def test_the_secret_flags_are_the_three_tokens() -> None:
    assert {s.env for s in SECRET_FLAGS} == {"SIE_GATEWAY_API_KEY", "SIE_ADMIN_TOKEN", "SIE_CONFIG_SERVICE_TOKEN"}


@pytest.mark.parametrize("spec", SECRET_FLAGS, ids=lambda s: s.flag)
@pytest.mark.parametrize("form", ["separate", "equals", "empty"])
def test_a_secret_given_as_a_flag_is_refused(spec: config.RunFlag, form: str) -> None:
    secret = "" if form == "empty" else "s3cret-0xFEED"
    argv = [f"{spec.flag}={secret}"] if form != "separate" else [spec.flag, secret]
    message = refusal(argv, **{spec.env: "from-env"})
    assert message == (
        f"{spec.flag} is refused: secrets are read from the environment only (set {spec.env}),"
        " never from flags, whose values every user sees in ps"
    )


@pytest.mark.parametrize("spec", SECRET_FLAGS, ids=lambda s: s.flag)
def test_secrets_still_come_from_the_environment(spec: config.RunFlag) -> None:
    assert getattr(build(**{spec.env: "env-0xFEED"}), spec.dest) == "env-0xFEED"


def test_help_offers_no_secret_flag_and_says_where_secrets_come_from() -> None:
    parser = argparse.ArgumentParser(prog="sie-sidecar run")
    add_run_arguments(parser)
    text = " ".join(parser.format_help().split())
    for spec in SECRET_FLAGS:
        assert spec.flag not in text
        assert spec.env in text
    assert "SIE_NATS_TOKEN" in text and "SIE_NATS_CREDS_FILE" in text and "ps" in text


def test_the_cli_refuses_a_secret_flag_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from sie_sidecar import cli

    code = cli.main(["run", "--gateway-api-key", "s3cret-0xFEED"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        "sie-sidecar: --gateway-api-key is refused: secrets are read from the environment only"
        " (set SIE_GATEWAY_API_KEY), never from flags, whose values every user sees in ps"
    ]


# ------------------------------------------------------------------------------------ NATS login lines


def test_at_most_one_login() -> None:
    both = refusal(SIE_NATS_USER="u", SIE_NATS_PASSWORD="p", SIE_NATS_TOKEN="t0ken-0xAB")
    assert both == (
        "SIE_NATS_USER/SIE_NATS_PASSWORD and SIE_NATS_TOKEN are set:"
        " set one NATS login (user/password, token, creds file or NKey seed)"
    )
    assert "t0ken-0xAB" not in both


def test_two_files_are_two_logins(tmp_path: Path) -> None:
    seed = tmp_path / "w.nk"
    seed.write_text(user_seed())
    creds = OperatorSetup.create().write_creds(tmp_path / "w.creds", "w")
    message = refusal(SIE_NATS_CREDS_FILE=str(creds), SIE_NATS_NKEY_SEED_FILE=str(seed))
    assert message.startswith("SIE_NATS_CREDS_FILE and SIE_NATS_NKEY_SEED_FILE are set: set one NATS login")


def test_a_token_is_taken_and_redacted() -> None:
    settings = build(SIE_NATS_TOKEN="t0ken-0xAB")
    assert settings.nats_token == "t0ken-0xAB"
    assert settings.redacted()["nats_token"] == REDACTED
    assert "t0ken-0xAB" not in repr(settings)
    assert "t0ken-0xAB" not in json.dumps(settings.redacted())
    assert settings.redact_text("nats: bad token t0ken-0xAB") == f"nats: bad token {REDACTED}"


def test_valid_login_files_are_taken(tmp_path: Path) -> None:
    creds = OperatorSetup.create().write_creds(tmp_path / "w.creds", "w")
    assert build(SIE_NATS_CREDS_FILE=str(creds)).nats_creds_file == str(creds)
    seed = tmp_path / "w.nk"
    seed.write_text(f"  {user_seed()}\n")  # nats-py strips the seed file
    assert build(SIE_NATS_NKEY_SEED_FILE=str(seed)).nats_nkey_seed_file == str(seed)
    pki = make_pki(tmp_path / "pki")
    tls = build(
        SIE_NATS_TLS_CERT_FILE=str(pki.client_cert),
        SIE_NATS_TLS_KEY_FILE=str(pki.client_key),
        SIE_NATS_TLS_CA_FILE=str(pki.ca),
    )
    assert (tls.nats_tls_cert_file, tls.nats_tls_key_file, tls.nats_tls_ca_file) == (
        str(pki.client_cert),
        str(pki.client_key),
        str(pki.ca),
    )
    assert build(SIE_NATS_TLS_CA_FILE=str(pki.ca)).nats_tls_cert_file is None  # a private CA alone


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    for var in ("SIE_NATS_CREDS_FILE", "SIE_NATS_NKEY_SEED_FILE", "SIE_NATS_TLS_CA_FILE"):
        assert refusal(**{var: str(tmp_path / "nope")}) == f"{var}: cannot read {tmp_path / 'nope'}: no such file"
        assert refusal(**{var: str(tmp_path)}) == f"{var}: cannot read {tmp_path}: not a regular file"
    huge = tmp_path / "huge"
    huge.write_bytes(b"x" * (config.MAX_LOGIN_FILE_BYTES + 1))
    assert refusal(SIE_NATS_CREDS_FILE=str(huge)) == (
        f"SIE_NATS_CREDS_FILE: {huge} is larger than 1 MiB: not a credential file"
    )


def _creds_lines(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Broken creds files, each with the line it must be refused with."""
    setup = OperatorSetup.create()
    jwt, seed = setup.user("w")
    other_jwt, _ = setup.user("other")
    expired_jwt, expired_seed = setup.user("old", expires=int(time.time()) - 60)
    account_seed = setup.account.key_pair.seed.decode()
    cases = {
        "not creds": ("hello\n", "holds no user JWT (-----BEGIN NATS USER JWT-----): not a creds file"),
        "malformed jwt": (creds_text("not.a-jwt", seed), "the user JWT in {path} is malformed"),
        "account jwt": (creds_text(setup.account.jwt, seed), "the JWT in {path} is not a user JWT (type 'account')"),
        "expired": (creds_text(expired_jwt, expired_seed), "the user JWT in {path} expired at "),
        "no seed": (creds_text(jwt, seed).split("-----BEGIN USER NKEY SEED")[0], "holds no user NKey seed"),
        "account seed": (creds_text(jwt, account_seed), "the seed in {path} is not a user NKey seed (SU...)"),
        # A character in the middle: the last one also carries base32 padding bits, and a change
        # there that only touches them leaves the decoded seed (and its checksum) as it was.
        "checksum": (
            creds_text(jwt, seed[:20] + ("A" if seed[20] != "A" else "B") + seed[21:]),
            "is not a valid NKey seed",
        ),
        "other user's seed": (creds_text(other_jwt, seed), "the seed in {path} is not the key of the JWT's user"),
        "crlf": (creds_text(jwt, seed).replace("\n", "\r\n"), "has CRLF line endings, which nats-py does not read"),
    }
    return {name: (text, needle) for name, (text, needle) in cases.items()}


def test_broken_creds_files_are_refused_with_one_line_each(tmp_path: Path) -> None:
    for name, (text, needle) in _creds_lines(tmp_path).items():
        path = tmp_path / f"{name.replace(' ', '-')}.creds"
        path.write_text(text, newline="")
        message = refusal(SIE_NATS_CREDS_FILE=str(path))
        assert message.startswith("SIE_NATS_CREDS_FILE: "), (name, message)
        assert needle.format(path=path) in message, (name, message)
        assert not config.NKEY_SEED_RE.search(message), (name, message)  # no seed, ever


def test_an_account_seed_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "account.nk"
    path.write_text(OperatorSetup.create().account.key_pair.seed.decode())
    assert refusal(SIE_NATS_NKEY_SEED_FILE=str(path)) == (
        f"SIE_NATS_NKEY_SEED_FILE: {path} is not a user NKey seed (SU...): it is an account seed"
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "is empty"),
        ("   \n", "is empty"),
        ("hunter2", "is not a user NKey seed (SU...)"),
        ("SUAB", "is not a valid NKey seed (wrong length or checksum)"),
        (user_seed()[:-2] + "AA", "is not a valid NKey seed (wrong length or checksum)"),
        (user_seed() + "\n" + user_seed(), "is not a valid NKey seed (wrong length or checksum)"),
    ],
    ids=["empty", "blank", "password", "short", "checksum", "two seeds"],
)
def test_broken_seed_files_are_refused(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "w.nk"
    path.write_text(content)
    message = refusal(SIE_NATS_NKEY_SEED_FILE=str(path))
    assert message == f"SIE_NATS_NKEY_SEED_FILE: {path} {problem}"


def test_tls_files_are_refused_by_name(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    other = make_pki(tmp_path / "other")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    cert, key = str(pki.client_cert), str(pki.client_key)
    together = "SIE_NATS_TLS_CERT_FILE and SIE_NATS_TLS_KEY_FILE must be set together"
    assert refusal(SIE_NATS_TLS_CERT_FILE=cert) == together
    assert refusal(SIE_NATS_TLS_KEY_FILE=key) == together
    assert refusal(SIE_NATS_TLS_CA_FILE=str(garbage)).startswith(
        f"SIE_NATS_TLS_CA_FILE: {garbage} holds no CA certificate that loads: "
    )
    assert refusal(SIE_NATS_TLS_CERT_FILE=str(garbage), SIE_NATS_TLS_KEY_FILE=key).startswith(
        f"SIE_NATS_TLS_CERT_FILE: {garbage} holds no certificate that loads: "
    )
    mismatch = refusal(SIE_NATS_TLS_CERT_FILE=cert, SIE_NATS_TLS_KEY_FILE=str(other.client_key))
    assert mismatch.startswith(f"SIE_NATS_TLS_KEY_FILE: {other.client_key} does not load as the key of {cert}: ")
    encrypted = encrypt_key(pki.client_key, tmp_path / "encrypted-key.pem", b"passphrase-0xAB")
    assert refusal(SIE_NATS_TLS_CERT_FILE=cert, SIE_NATS_TLS_KEY_FILE=str(encrypted)) == (
        f"SIE_NATS_TLS_KEY_FILE: {encrypted} is encrypted: give the key without a passphrase (the file is the secret)"
    )
    missing = refusal(SIE_NATS_TLS_CERT_FILE=cert, SIE_NATS_TLS_KEY_FILE=str(tmp_path / "nope"))
    assert missing == f"SIE_NATS_TLS_KEY_FILE: cannot read {tmp_path / 'nope'}: no such file"


def test_seeds_are_redacted_from_any_text() -> None:
    seed = user_seed()
    assert redact_text(f"signing with {seed} failed") == f"signing with {REDACTED} failed"
    assert public_key(seed) in redact_text(f"user {public_key(seed)}")  # a public key is no secret


def test_the_login_settings_are_logged_without_secrets(tmp_path: Path) -> None:
    seed = user_seed()
    path = tmp_path / "w.nk"
    path.write_text(seed)
    out = build(SIE_NATS_NKEY_SEED_FILE=str(path)).redacted()
    assert out["nats_nkey_seed_file"] == str(path)
    assert seed not in json.dumps(out)


# ----------------------------------------------------------------------------- unknown SIE_* variables


def test_an_unknown_variable_gets_one_warning_naming_the_closest_known_one() -> None:
    settings = build(SIE_MAX_DELIVERY="5", SIE_NATS_TOKN="t")
    unknown = [w for w in settings.warnings if "is not a variable sie-sidecar reads" in w]
    assert unknown == [
        "SIE_MAX_DELIVERY is not a variable sie-sidecar reads: it is ignored; did you mean SIE_MAX_DELIVER?",
        "SIE_NATS_TOKN is not a variable sie-sidecar reads: it is ignored; did you mean SIE_NATS_TOKEN?",
    ]
    assert settings.max_deliver == 20


def test_known_variables_and_others_prefixes_get_no_warning() -> None:
    env = {name: "" for name in known_env()} | {"SIEGE": "1", "OTEL_SERVICE_NAME": "x", "PATH": "/bin"}
    assert unknown_env_warnings(env) == []


def test_kubernetes_service_links_are_not_typos() -> None:
    """A Service named sie-gateway puts these into every pod of its namespace."""
    env = {
        "SIE_GATEWAY_SERVICE_HOST": "10.0.0.7",
        "SIE_GATEWAY_SERVICE_PORT": "8080",
        "SIE_GATEWAY_SERVICE_PORT_HTTP": "8080",
        "SIE_GATEWAY_PORT": "tcp://10.0.0.7:8080",
        "SIE_GATEWAY_PORT_8080_TCP": "tcp://10.0.0.7:8080",
        "SIE_GATEWAY_PORT_8080_TCP_PROTO": "tcp",
        "SIE_GATEWAY_PORT_8080_TCP_PORT": "8080",
        "SIE_GATEWAY_PORT_8080_TCP_ADDR": "10.0.0.7",
    }
    assert unknown_env_warnings(env) == []
    assert unknown_env_warnings({"SIE_WORKER_PROB_PORT": "9095"}) == [
        "SIE_WORKER_PROB_PORT is not a variable sie-sidecar reads: it is ignored; did you mean SIE_WORKER_PROBE_PORT?"
    ]


def _sie_literals(path: Path) -> set[str]:
    """Every string constant of `path` that is a whole `SIE_*` name (not a prefix like `SIE_BATCHER_`)."""
    tree = ast.parse(path.read_text())
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("SIE_")
        and node.value.replace("_", "").isalnum()
        and node.value.isupper()
        and not node.value.endswith("_")
    }


def test_every_name_the_code_reads_is_known() -> None:
    """The drift guard: a variable added anywhere in the package must be added to the known list."""
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        for name in _sie_literals(path):
            found.setdefault(name, path)
    missing = {name: str(path.relative_to(PACKAGE)) for name, path in found.items() if name not in known_env()}
    assert missing == {}


def test_every_name_the_builder_asks_for_is_known(tmp_path: Path) -> None:
    """The same for what `Settings` asks the environment for, under a few configurations."""
    asked: set[str] = set()
    for extra in (
        {},
        {"SIE_SIDECAR_INGEST": "local", "SIE_SIDECAR_LOCAL_SOCKET": "/s"},
        {"SIE_ADAPTIVE_BATCH_MIN_COST": "1"},
    ):
        env = RecordingEnviron({**BASE, **extra})
        Settings.from_sources(env)
        asked |= {name for name in env.read if name.startswith("SIE_")}
    assert asked - known_env() == set()


def test_the_lists_hold_no_stale_name() -> None:
    """Each env-only name is one the reader reads, each name read elsewhere is in the code outside
    the config package (or the build), so the known list shrinks with the code."""
    inside = {name for path in CONFIG.rglob("*.py") for name in _sie_literals(path)}
    assert set(ENV_ONLY) - inside == set()
    outside: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if CONFIG not in path.parents:
            outside |= _sie_literals(path)
    root = PACKAGE.parents[1]
    build_files = " ".join(
        p.read_text(errors="replace") for p in [*root.glob("native/**/*.rs"), root / "Makefile"] if p.is_file()
    )
    stale = {name for name in READ_ELSEWHERE if name not in outside and name not in build_files}
    assert stale == set()
    assert set(CONTROLLER_ENV_VARS) <= known_env()


def test_the_known_list_holds_every_setting_with_a_variable() -> None:
    assert {spec.env for spec in RUN_FLAGS} <= known_env()
    assert set(config.LIMITS) <= known_env()
    assert len([f for f in dataclasses.fields(Settings) if f.name.startswith("nats_tls")]) == 3


def test_otlp_header_values_are_secrets_redacted_from_error_text() -> None:
    env = {
        "SIE_NATS_URL": "nats://127.0.0.1:4222",
        "SIE_POOL": "p",
        "SIE_BUNDLE": "b",
        "SIE_MACHINE_PROFILE": "m",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cr%3Dt-key,x-tenant=acme",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer%20tok-123",
    }
    settings = Settings.from_env(env)
    assert {"s3cr=t-key", "Bearer tok-123", "acme"} <= set(settings.secret_values())
    text = settings.redact_text("export failed: 401 for key s3cr=t-key / Bearer tok-123")
    assert "s3cr=t-key" not in text and "tok-123" not in text
