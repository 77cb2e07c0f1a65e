# SPDX-License-Identifier: Apache-2.0
"""The §1.1 flag table and the `run` parser: one long flag per §1.1 variable (sidecar-behaviour §1.1).

Every §1.1 variable is a long flag named by dropping `SIE_`, lower-casing and turning `_` into `-`
(`SIE_NATS_URL` ⇄ `--nats-url`, attribute `nats_url`). A flag given on the command line (even as an
empty string) wins over the environment; flags default to `None`, meaning "not given". The §1.1
secrets keep their flag names only to refuse them (`--gateway-api-key` and the two tokens): a flag's
value shows in `ps` to every user, so secrets come from the environment or files, never from flags.
Kept apart from the reader so that the CLI can add the flags without parsing anything.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NoReturn

from ..errors import ConfigError

DEFAULT_IPC_SOCKET_PATH = "/tmp/sie-ipc.sock"
DEFAULT_TRUSTED_PRODUCERS = ("sie-config",)


@dataclass(frozen=True, slots=True)
class RunFlag:
    """One §1.1 variable and its CLI long flag; `default` is help text only (None: no default shown)."""

    env: str
    help: str
    default: str | None = None
    secret: bool = False
    metavar: str = "VALUE"

    @property
    def dest(self) -> str:
        """Namespace attribute: `SIE_NATS_URL` → `nats_url`."""
        return self.env.removeprefix("SIE_").lower()

    @property
    def flag(self) -> str:
        """Long flag: `SIE_NATS_URL` → `--nats-url`."""
        return "--" + self.dest.replace("_", "-")


RUN_FLAGS: tuple[RunFlag, ...] = (
    RunFlag("SIE_SIDECAR_INGEST", "ingest mode: nats (JetStream pull) or local (UDS listener)", "nats", metavar="MODE"),
    RunFlag(
        "SIE_SIDECAR_LOCAL_SOCKET", "UDS path of the local-ingest listener; required in local mode", metavar="PATH"
    ),
    RunFlag("SIE_NATS_URL", "NATS server URL(s), comma-separated; required", metavar="URL"),
    RunFlag("SIE_POOL", "physical pool lane token; required (no '.', '*', '>' or whitespace)", metavar="POOL"),
    RunFlag("SIE_BUNDLE", "bundle id lane token; required", metavar="BUNDLE"),
    RunFlag("SIE_MACHINE_PROFILE", "machine-profile lane token; required", metavar="PROFILE"),
    RunFlag("SIE_IPC_SOCKET_PATH", "primary backend IPC socket", DEFAULT_IPC_SOCKET_PATH, metavar="PATH"),
    RunFlag("SIE_IPC_SOCKET_PATHS", "comma list of per-child backend sockets", "the primary socket", metavar="PATHS"),
    RunFlag(
        "SIE_IPC_POOL_SIZE", "IPC connections per backend child; 0 = unset", "SIE_MAX_CONCURRENT_BATCHES", metavar="N"
    ),
    RunFlag("SIE_IPC_REQUEST_TIMEOUT_S", "ordinary IPC request timeout in seconds, floor 1", "60", metavar="S"),
    RunFlag("SIE_MODEL_READY_TIMEOUT_S", "EnsureModelReady timeout in seconds, floor 1", "900", metavar="S"),
    RunFlag(
        "SIE_WORKER_LIVENESS_BUDGET_S",
        "liveness budget in seconds; > 0 and above the model-ready timeout",
        "unset",
        metavar="S",
    ),
    RunFlag(
        "SIE_PAYLOAD_STORE_URL",
        "offloaded-payload store: s3://bucket[/prefix], file://<dir> or a directory",
        "unset",
        metavar="URL",
    ),
    RunFlag("SIE_GATEWAY_URL", "gateway base URL for pool admission", "unset", metavar="URL"),
    RunFlag("SIE_GATEWAY_API_KEY", "bearer token for the gateway's /v1/pools", secret=True, metavar="KEY"),
    RunFlag("SIE_POOL_ADMISSION_ENABLED", "pool admission gate; 0/false/no/off disables", "true", metavar="BOOL"),
    RunFlag(
        "SIE_POOL_ADMISSION_CHECK_INTERVAL_S", "pool admission poll period in seconds, floor 1", "5.0", metavar="S"
    ),
    RunFlag("SIE_POOL_ADMISSION_PAUSE_S", "sleep while not admitted in seconds, floor 0.1", "1.0", metavar="S"),
    RunFlag(
        "SIE_POOL_ADMISSION_STALE_AFTER_S", "keep the last good decision this long after errors", "30.0", metavar="S"
    ),
    RunFlag("SIE_WORKER_PROBE_PORT", "HTTP probe port (all interfaces)", "9095", metavar="PORT"),
    RunFlag("SIE_WORKER_ID", "worker identity", "$HOSTNAME, else worker-<uuid4>", metavar="ID"),
    RunFlag("SIE_WORKER_PING_INTERVAL_MS", "backend heartbeat period in ms", "2000", metavar="MS"),
    RunFlag("SIE_WORKER_READYZ_STALE_MULT", "readiness window = ping interval x this; 0 means 3", "3", metavar="N"),
    RunFlag("SIE_GPU_COUNT", "GPU count reported in the health heartbeat", "1", metavar="N"),
    RunFlag("SIE_BUNDLE_CONFIG_HASH", "initial bundle-config hash", "empty", metavar="HASH"),
    RunFlag("SIE_CONFIG_SERVICE_URL", "sie-config base URL; unset = reconciler off", "unset", metavar="URL"),
    RunFlag(
        "SIE_CONFIG_SERVICE_TOKEN",
        "bearer for /v1/configs/*; when given it decides (blank = none), else SIE_ADMIN_TOKEN",
        secret=True,
        metavar="TOKEN",
    ),
    RunFlag("SIE_ADMIN_TOKEN", "deprecated fallback bearer for the config service", secret=True, metavar="TOKEN"),
    RunFlag("SIE_WORKER_CONFIG_POLL_INTERVAL_MS", "config epoch poll period in ms, floor 1000", "30000", metavar="MS"),
    RunFlag(
        "SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS",
        "periodic full config export in ms; 0 = startup export only",
        "300000",
        metavar="MS",
    ),
    RunFlag(
        "SIE_NATS_CONFIG_TRUSTED_PRODUCERS", "comma list of trusted config producer ids", "sie-config", metavar="IDS"
    ),
    RunFlag(
        "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER",
        "1/true/yes/on trusts every config producer (dev only)",
        "false",
        metavar="BOOL",
    ),
    RunFlag("SIE_HEALTH_PUBLISH_INTERVAL_MS", "NATS health heartbeat period in ms", "5000", metavar="MS"),
)


#: §1.1 settings this build does not act on yet (local ingest, several backend children, the config
#: service and live config): still parsed, so that a value given is seen (and
#: refused where start-up refuses it), but not offered in `--help` until they work.
NOT_YET_FLAGS: frozenset[str] = frozenset()
ENV_ONLY_HELP = (
    "Tuning without a flag (SIE_MAX_DELIVER, SIE_NAK_DELAY_S, SIE_NATS_FETCH_BUDGET, SIE_BATCHER_*, "
    "SIE_ADAPTIVE_*, SIE_RUST_PIPELINE_DEPTH, SIE_MAX_CONCURRENT_BATCHES, ...) is read from the environment "
    "only: see docs/operations.md, section Env-only tuning. So are secrets and NATS logins "
    "(SIE_GATEWAY_API_KEY, SIE_CONFIG_SERVICE_TOKEN, SIE_ADMIN_TOKEN, SIE_NATS_USER/_PASSWORD, "
    "SIE_NATS_TOKEN, SIE_NATS_CREDS_FILE, SIE_NATS_NKEY_SEED_FILE, SIE_NATS_TLS_CERT_FILE/_KEY_FILE/_CA_FILE): "
    "a flag's value is visible to every user in ps."
)


def help_text(spec: RunFlag) -> str:
    """The `--help` line of one flag. Secrets never show a default or a value; the env var is named
    so operators know the fallback."""
    suffix = f"env {spec.env}; secret" if spec.secret else f"env {spec.env}"
    if spec.default is not None and not spec.secret:
        suffix += f"; default {spec.default}"
    return f"{spec.help} ({suffix})".replace("%", "%%")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one long flag per §1.1 variable, all defaulting to None so the environment can fill in;
    those in NOT_YET_FLAGS are accepted but left out of `--help`. The secrets' flags are parsed only
    so that `Settings` can refuse them by name (unknown to argparse, its error would echo the value)."""
    group = parser.add_argument_group(
        "settings (each flag overrides its environment variable)", description=ENV_ONLY_HELP
    )
    for spec in RUN_FLAGS:
        hidden = spec.env in NOT_YET_FLAGS or spec.secret
        shown = argparse.SUPPRESS if hidden else help_text(spec)
        group.add_argument(spec.flag, dest=spec.dest, default=None, metavar=spec.metavar, help=shown)


def refuse_secret_flags(namespace: argparse.Namespace | None) -> None:
    """A secret given as a flag is refused (exit code 2), naming the flag and the variable to use
    instead and never the value: the value has already shown in `ps`, so the mistake must stop here."""
    if namespace is None:
        return
    for spec in RUN_FLAGS:
        if spec.secret and getattr(namespace, spec.dest, None) is not None:
            raise ConfigError(
                f"{spec.flag} is refused: secrets are read from the environment only (set {spec.env}),"
                " never from flags, whose values every user sees in ps"
            )


class _RaisingParser(argparse.ArgumentParser):
    """argparse exits on bad input; `Settings.from_env` reports it as a ConfigError instead."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_run_parser() -> argparse.ArgumentParser:
    """A stand-alone parser of the run flags (used by `Settings.from_env`)."""
    parser = _RaisingParser(prog="sie-sidecar run", allow_abbrev=False, add_help=False)
    add_run_arguments(parser)
    return parser
