# SPDX-License-Identifier: Apache-2.0
"""Settings of `sie-sidecar run`: sidecar-behaviour §1.1 (flag ⇄ env), §1.2 (env-only tuning), §1.3 (names).

Two entry points build the same frozen `Settings`:

* `Settings.from_env(environ, argv)` parses `argv` (the flags of `run` only, no sub-command) with a
  parser of its own and then reads `environ`;
* `Settings.from_sources(environ, namespace)` takes an `argparse.Namespace` the CLI already parsed
  after calling `add_run_arguments(parser)` on its `run` sub-parser.

Every §1.1 variable is a long flag named by dropping `SIE_`, lower-casing and turning `_` into `-`
(`SIE_NATS_URL` ⇄ `--nats-url`, attribute `nats_url`). A flag given on the command line (even as an
empty string) wins over the environment; flags default to `None`, meaning "not given". The §1.2
variables and the NATS logins (`SIE_NATS_USER` / `_PASSWORD`, `_TOKEN`, `_CREDS_FILE`,
`_NKEY_SEED_FILE`, `_TLS_*_FILE`) are env only. The §1.1 secrets keep their flag names only to refuse
them (`--gateway-api-key` and the two tokens): a flag's value shows in `ps` to every user, so secrets
come from the environment or files, never from flags (newer than v0.7.1).

Parsing policy (the spec is silent on malformed values, so this module settles it):

* a malformed §1.1 number is a startup error (`ConfigError`), as a typed CLI flag would be;
* a malformed §1.2 value, or one outside the range the spec gives it, falls back to its default and
  adds a line to `Settings.warnings`, which the caller logs once logging is up (the modules that
  read these variables upstream ignore what they cannot parse);
* a number larger than the server or the protocol can take (`LIMITS`: JetStream's int64 fields,
  durations that must fit int64 nanoseconds, ports, per-process counts) is a startup error naming the
  variable, in §1.1 and §1.2 alike: it would otherwise pass here and fail later with a traceback;
* a setting this build parses but does not implement yet (`NOT_YET`) is refused by
  `Settings.require_supported()` when its value differs from the default: `SIE_X is not supported
  yet`, never a silent no-op;
* a blank (whitespace-only) §1.1 value counts as unset, except `SIE_PAYLOAD_STORE_URL`, where only
  the empty string does (§1.1, §12), and `SIE_CONFIG_SERVICE_TOKEN`, where blank means "send none";
* a boolean takes 1/true/yes/on or 0/false/no/off (any case; some variables take fewer, see `_flag`),
  and any other word is a startup error: upstream reads an unknown word as off, silently;
* `SIE_NATS_URL` is parsed here (scheme, host, port) and each NATS login is checked here (the file
  readable, the creds or seed well formed, the certificate and key loading), so a mistake stops
  start-up with exit code 2 and one line naming the variable instead of a retry loop;
* an `SIE_*` variable that nothing reads (`KNOWN_ENV`) gets one warning naming the closest known one.

Secrets (`SIE_GATEWAY_API_KEY`, `SIE_ADMIN_TOKEN`, `SIE_CONFIG_SERVICE_TOKEN`, `SIE_NATS_PASSWORD`,
`SIE_NATS_TOKEN`, NKey seeds, userinfo in URLs) never appear in `repr()`, `redacted()`, `--help` or
error messages; the seeds are read only to be checked and are never kept.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import json
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn
from urllib.parse import unquote, urlsplit

from sie_sidecar import wire
from sie_sidecar.errors import ConfigError, SubjectError

if TYPE_CHECKING:
    import ssl

IngestMode = Literal["nats", "local"]
#: Who `GET /debug/state` answers (`SIE_SIDECAR_DEBUG_ENDPOINT`): loopback peers only, or any peer.
DebugPeers = Literal["loopback", "all"]

REDACTED = "<redacted>"

DEFAULT_IPC_SOCKET_PATH = "/tmp/sie-ipc.sock"
DEFAULT_TRUSTED_PRODUCERS = ("sie-config",)

_UINT_RE = re.compile(r"[0-9]+", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.I)
_FALSY = frozenset({"0", "false", "no", "off"})
_TRUTHY = frozenset({"1", "true", "yes", "on"})
_MUX_ON = frozenset({"1", "true", "TRUE", "on", "ON"})  # exactly these spellings (§1.2), no trimming
_WAVE_OFF = frozenset({"0", "off", "false", "no", "disabled"})
#: SIE_NATS_CONSERVATIVE_CLEANUP is on for exactly these (v0.7.1 reads `yes` and `on` as off, so
#: those two are refused rather than read either way).
_CLEANUP_ON = frozenset({"1", "true"})

#: The schemes nats-py connects with; a missing port is 4222 for nats:// and tls:// (every NATS
#: client's default) and the URL standard's 80 / 443 for ws:// / wss://.
NATS_URL_SCHEMES: Final = ("nats", "tls", "ws", "wss")
NATS_WEBSOCKET_SCHEMES: Final = ("ws", "wss")
#: The most of a creds, seed, certificate or key file read at start-up: a mistaken path (a log, a
#: device) must not be read whole. Real ones are a few KiB.
MAX_LOGIN_FILE_BYTES: Final = 1 << 20
#: An NKey seed as it appears in text (`S` + the key type + 56 base32 characters): redacted wherever
#: it appears, whatever variable or file it came from.
_SEED_RE = re.compile(r"S[ACNOPUX][A-Z2-7]{56}")


INT64_MAX = 2**63 - 1
#: Durations go on the wire as int64 nanoseconds (JetStream max_age, ack_wait, NAK delays, pull
#: expiry); every duration setting is held to that range (~292 years), wire-bound or not.
MAX_DURATION_S = INT64_MAX // 1_000_000_000
MAX_DURATION_MS = INT64_MAX // 1_000_000
#: Per-unit resources the process opens (IPC connections, tasks, decode threads): far above any real
#: setting, low enough that a typo cannot allocate the machine away (`IpcClient` builds its slots up front).
MAX_CONCURRENCY = 65_536
MAX_READYZ_STALE_MULT = 1 << 20
#: The redelivery envelope per delivery (§7: a request tombstone outlives 30 s x max_deliver).
REDELIVERY_S_PER_DELIVERY: Final = 30
#: No tombstone, lease or deadline budget reaches past 30 days (§7).
MAX_TOMBSTONE_S: Final = 30 * 86400
#: §1.2: SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS and SIE_WORK_DEADLINE_MAX_BUDGET_S are capped here.
MAX_DEADLINE_SKEW_MS: Final = 60_000
MAX_DEADLINE_BUDGET_S: Final = 86_400.0
#: §2.3: the parked-group deadline, 30 s x max_deliver, saturates at about 30 years.
MAX_REDELIVERY_ENVELOPE_S: Final = 30 * 365 * 86400.0


def tombstone_horizon(stream_max_age_s: int, max_deliver: int) -> float:
    """§7: how long anything about a work item can matter, max(stream max age, 30 s x max_deliver),
    at most 30 days (request tombstones, and the cap of deadline leases and budgets)."""
    return float(min(max(stream_max_age_s, REDELIVERY_S_PER_DELIVERY * max_deliver), MAX_TOMBSTONE_S))


def redelivery_envelope(max_deliver: int) -> float:
    """§2.3: 30 s x max_deliver (600 s by default), capped near 30 years: a parked group's deadline."""
    return min(float(REDELIVERY_S_PER_DELIVERY * max_deliver), MAX_REDELIVERY_ENVELOPE_S)


#: The worker-direct stream keeps 300 s x max_deliver of history (§2.2), which must fit max_age.
_WORKER_AGE_PER_DELIVERY_S = 300

#: The largest value each numeric variable may take (see the module docstring); `math.inf` where any
#: finite value is meaningful. Below-range values keep the spec's treatment (error, floor or default).
LIMITS: Mapping[str, float] = {
    # §1.1
    "SIE_IPC_POOL_SIZE": MAX_CONCURRENCY,
    "SIE_IPC_REQUEST_TIMEOUT_S": MAX_DURATION_S,
    "SIE_MODEL_READY_TIMEOUT_S": MAX_DURATION_S,
    "SIE_WORKER_LIVENESS_BUDGET_S": MAX_DURATION_S,
    "SIE_POOL_ADMISSION_CHECK_INTERVAL_S": MAX_DURATION_S,
    "SIE_POOL_ADMISSION_PAUSE_S": MAX_DURATION_S,
    "SIE_POOL_ADMISSION_STALE_AFTER_S": MAX_DURATION_S,
    "SIE_WORKER_PROBE_PORT": 65535,
    # The readiness window is ping interval x stale multiplier; both bounds keep it a valid duration.
    "SIE_WORKER_PING_INTERVAL_MS": MAX_DURATION_MS // MAX_READYZ_STALE_MULT,
    "SIE_WORKER_READYZ_STALE_MULT": MAX_READYZ_STALE_MULT,
    "SIE_GPU_COUNT": MAX_CONCURRENCY,
    "SIE_WORKER_CONFIG_POLL_INTERVAL_MS": MAX_DURATION_MS,
    "SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS": MAX_DURATION_MS,
    "SIE_HEALTH_PUBLISH_INTERVAL_MS": MAX_DURATION_MS,
    # §1.2
    "SIE_MAX_DELIVER": MAX_DURATION_S // _WORKER_AGE_PER_DELIVERY_S,
    "SIE_MAX_ACK_PENDING": INT64_MAX,
    "SIE_STREAM_MAX_AGE_S": MAX_DURATION_S,
    "SIE_STREAM_REPLICAS": 5,  # JetStream's own maximum
    "SIE_NATS_CONSUMER_RECONCILE_INTERVAL_MS": MAX_DURATION_MS,
    "SIE_NATS_FETCH_BUDGET": INT64_MAX,
    "SIE_NATS_PULL_EXPIRES_S": INT64_MAX,  # 1..29 is the spec's range; others fall back to 5
    "SIE_NATS_CONNECT_TIMEOUT_S": MAX_DURATION_S,
    "SIE_NATS_PING_INTERVAL_S": MAX_DURATION_S,
    "SIE_NATS_MAX_OUTSTANDING_PINGS": MAX_CONCURRENCY,
    "SIE_NATS_ACK_CONFIRM_S": MAX_DURATION_S,
    "SIE_PULL_LOOP_INFLIGHT": MAX_CONCURRENCY,
    "SIE_PULL_LOOP_MAX_OUTSTANDING": INT64_MAX,
    "SIE_MAX_CONCURRENT_BATCHES": MAX_CONCURRENCY,
    "SIE_AUDIO_PREP_PERMITS": MAX_CONCURRENCY,
    "SIE_NAK_DELAY_S": MAX_DURATION_S,
    "SIE_SCHEDULER_DRAIN_DEADLINE_MS": MAX_DURATION_MS,
    "SIE_RUST_PIPELINE_DEPTH": INT64_MAX,  # then clamped to 1..8
    "SIE_BATCHER_MAX_BATCH_WAIT_MS": MAX_DURATION_MS,
    "SIE_BATCHER_MAX_BATCH_COST": INT64_MAX,
    "SIE_BATCHER_MAX_BATCH_REQUESTS": INT64_MAX,
    "SIE_BATCHER_COALESCE_MS": MAX_DURATION_MS,
    "SIE_BATCHER_COALESCE_RATIO": math.inf,  # a fraction of the wait, min'ed with the coalesce window
    "SIE_ADAPTIVE_MIN_QUANTUM_MS": MAX_DURATION_MS,
    "SIE_ADAPTIVE_MAX_QUANTUM_MS": MAX_DURATION_MS,
    "SIE_ADAPTIVE_TARGET_P50_MS": MAX_DURATION_MS,
    "SIE_GENERATE_IPC_FRAME_TIMEOUT_S": MAX_DURATION_S,
    "SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS": INT64_MAX,  # then capped at 60 s (§1.2)
    "SIE_WORK_DEADLINE_MAX_BUDGET_S": MAX_DURATION_S,  # then capped at 24 h and the tombstone horizon
}


# ------------------------------------------------------------------------------------------ §1.1 flags


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


def _help_text(spec: RunFlag) -> str:
    # Secrets never show a default or a value; the env var is named so operators know the fallback.
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
        shown = argparse.SUPPRESS if hidden else _help_text(spec)
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


# ------------------------------------------------------------------------------- the known variables

#: The NATS logins (env only; newer than v0.7.1 except user/password).
NATS_LOGIN_ENV: Final = (
    "SIE_NATS_USER",
    "SIE_NATS_PASSWORD",
    "SIE_NATS_TOKEN",
    "SIE_NATS_CREDS_FILE",
    "SIE_NATS_NKEY_SEED_FILE",
    "SIE_NATS_TLS_CERT_FILE",
    "SIE_NATS_TLS_KEY_FILE",
    "SIE_NATS_TLS_CA_FILE",
)
#: What `_Builder` reads that has no flag and no `LIMITS` row.
ENV_ONLY: Final = (
    *NATS_LOGIN_ENV,
    "SIE_STREAM_STORAGE",
    "SIE_NATS_CONSERVATIVE_CLEANUP",
    "SIE_RUST_WAVE_CADENCE",
    "SIE_BATCHER_IDLE_BYPASS_ENABLED",
    "SIE_BATCHER_JIT_DISPATCH_ENABLED",
    "SIE_SIDECAR_CONTROLLER_TRACE",
    "SIE_SIDECAR_DEBUG_ENDPOINT",
    "SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS",
    "SIE_HEALTH_PUBLISH_ENABLED",
    "SIE_IPC_MUX",
    "SIE_METRICS_ENABLED",
    "SIE_TRACING_ENABLED",
    "SIE_METRIC_MODEL_ALLOWLIST",
    "SIE_OTEL_LANE",
    "SIE_OTEL_DEPLOYMENT_ENVIRONMENT",
    "SIE_OTEL_CLOUD_REGION",
    "SIE_CLOUD_REGION",
    "SIE_WORK_DEADLINE_ENFORCE",
)
#: Read outside this module: the wire switch, the payload stores, the backend, the per-model
#: controller's overrides (`sched/controller_params.ENV_VARS`), and the build and fuzz tools.
READ_ELSEWHERE: Final = (
    "SIE_SIDECAR_NO_EXTENSIONS",
    "SIE_OSS_REGION",
    "SIE_OSS_USE_INTERNAL_ENDPOINT",
    "SIE_OOM_NAK_DELAY_S",
    "SIE_ADAPTIVE_BATCH_TARGET_P50_MS",
    "SIE_ADAPTIVE_BATCH_CALIBRATION_MULT",
    "SIE_ADAPTIVE_BATCH_MIN_TARGET_P50_MS",
    "SIE_ADAPTIVE_BATCH_MAX_TARGET_P50_MS",
    "SIE_ADAPTIVE_BATCH_MIN_WAIT_MS",
    "SIE_ADAPTIVE_BATCH_MAX_WAIT_MS",
    "SIE_ADAPTIVE_BATCH_INITIAL_WAIT_MS",
    "SIE_ADAPTIVE_BATCH_MIN_COST",
    "SIE_ADAPTIVE_BATCH_MAX_COST",
    "SIE_ADAPTIVE_BATCH_INITIAL_COST",
    "SIE_BUILD_PYTHON",
    "SIE_PYTHON_INCLUDE",
    "SIE_FUZZ_ITERATIONS",
)


def known_env() -> frozenset[str]:
    """Every `SIE_*` variable something in this package (or its build) reads: the §1.1 flags' and
    the `LIMITS` rows' variables, which are the settings themselves, plus the two lists above
    (tests/unit/test_config_refusals.py fails when code reads a name missing here)."""
    return frozenset({spec.env for spec in RUN_FLAGS} | set(LIMITS) | set(ENV_ONLY) | set(READ_ELSEWHERE))


#: Kubernetes' service links: a Service named `sie-gateway` puts `SIE_GATEWAY_SERVICE_HOST`,
#: `SIE_GATEWAY_PORT=tcp://...` and the like into every pod of its namespace. Not a typo of ours.
_SERVICE_LINK_RE = re.compile(
    r"SIE_[A-Z0-9_]+_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT_[0-9]+_(?:TCP|UDP|SCTP)(?:_PROTO|_PORT|_ADDR)?)"
)
_SERVICE_LINK_VALUE_RE = re.compile(r"(?:tcp|udp|sctp)://\S+:[0-9]+")


def unknown_env_warnings(environ: Mapping[str, str]) -> list[str]:
    """One line per `SIE_*` variable that nothing reads, naming the closest known one: a misspelt
    name is otherwise ignored without a word (`SIE_MAX_DELIVERY=5` serves with 20)."""
    known = known_env()
    unknown = []
    for name in sorted(k for k in environ if k.startswith("SIE_") and k not in known):
        value = environ.get(name) or ""
        link_port = name.endswith("_PORT") and _SERVICE_LINK_VALUE_RE.fullmatch(value) is not None
        if link_port or _SERVICE_LINK_RE.fullmatch(name):
            continue
        unknown.append(name)
    if not unknown:
        return []
    import difflib  # only when there is something to suggest

    lines = []
    for name in unknown:
        closest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.0)
        hint = f"; did you mean {closest[0]}?" if closest else ""
        lines.append(f"{name} is not a variable sie-sidecar reads: it is ignored{hint}")
    return lines


# ------------------------------------------------------------------------------------------- redaction


def redact_url_userinfo(url: str) -> str:
    """Replace `user:pass@` (or a bare `token@`) in each comma-separated URL with `<redacted>@`."""
    parts = []
    for part in url.split(","):
        scheme, sep, rest = part.partition("://")
        if not sep:
            scheme, rest = "", part
        end = len(rest)
        for stop in "/?#":
            index = rest.find(stop)
            if index != -1:
                end = min(end, index)
        at = rest.rfind("@", 0, end)
        if at != -1:
            rest = f"{REDACTED}@{rest[at + 1 :]}"
        parts.append(f"{scheme}{sep}{rest}")
    return ",".join(parts)


def strip_url_userinfo(url: str) -> tuple[str, bool]:
    """Each comma-separated URL without its `user:pass@` (or `token@`), and whether any had one:
    embedded userinfo is not used to authenticate (sidecar-behaviour §1.2, newer than v0.7.1)."""
    redacted = redact_url_userinfo(url)
    return redacted.replace(f"{REDACTED}@", ""), redacted != url


_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@,]*)@")


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    """Free text with `scheme://userinfo@` replaced by `scheme://<redacted>@`, each secret and anything
    shaped like an NKey seed by `<redacted>`."""
    out = _USERINFO_RE.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    out = _SEED_RE.sub(REDACTED, out)
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            out = out.replace(secret, REDACTED)
    return out


def _lower_scheme(url: str) -> str:
    """`NATS://host` as nats-py reads schemes (case-sensitively): `nats://host`."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}" if sep else url


#: The order boolean words are listed in, in refusal lines.
_WORD_ORDER: Final = ("1", "true", "yes", "on", "0", "false", "no", "off", "disabled")


def _words(words: frozenset[str]) -> str:
    """`1, true, yes or on`."""
    ordered = sorted(words, key=lambda w: (_WORD_ORDER.index(w) if w in _WORD_ORDER else len(_WORD_ORDER), w))
    return ordered[0] if len(ordered) == 1 else f"{', '.join(ordered[:-1])} or {ordered[-1]}"


def _number(value: float) -> str:
    """A number for an error message: integers exactly, floats as Python writes them."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e16):
        return str(int(value))
    return repr(value)


def _userinfo_parts(url: object) -> list[str]:
    """The `user:password` userinfo of each URL in a comma list, whole and split (for redaction)."""
    if not isinstance(url, str):
        return []
    parts: list[str] = []
    for entry in url.split(","):
        _, sep, rest = entry.partition("://")
        rest = rest if sep else entry
        end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
        at = rest.rfind("@", 0, end)
        if at > 0:
            userinfo = rest[:at]
            parts.append(userinfo)
            parts.extend(p for p in userinfo.split(":", 1)[1:] if p)
    return parts


# ------------------------------------------------------------------------------------------- settings


#: The most messages a derived pull-ahead keeps outstanding per consumer (an explicit
#: SIE_PULL_LOOP_MAX_OUTSTANDING may go higher).
MAX_DERIVED_OUTSTANDING = 2048


@dataclass(frozen=True, slots=True)
class ConcurrencyLimits:
    """Every bound on how much the sidecar does at once, named in one place (docs/operations.md).

    From the broker to the backend: `pull_outstanding` messages per consumer (delivered and not yet
    settled, plus pull credit); `pull_batches` pulled batches per consumer being handled at once;
    `model_groups` per-model groups of a batch in intake and preparation at once; `pipeline_depth`
    formed batches per model in flight to the backend (widened to its dispatch width); `ipc_connections`
    pooled connections to the backend; `audio_decodes` audio clips decoded at once (CPU).
    """

    pull_outstanding: int
    pull_batches: int
    model_groups: int
    pipeline_depth: int
    ipc_connections: int
    audio_decodes: int

    def pull_outstanding_for(self, count_cap: int, max_ack_pending: int) -> int:
        """The derived pull-ahead (SIE_PULL_LOOP_MAX_OUTSTANDING unset): room for `pull_batches`
        full batches of the largest count cap a backend reported, never below the configured
        default, never past the consumer's max_ack_pending (the server would not deliver more) nor
        MAX_DERIVED_OUTSTANDING."""
        derived = min(MAX_DERIVED_OUTSTANDING, max_ack_pending, self.pull_batches * max(1, count_cap))
        return max(self.pull_outstanding, derived)


class OtlpHeaders:
    """`OTEL_EXPORTER_OTLP_[SIGNAL_]HEADERS` as given (`key=value,...`, values URL-encoded; the SDK
    parses them). They carry API keys, so `repr`, `str` and a deep copy (what `dataclasses.asdict`,
    hence `Settings.redacted()`, makes of it) are `<redacted>`; `reveal()` is the text."""

    __slots__ = ("_text",)

    def __init__(self, text: str = "") -> None:
        self._text = text

    def reveal(self) -> str:
        return self._text

    def __bool__(self) -> bool:
        return bool(self._text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OtlpHeaders) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)

    def __str__(self) -> str:
        return REDACTED if self._text else ""

    def __repr__(self) -> str:
        return repr(str(self))

    def __deepcopy__(self, memo: dict[int, object]) -> str:
        return str(self)


@dataclass(frozen=True, slots=True)
class OtlpTransport:
    """How one signal's OTLP exporter connects, beyond endpoint and protocol: each field from
    `OTEL_EXPORTER_OTLP_{METRICS,TRACES}_*`, else the generic `OTEL_EXPORTER_OTLP_*` (OTLP exporter
    spec). Passed to the SDK's exporters explicitly, so they read nothing else."""

    #: `_HEADERS`: sent with every export (HTTP headers; gRPC metadata).
    headers: OtlpHeaders = field(default_factory=OtlpHeaders)
    #: `_COMPRESSION`: `gzip` or `none`.
    compression: str = "none"
    #: `_CERTIFICATE` (the CA bundle to verify the server with), `_CLIENT_KEY`, `_CLIENT_CERTIFICATE`
    #: (mutual TLS): PEM file paths.
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    #: `_TIMEOUT`, milliseconds as the specification says (10,000); here in seconds.
    timeout_s: float = 10.0
    #: `_INSECURE` (gRPC, for an endpoint without a scheme): plaintext instead of TLS.
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class OtelSettings:
    """The OTLP side of §1.2 and the resource of §13, from the standard `OTEL_*` variables (the
    OpenTelemetry SDK exports; `otel/`)."""

    metrics_endpoint: str | None = None
    metrics_protocol: str = "grpc"
    export_interval_s: float = 5.0
    service_name: str = "sie-worker-sidecar"
    lane: str = "other"
    deployment_environment: str = "unknown"
    cloud_region: str = "unknown"
    #: `SIE_METRIC_MODEL_ALLOWLIST`: the models the telemetry catalog starts with (profile `default`).
    model_allowlist: tuple[str, ...] = ()
    #: `OTEL_RESOURCE_ATTRIBUTES` (`key=value,...`, values URL-decoded), in order: they override the
    #: sidecar's own resource attributes (`service.instance.id` included) but `service.name`, which
    #: `OTEL_SERVICE_NAME` overrides in turn.
    resource_attributes: tuple[tuple[str, str], ...] = ()
    #: `OTEL_SDK_DISABLED=true`: no signal is exported.
    sdk_disabled: bool = False
    #: `OTEL_METRICS_EXPORTER` / `OTEL_TRACES_EXPORTER`: `otlp` (the default) or `none`.
    metrics_exporter: str = "otlp"
    traces_exporter: str = "otlp"
    #: `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`: `cumulative`, `delta` or `lowmemory`.
    metrics_temporality: str = "cumulative"
    metrics_transport: OtlpTransport = field(default_factory=OtlpTransport)
    # Traces (§1.2, `SIE_TRACING_ENABLED`): endpoint and protocol resolved like the metrics' ones;
    # the sampler and the batch span processor from the standard OTEL_TRACES_* / OTEL_BSP_* variables.
    traces_endpoint: str | None = None
    traces_protocol: str = "grpc"
    traces_transport: OtlpTransport = field(default_factory=OtlpTransport)
    #: `OTEL_TRACES_SAMPLER` (lower case; unknown → the OTEL default, with a warning).
    traces_sampler: str = "parentbased_always_on"
    #: `OTEL_TRACES_SAMPLER_ARG` for the ratio samplers, in [0, 1] (else 1.0, with a warning).
    traces_sampler_ratio: float = 1.0
    #: `OTEL_BSP_SCHEDULE_DELAY` (ms) / `OTEL_BSP_MAX_QUEUE_SIZE` / `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` /
    #: `OTEL_BSP_EXPORT_TIMEOUT` (ms): the SDK's BatchSpanProcessor.
    traces_schedule_delay_s: float = 5.0
    traces_max_queue: int = 2048
    traces_max_export_batch: int = 512
    traces_export_timeout_s: float = 30.0


#: The OTLP protocols the SDK's exporters speak; `http/json` (the third of the spec) has none in Python.
OTLP_PROTOCOLS: Final = ("grpc", "http/protobuf")
#: `OTEL_EXPORTER_OTLP_*_COMPRESSION` values (OTLP exporter spec).
OTLP_COMPRESSIONS: Final = ("gzip", "none")
#: `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE` values (OTLP metrics exporter spec).
OTLP_TEMPORALITIES: Final = ("cumulative", "delta", "lowmemory")


#: OTEL_TRACES_SAMPLER values (OTEL SDK environment spec); the ratio ones read OTEL_TRACES_SAMPLER_ARG.
TRACES_SAMPLERS: frozenset[str] = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)

#: The TLS files of an OTLP exporter (`OTEL_EXPORTER_OTLP_[SIGNAL_]<NAME>`, `OtlpTransport` fields).
_OTLP_FILES: Final = ("certificate", "client_key", "client_certificate")


def _picked(picked: tuple[str, str] | None) -> str | None:
    return picked[1] if picked is not None else None


@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Everything `sie-sidecar run` is configured with; build it with `from_env` or `from_sources`."""

    pool: str
    bundle: str
    machine_profile: str
    worker_id: str
    # §1.1
    ingest: IngestMode = "nats"
    local_socket: str | None = None
    nats_url: str | None = field(default=None, repr=False)
    nats_user: str | None = None
    nats_password: str | None = field(default=None, repr=False)
    #: The other NATS logins (env only, newer than v0.7.1), at most one of them with user/password:
    #: a token, a creds file (user JWT + NKey seed, operator mode) or an NKey seed file. Only the
    #: files' paths are kept; their secrets are read by nats-py when it signs the server's nonce.
    nats_token: str | None = field(default=None, repr=False)
    nats_creds_file: str | None = None
    nats_nkey_seed_file: str | None = None
    #: Client-certificate TLS (`SIE_NATS_TLS_CERT_FILE` with `_KEY_FILE`), with any of the logins;
    #: `SIE_NATS_TLS_CA_FILE` is the CA that verifies the server (instead of the system store).
    nats_tls_cert_file: str | None = None
    nats_tls_key_file: str | None = None
    nats_tls_ca_file: str | None = None
    ipc_socket_path: str = DEFAULT_IPC_SOCKET_PATH
    ipc_socket_paths: tuple[str, ...] = (DEFAULT_IPC_SOCKET_PATH,)
    ipc_pool_size: int = 4
    ipc_request_timeout_s: float = 60.0
    model_ready_timeout_s: float = 900.0
    worker_liveness_budget_s: float | None = None
    payload_store_url: str | None = None
    gateway_url: str | None = field(default=None, repr=False)
    gateway_api_key: str | None = field(default=None, repr=False)
    pool_admission_enabled: bool = True
    pool_admission_check_interval_ms: int = 5000
    pool_admission_pause_ms: int = 1000
    pool_admission_stale_after_ms: int = 30000
    worker_probe_port: int = 9095
    worker_ping_interval_ms: int = 2000
    worker_readyz_stale_mult: int = 3
    gpu_count: int = 1
    bundle_config_hash: str = ""
    config_service_url: str | None = field(default=None, repr=False)
    config_service_token: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    worker_config_poll_interval_ms: int = 30000
    worker_config_full_export_interval_ms: int = 300000
    nats_config_trusted_producers: tuple[str, ...] = DEFAULT_TRUSTED_PRODUCERS
    nats_config_trust_any_producer: bool = False
    health_publish_interval_ms: int = 5000
    # §1.2
    max_deliver: int = 20
    max_ack_pending: int = 1000
    stream_max_age_s: int = 1800
    stream_storage: Literal["memory", "file"] = "memory"
    stream_replicas: int = 1
    nats_conservative_cleanup: bool = False
    nats_consumer_reconcile_interval_ms: int = 30000
    nats_fetch_budget: int = 64
    fallback_batch_budget: int = 64
    nats_pull_expires_s: int = 5
    pull_loop_inflight: int = 4
    pull_loop_max_outstanding: int = 64
    #: SIE_PULL_LOOP_MAX_OUTSTANDING was set: the pull-ahead stays there, not derived from batch budgets.
    pull_outstanding_pinned: bool = False
    max_concurrent_batches: int = 4
    #: Concurrent audio decodes per process (scheduler-and-prep §7.3), each on a worker thread.
    audio_prep_permits: int = 1
    nak_delay_ms: int = 5000
    scheduler_drain_deadline_ms: int = 10000
    pipeline_depth: int = 2
    wave_cadence: bool = True
    batcher_idle_bypass_enabled: bool = True
    #: Just-in-time dispatch while the backend is busy (our extension; `SIE_BATCHER_JIT_DISPATCH_ENABLED`).
    batcher_jit_dispatch_enabled: bool = True
    batcher_max_batch_wait_ms: float = 15.0
    batcher_max_batch_cost: int = 16384
    batcher_max_batch_requests: int = 12
    #: SIE_BATCHER_MAX_BATCH_REQUESTS was set: the count cap stays there, not derived from batch budgets.
    batcher_requests_pinned: bool = False
    batcher_coalesce_ms: float = 5.0
    batcher_coalesce_ratio: float = 0.5
    #: SIE_BATCHER_MAX_BATCH_COST was set: every model keeps that cap, whatever budget it reports.
    batcher_cost_pinned: bool = False
    #: The `SIE_ADAPTIVE_BATCH_*` variables as given; each model's controller applies them (§4.2).
    adaptive_batch_env: tuple[tuple[str, str], ...] = ()
    #: Directory for live, replayable controller traces (our extension; off when unset).
    controller_trace_dir: str | None = None
    #: `GET /debug/state` on the probe port (our extension, `SIE_SIDECAR_DEBUG_ENDPOINT`): on by
    #: default, so `sie-sidecar top` works as installed; `off` turns it (and the recording it needs) off.
    debug_endpoint: bool = True
    #: Who it answers: `loopback` (127.0.0.0/8, ::1; any other peer gets 403) unless `all` is set.
    debug_endpoint_peers: DebugPeers = "loopback"
    adaptive_min_quantum_ms: float = 2.0
    adaptive_max_quantum_ms: float = 15.0
    adaptive_target_p50_ms: float = 50.0
    pull_quantum_include_queue_ms: bool = False
    health_publish_enabled: bool = True
    generate_ipc_frame_timeout_s: int = 300
    ipc_mux: bool = False
    #: Deadline of the first NATS connection (our extension, `SIE_NATS_CONNECT_TIMEOUT_S`); later
    #: reconnects retry forever.
    nats_connect_timeout_s: float = 30.0
    #: Client PING period and how many may go unanswered (our extension, `SIE_NATS_PING_INTERVAL_S`,
    #: `SIE_NATS_MAX_OUTSTANDING_PINGS`): a server that stops answering without closing the socket
    #: (frozen, a VM pause, a half-open route) is left after interval * (pings + 1) at most, 20 s by
    #: default, inside ack_wait; nats-py's own 120 s and 2 pings left a sidecar idle for minutes.
    nats_ping_interval_s: float = 5.0
    nats_max_outstanding_pings: int = 3
    #: Confirmed ACKs (our extension, `SIE_NATS_ACK_CONFIRM_S`; 0: off): each batch's last ACK asks
    #: for JetStream's answer, and a batch unanswered after this long is ACKed again (the wait
    #: doubling) while its connection stands, until ack_wait has passed, so ACKs lost with a
    #: durable's leader do not become duplicates (bus/ack_confirm.py).
    nats_ack_confirm_s: float = 2.0
    #: `SIE_METRICS_ENABLED` / `SIE_TRACING_ENABLED` (§13): on only with an endpoint and a protocol this
    #: build exports.
    metrics_enabled: bool = False
    tracing_enabled: bool = False
    #: Where and how OTLP metrics go (§1.2, §13), resolved from the standard `OTEL_*` variables.
    otel: OtelSettings = field(default_factory=OtelSettings)
    #: Work deadlines (sidecar-behaviour §15.3, newer than v0.7.1): ACK-drop expired work
    #: (`SIE_WORK_DEADLINE_ENFORCE`), the clock skew allowed (`SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS`,
    #: capped at 60 s) and the longest deadline budget taken as real
    #: (`SIE_WORK_DEADLINE_MAX_BUDGET_S`, capped at 24 h and at the tombstone horizon).
    work_deadline_enforce: bool = False
    work_deadline_skew_tolerance_ms: int = 5000
    work_deadline_max_budget_s: float = 180.0
    log_filter: str = "info"
    # Lines to log once logging is configured (ignored values, deprecations); not a setting.
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], argv: Sequence[str] = ()) -> Settings:
        """Parse the run flags in `argv` (flags only) and fill the rest from `environ`."""
        namespace = build_run_parser().parse_args(list(argv))
        return cls.from_sources(environ, namespace)

    @classmethod
    def from_sources(cls, environ: Mapping[str, str], namespace: argparse.Namespace | None = None) -> Settings:
        """Build from an already parsed namespace (see `add_run_arguments`) and the environment."""
        return _Builder(environ, namespace).build()

    # ---------------------------------------------------------------------------- derived (§1.3, §2, §10)

    @property
    def pool_stream_name(self) -> str:
        return wire.pool_stream_name(self.pool)

    @property
    def pool_stream_subjects(self) -> list[str]:
        return wire.pool_stream_subjects(self.pool)

    @property
    def pool_durable_name(self) -> str:
        return wire.pool_durable_name(self.pool, self.machine_profile, self.bundle)

    @property
    def pool_durable_filter(self) -> str:
        return wire.pool_durable_filter(self.pool, self.machine_profile, self.bundle)

    @property
    def worker_stream_name(self) -> str:
        return wire.worker_stream_name(self.worker_id)

    @property
    def worker_consumer_name(self) -> str:
        return wire.worker_consumer_name(self.worker_id)

    @property
    def worker_direct_filter(self) -> str:
        return wire.worker_direct_filter(self.pool, self.machine_profile, self.bundle, self.worker_id)

    @property
    def worker_stream_subjects(self) -> list[str]:
        """The worker-direct stream carries exactly its consumer's filter (TV-S4)."""
        return [self.worker_direct_filter]

    @property
    def tombstone_horizon_s(self) -> float:
        """How long anything about a work item can matter (§7): max(stream max age, 30 s x
        max_deliver), at most 30 days. Request tombstones live this long; deadline leases and
        budgets never reach past it."""
        return tombstone_horizon(self.stream_max_age_s, self.max_deliver)

    @property
    def redelivery_envelope_s(self) -> float:
        """§2.3: how long a parked group may wait for its model (`redelivery_envelope`)."""
        return redelivery_envelope(self.max_deliver)

    @property
    def worker_stream_max_age_s(self) -> int:
        """Direct work must outlive every redelivery: max(pool max_age, 300 s * max_deliver) (§2.2)."""
        return max(self.stream_max_age_s, _WORKER_AGE_PER_DELIVERY_S * self.max_deliver)

    @property
    def health_subject(self) -> str:
        return wire.health_subject(self.worker_id)

    @property
    def config_subject(self) -> str:
        """Live config deltas for this bundle (§2.4)."""
        return f"sie.config.models.{self.bundle}"

    @property
    def readyz_stale_ms(self) -> int:
        """Freshness window of the last good ping (§10)."""
        return self.worker_ping_interval_ms * self.worker_readyz_stale_mult

    @property
    def nats_servers(self) -> list[str]:
        """The NATS URL list as the client wants it: split on commas, trimmed, blanks dropped, and
        without userinfo (newer than v0.7.1: credentials come from SIE_NATS_USER/SIE_NATS_PASSWORD
        only; `nats_url_userinfo_ignored` says whether any was dropped)."""
        if self.nats_url is None:
            return []
        return [_lower_scheme(strip_url_userinfo(url.strip())[0]) for url in self.nats_url.split(",") if url.strip()]

    @property
    def nats_url_userinfo_ignored(self) -> bool:
        """SIE_NATS_URL carried `user:pass@` somewhere, which is not used to authenticate."""
        return self.nats_url is not None and strip_url_userinfo(self.nats_url)[1]

    @property
    def config_service_bearer(self) -> str | None:
        """The config-service bearer: SIE_CONFIG_SERVICE_TOKEN when given (blank = none), else SIE_ADMIN_TOKEN."""
        token = self.config_service_token if self.config_service_token is not None else self.admin_token
        if token is None:
            return None
        return token.strip() or None

    @property
    def config_producer_allow_list(self) -> tuple[str, ...]:
        """The config allow-list to enforce; empty (= trust any, §9.2) only with the dev switch on."""
        return () if self.nats_config_trust_any_producer else self.nats_config_trusted_producers

    @property
    def pool_admission_active(self) -> bool:
        """The admission gate runs only when enabled and a gateway URL is set (§8)."""
        return self.pool_admission_enabled and self.gateway_url is not None

    @property
    def concurrency(self) -> ConcurrencyLimits:
        """The concurrency limits, for the lifecycle to hand to each stage (nothing else reads the fields)."""
        return ConcurrencyLimits(
            pull_outstanding=self.pull_loop_max_outstanding,
            pull_batches=self.pull_loop_inflight,
            model_groups=self.max_concurrent_batches,
            pipeline_depth=self.pipeline_depth,
            ipc_connections=self.ipc_pool_size,
            audio_decodes=self.audio_prep_permits,
        )

    # ------------------------------------------------------------------------------ not implemented yet

    def unsupported(self) -> list[str]:
        """The refusal line of every setting this build does not implement that is set (see `NOT_YET`)."""
        out = []
        for name, env in NOT_YET:
            default = (self.ipc_socket_path,) if name == "ipc_socket_paths" else _DEFAULTS[name]
            if getattr(self, name) != default:
                out.append(f"{env} is not supported yet")
        store = self.payload_store_url or ""
        scheme = store.split("://", 1)[0]
        if "://" in store and f"{scheme}://" in _STORES_NOT_YET:
            out.append(f"SIE_PAYLOAD_STORE_URL is not supported yet for {scheme}:// stores")
        return out

    def require_supported(self) -> None:
        """Raise a ConfigError (exit code 2) naming the first setting asked of this build that it lacks."""
        refused = self.unsupported()
        if refused:
            raise ConfigError(refused[0])

    # --------------------------------------------------------------------------------------- logging

    def secret_values(self) -> tuple[str, ...]:
        """Every secret string in the settings (tokens, passwords, URL userinfo, the OTLP headers'
        values, which carry API keys), for `redact_text`."""
        values = [getattr(self, name) for name in sorted(_SECRET_FIELDS)]
        for name in sorted(_URL_FIELDS):
            values.extend(_userinfo_parts(getattr(self, name)))
        for transport in (self.otel.metrics_transport, self.otel.traces_transport):
            for pair in transport.headers.reveal().split(","):
                value = unquote(pair.partition("=")[2]).strip()
                values.extend((value, pair.partition("=")[2].strip()))
        return tuple(dict.fromkeys(v for v in values if isinstance(v, str) and v.strip()))

    def redact_text(self, text: str) -> str:
        """`text` (an error message from a client library, say) with URL userinfo and secrets replaced."""
        return redact_text(text, self.secret_values())

    def redacted(self) -> dict[str, object]:
        """All settings for the startup log line, secrets replaced by `<redacted>`."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            if f.name == "warnings":
                continue
            value = getattr(self, f.name)
            if f.name in _SECRET_FIELDS:
                value = REDACTED if value else value
            elif f.name in _URL_FIELDS and isinstance(value, str):
                value = redact_url_userinfo(value)
            elif f.name == "payload_store_url" and isinstance(value, str) and "://" in value:
                # `s3://key:secret@bucket` is refused later, but must not reach the start-up log first;
                # abfs(s):// names `container@account`, which is no secret.
                if not value.startswith(("abfs://", "abfss://")):
                    value = redact_url_userinfo(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={value!r}" for name, value in self.redacted().items())
        return f"Settings({body})"


_SECRET_FIELDS = frozenset({"gateway_api_key", "admin_token", "config_service_token", "nats_password", "nats_token"})
# Userinfo in these may carry credentials (the payload store too, except abfs:// `container@account`).
_URL_FIELDS = frozenset({"nats_url", "gateway_url", "config_service_url"})
_DEFAULTS: Mapping[str, object] = {
    f.name: f.default for f in dataclasses.fields(Settings) if f.default is not dataclasses.MISSING
}

#: Settings parsed (so that they are validated and shown) but not implemented by this build: each is
#: refused by `Settings.require_supported` when its value differs from the default, with the variable
#: that sets it. A feature that lands removes its rows; tests/unit/test_settings_wired.py checks that
#: every other field is read outside this module.
NOT_YET: tuple[tuple[str, str], ...] = ()
#: Payload store schemes of §12 this build refuses at start-up (none since Azure landed).
_STORES_NOT_YET: frozenset[str] = frozenset()
#: Fields whose whole specified effect is a start-up check (§1.1: the liveness budget must exceed the
#: model-ready timeout), so nothing reads them later.
CHECKED_ONLY = frozenset({"worker_liveness_budget_s"})


# ---------------------------------------------------------------------------------------- NATS logins

#: The files' seeds by the two letters that start them (the key's type), for the refusal line.
_SEED_KINDS: Final = {"SA": "an account", "SO": "an operator", "SN": "a server", "SC": "a cluster", "SX": "a curve"}
_JWT_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_CREDS_JWT = "BEGIN NATS USER JWT"
_CREDS_SEED = "BEGIN USER NKEY SEED"


def read_login_file(env: str, path: str) -> bytes:
    """The bytes of the file `env` names, or a ConfigError naming `env`: missing, unreadable, not a
    regular file (a FIFO would block the start), or larger than any credential."""
    try:
        if not os.path.isfile(path):
            problem = "no such file" if not os.path.lexists(path) else "not a regular file"
            raise ConfigError(f"{env}: cannot read {path}: {problem}")
        with open(path, "rb") as f:
            data = f.read(MAX_LOGIN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{env}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_LOGIN_FILE_BYTES:
        raise ConfigError(f"{env}: {path} is larger than {MAX_LOGIN_FILE_BYTES >> 20} MiB: not a credential file")
    return data


def _line_after(text: str, marker: str) -> str | None:
    """The line after the first one holding `marker`, as nats-py reads a creds file (only the
    newline dropped: a CR or a space would be sent as part of the JWT or the seed)."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if marker in line:
            return lines[index + 1] if index + 1 < len(lines) else ""
    return None


def user_seed_public_key(env: str, what: str, seed: str) -> str:
    """The public key (`U...`) of a user NKey seed, or a ConfigError naming `env` that never shows
    the seed: not a user seed, a wrong length or checksum (a typo would otherwise sign with a key the
    server does not know, and read as a wrong password)."""
    if not seed.startswith("SU"):
        kind = _SEED_KINDS.get(seed[:2])
        raise ConfigError(f"{env}: {what} is not a user NKey seed (SU...)" + (f": it is {kind} seed" if kind else ""))
    try:
        import nkeys  # type: ignore[import-untyped]  # nats-py[nkeys]; no type hints
    except ImportError:
        raise ConfigError(f"{env}: the nkeys package is missing (pip install 'nats-py[nkeys]')") from None
    try:
        decoded = base64.b32decode(seed + "=" * (-len(seed) % 8))
        body, checksum = decoded[:-2], decoded[-2:]
        if len(body) != 34 or int(nkeys.crc16(bytearray(body))).to_bytes(2, "little") != checksum:
            raise ValueError("length or checksum")
        pair = nkeys.from_seed(bytearray(seed.encode()))
        public = str(pair.public_key.decode())
        pair.wipe()
    except (binascii.Error, ValueError, TypeError, nkeys.NkeysError):
        raise ConfigError(f"{env}: {what} is not a valid NKey seed (wrong length or checksum)") from None
    return public


def _jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT (unverified: the server verifies it), or None when it is not one."""
    if not _JWT_RE.fullmatch(token):
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def check_creds_file(env: str, path: str, now: float | None = None) -> None:
    """A creds file as `nsc` writes it: a user JWT (not expired) and the user's NKey seed, the seed
    being the key the JWT names (its `sub`). ConfigError naming `env` otherwise, never the seed."""
    text = read_login_file(env, path).decode("utf-8", "replace")
    jwt = _line_after(text, _CREDS_JWT)
    if jwt is None:
        raise ConfigError(f"{env}: {path} holds no user JWT (-----{_CREDS_JWT}-----): not a creds file")
    if "\r" in text:
        raise ConfigError(f"{env}: {path} has CRLF line endings, which nats-py does not read: convert it to LF")
    claims = _jwt_claims(jwt)
    if claims is None:
        raise ConfigError(f"{env}: the user JWT in {path} is malformed")
    nats = claims.get("nats")
    kind = nats.get("type") if isinstance(nats, dict) else None
    if kind != "user":
        raise ConfigError(f"{env}: the JWT in {path} is not a user JWT (type {kind!r})")
    expires = claims.get("exp")
    if isinstance(expires, int | float) and 0 < expires <= (time.time() if now is None else now):  # 0: never
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
        raise ConfigError(f"{env}: the user JWT in {path} expired at {stamp}")
    seed = _line_after(text, _CREDS_SEED)
    if seed is None:
        raise ConfigError(f"{env}: {path} holds no user NKey seed (-----{_CREDS_SEED}-----)")
    public = user_seed_public_key(env, f"the seed in {path}", seed)
    if claims.get("sub") != public:
        raise ConfigError(f"{env}: the seed in {path} is not the key of the JWT's user (its sub)")


def check_nkey_seed_file(env: str, path: str) -> None:
    """A file holding one user NKey seed (`SU...`), surrounding whitespace allowed (nats-py strips it)."""
    seed = read_login_file(env, path).decode("utf-8", "replace").strip()
    if not seed:
        raise ConfigError(f"{env}: {path} is empty")
    user_seed_public_key(env, path, seed)


def _ssl_reason(exc: BaseException) -> str:
    """An OpenSSL error as one short line (`[SSL] PEM lib (_ssl.c:3900)` → `PEM lib`)."""
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    return " ".join(str(reason).split()) or type(exc).__name__


def nats_tls_context(cert: str | None, key: str | None, ca: str | None) -> ssl.SSLContext:
    """The client context for NATS: verifies the server against `ca` (`SIE_NATS_TLS_CA_FILE`) or, without
    one, the system store (and `SSL_CERT_FILE`); presents `cert` + `key` when given. Each file is
    loaded here, so a mistake is a ConfigError naming its variable; an encrypted key is refused
    rather than prompted for on the terminal."""
    import ssl

    if (cert is None) != (key is None):
        raise ConfigError("SIE_NATS_TLS_CERT_FILE and SIE_NATS_TLS_KEY_FILE must be set together")
    for env, path in (("SIE_NATS_TLS_CA_FILE", ca), ("SIE_NATS_TLS_CERT_FILE", cert), ("SIE_NATS_TLS_KEY_FILE", key)):
        if path is not None:
            read_login_file(env, path)
    try:
        context = ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"SIE_NATS_TLS_CA_FILE: {ca} holds no CA certificate that loads: {_ssl_reason(exc)}"
        ) from None
    if cert is None or key is None:
        return context
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"SIE_NATS_TLS_CERT_FILE: {cert} holds no certificate that loads: {_ssl_reason(exc)}"
        ) from None
    asked: list[bool] = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except (ssl.SSLError, OSError) as exc:
        if asked:
            problem = f"{key} is encrypted: give the key without a passphrase (the file is the secret)"
        else:
            problem = f"{key} does not load as the key of {cert}: {_ssl_reason(exc)}"
        raise ConfigError(f"SIE_NATS_TLS_KEY_FILE: {problem}") from None
    return context


# ---------------------------------------------------------------------------------------------- parsing


class _Builder:
    """Reads raw values flag-first, parses them and collects warnings for `Settings.warnings`."""

    def __init__(self, environ: Mapping[str, str], namespace: argparse.Namespace | None) -> None:
        self._environ = environ
        self._namespace = namespace
        # Secrets have no flag to read (`refuse_secret_flags`): only the environment.
        self._flags = {spec.env: spec for spec in RUN_FLAGS if not spec.secret}
        self.warnings: list[str] = []

    # -- raw access

    def _label(self, env: str) -> str:
        spec = self._flags.get(env)
        return f"{env} ({spec.flag})" if spec is not None else env

    def raw(self, env: str) -> str | None:
        """The flag value when given, else the env value; None when neither."""
        spec = self._flags.get(env)
        if spec is not None and self._namespace is not None:
            value = getattr(self._namespace, spec.dest, None)
            if value is not None:
                return str(value)
        return self._environ.get(env)

    def text(self, env: str) -> str | None:
        """Trimmed value; blank counts as unset."""
        value = self.raw(env)
        if value is None or not value.strip():
            return None
        return value.strip()

    def fail(self, env: str, problem: str) -> NoReturn:
        raise ConfigError(f"{self._label(env)}: {problem}")

    def within_limit(self, env: str, value: float) -> None:
        """A value beyond `LIMITS[env]` would pass here and fail later (at the server, say): refuse it now."""
        maximum = LIMITS.get(env, INT64_MAX)
        if value > maximum:
            self.fail(env, f"{_number(value)} is out of range (at most {_number(maximum)})")

    # -- §1.1 typed values: malformed = startup error

    def uint(self, env: str, default: int, *, limit: bool = True) -> int:
        value = self.text(env)
        if value is None:
            return default
        if not _UINT_RE.fullmatch(value):
            self.fail(env, f"expected a non-negative integer, got {value!r}")
        if limit:
            self.within_limit(env, int(value))
        return int(value)

    def seconds_to_ms(self, env: str, default_s: float, floor_ms: int) -> int:
        """Float seconds → whole ms, floored; non-finite or ≤ 0 gives the floor (§1.1 pool admission rows)."""
        value = self.text(env)
        seconds = default_s if value is None else self._float(env, value)
        if not math.isfinite(seconds) or seconds <= 0:
            return floor_ms
        self.within_limit(env, seconds)
        return max(floor_ms, int(seconds * 1000))

    def _float(self, env: str, value: str) -> float:
        if not _FLOAT_RE.fullmatch(value):
            self.fail(env, f"expected a number, got {value!r}")
        return float(value)

    def lane(self, env: str) -> str:
        value = self.raw(env)
        if value is None:
            self.fail(env, "not set (required)")
        try:
            return wire.validate_lane_token(value)
        except SubjectError as exc:
            self.fail(env, str(exc))

    # -- §1.2 env-only values: malformed or out of range = default plus a warning

    def env_uint(self, env: str, default: int, valid: Callable[[int], bool] = lambda n: n > 0) -> int:
        value = self._environ.get(env)
        if value is None:
            return default
        stripped = value.strip()
        if _UINT_RE.fullmatch(stripped):
            self.within_limit(env, int(stripped))
            if valid(int(stripped)):
                return int(stripped)
        self.warnings.append(f"{env}={value!r} ignored; using {default}")
        return default

    def env_uint_given(
        self, env: str, default: int, valid: Callable[[int], bool] = lambda n: n > 0
    ) -> tuple[int, bool]:
        """`env_uint`, and whether the value came from the environment (set and not ignored): such
        a setting pins its knob against what the backend reports."""
        warned = len(self.warnings)
        value = self.env_uint(env, default, valid)
        return value, env in self._environ and len(self.warnings) == warned

    def env_float(self, env: str, default: float, valid: Callable[[float], bool] = lambda x: x > 0) -> float:
        """A finite float accepted by `valid`; anything else is the default plus a warning."""
        value = self._environ.get(env)
        if value is None:
            return default
        try:
            parsed = float(value.strip())
        except ValueError:
            parsed = math.nan
        if math.isfinite(parsed):
            self.within_limit(env, parsed)
            if valid(parsed):
                return parsed
        self.warnings.append(f"{env}={value!r} ignored; using {default}")
        return default

    def _batcher(self) -> dict[str, Any]:  # heterogeneous values: the dict is splatted into Settings
        """Static batch-former config (scheduler-and-prep §3.1, v0.7.1 defaults 15 / 16384 / 12 / 5 / 0.5);
        values that do not parse, or non-finite floats, are ignored with a warning. A valid cost
        pins every model to it (§3.7)."""
        cost, pinned = self.env_uint_given("SIE_BATCHER_MAX_BATCH_COST", 16384, lambda n: True)
        requests, requests_pinned = self.env_uint_given("SIE_BATCHER_MAX_BATCH_REQUESTS", 12)
        return {
            "batcher_max_batch_wait_ms": self.env_float("SIE_BATCHER_MAX_BATCH_WAIT_MS", 15.0, lambda x: x >= 0),
            "batcher_max_batch_cost": cost,
            "batcher_cost_pinned": pinned,
            "batcher_max_batch_requests": requests,
            "batcher_requests_pinned": requests_pinned,
            "batcher_coalesce_ms": self.env_float("SIE_BATCHER_COALESCE_MS", 5.0, lambda x: x >= 0),
            "batcher_coalesce_ratio": self.env_float("SIE_BATCHER_COALESCE_RATIO", 0.5, lambda x: x >= 0),
        }

    def _quantum(self) -> dict[str, Any]:
        """The pull-loop quantum controller (scheduler-and-prep §4.8): a ceiling below the floor
        becomes max(15, floor); a non-finite target is refused like any malformed value."""
        floor = self.env_float("SIE_ADAPTIVE_MIN_QUANTUM_MS", 2.0)
        ceiling = self.env_float("SIE_ADAPTIVE_MAX_QUANTUM_MS", 15.0, lambda x: x >= 0)
        if ceiling < floor:
            ceiling = max(15.0, floor)
        return {
            "adaptive_min_quantum_ms": floor,
            "adaptive_max_quantum_ms": ceiling,
            "adaptive_target_p50_ms": self.env_float("SIE_ADAPTIVE_TARGET_P50_MS", 50.0, lambda x: x >= 0),
        }

    def env_flag(
        self,
        env: str,
        *,
        default: bool,
        true: frozenset[str] = _TRUTHY,
        false: frozenset[str] = _FALSY,
        blank: bool | None = None,
    ) -> bool:
        """An env-only boolean (`_flag`)."""
        return self._flag(env, self._environ.get(env), default=default, true=true, false=false, blank=blank)

    def _flag(
        self,
        env: str,
        value: str | None,
        *,
        default: bool,
        true: frozenset[str] = _TRUTHY,
        false: frozenset[str] = _FALSY,
        blank: bool | None = None,
    ) -> bool:
        """`true` or `false` words (trimmed, any case); unset is `default`, blank is `blank` (else the
        default). Any other word is refused: upstream reads it as off, so `SIE_METRICS_ENABLED=maybe`
        or a typo of `true` would switch a feature off without a word."""
        if value is None:
            return default
        word = value.strip().lower()
        if not word:
            return default if blank is None else blank
        if word in true:
            return True
        if word in false:
            return False
        self.fail(env, f"expected {_words(true)} (on) or {_words(false)} (off), got {value!r}")

    def _debug_endpoint(self) -> dict[str, Any]:
        """`loopback` (the default; also the on words), `all` or `off` (also the off words); blank is
        the default. Anything else is refused, as a boolean's unknown word is."""
        env = "SIE_SIDECAR_DEBUG_ENDPOINT"
        value = self._environ.get(env)
        word = (value or "").strip().lower()
        if word in ("loopback", "all"):
            return {"debug_endpoint": True, "debug_endpoint_peers": word}
        if word not in _TRUTHY | _FALSY | {""}:
            self.fail(
                env,
                f"expected loopback (or {_words(_TRUTHY)}), all, or off (or {_words(_FALSY - {'off'})}), got {value!r}",
            )
        return {"debug_endpoint": self._flag(env, value, default=True), "debug_endpoint_peers": "loopback"}

    def _ipc_mux(self) -> bool:
        """§1.2: on for exactly `1`, `true`, `TRUE`, `on`, `ON` (no trimming); off for the usual off
        words and blank; anything else (`yes`, `True`, ` 1`: off upstream) is refused."""
        value = self._environ.get("SIE_IPC_MUX")
        if value is None or value in _MUX_ON:
            return value is not None
        if value.strip().lower() in _FALSY | {""}:
            return False
        self.fail(
            "SIE_IPC_MUX",
            f"expected exactly 1, true, TRUE, on or ON (on) or {_words(_FALSY)} (off), got {value!r}",
        )

    # -- assembly

    def build(self) -> Settings:
        refuse_secret_flags(self._namespace)
        self.warnings.extend(unknown_env_warnings(self._environ))
        ingest = self._ingest()
        otel = self._traces(self._otel())
        local_socket = self.text("SIE_SIDECAR_LOCAL_SOCKET")
        nats_url = self.raw("SIE_NATS_URL")
        nats_url = nats_url if nats_url is not None and nats_url.strip() else None
        if ingest == "nats" and nats_url is None:
            self.fail("SIE_NATS_URL", "not set (required when SIE_SIDECAR_INGEST is nats)")
        if ingest == "local" and local_socket is None:
            self.fail("SIE_SIDECAR_LOCAL_SOCKET", "not set (required when SIE_SIDECAR_INGEST is local)")
        if nats_url is not None:
            self._nats_urls(nats_url)
        login = self._nats_login()
        # Read by the wire switch at import; checked here so that a typo is refused like any other.
        self.env_flag("SIE_SIDECAR_NO_EXTENSIONS", default=False)

        pool = self.lane("SIE_POOL")
        bundle = self.lane("SIE_BUNDLE")
        machine_profile = self.lane("SIE_MACHINE_PROFILE")

        primary = self.text("SIE_IPC_SOCKET_PATH") or DEFAULT_IPC_SOCKET_PATH
        socket_paths = self._socket_paths(primary)

        max_concurrent_batches = self.env_uint("SIE_MAX_CONCURRENT_BATCHES", 4)
        ipc_pool_size = self.uint("SIE_IPC_POOL_SIZE", 0) or max_concurrent_batches
        ipc_request_timeout_s = max(1, self.uint("SIE_IPC_REQUEST_TIMEOUT_S", 60))
        model_ready_timeout_s = max(1, self.uint("SIE_MODEL_READY_TIMEOUT_S", 900))
        liveness = self._liveness_budget(model_ready_timeout_s)

        store = self.raw("SIE_PAYLOAD_STORE_URL")
        payload_store_url = store or None  # only "" is empty; whitespace is a (local) path in v0.7.1 (§12)

        port = self._port("SIE_WORKER_PROBE_PORT", 9095)

        ping_interval_ms = self._period("SIE_WORKER_PING_INTERVAL_MS", 2000)
        stale_mult = self.uint("SIE_WORKER_READYZ_STALE_MULT", 3)
        if stale_mult == 0:
            self.warnings.append("SIE_WORKER_READYZ_STALE_MULT=0 is not allowed; using 3")
            stale_mult = 3

        config_service_token = self.raw("SIE_CONFIG_SERVICE_TOKEN")  # set-but-blank means "send none"
        admin_token = self.text("SIE_ADMIN_TOKEN")
        if config_service_token is None and admin_token is not None:
            self.warnings.append(
                "SIE_ADMIN_TOKEN as the config-service bearer is deprecated; use SIE_CONFIG_SERVICE_TOKEN"
            )

        trust_any = self._flag(
            "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER", self.raw("SIE_NATS_CONFIG_TRUST_ANY_PRODUCER"), default=False
        )
        producers = self._producers(trust_any)

        fetch_budget = self.env_uint("SIE_NATS_FETCH_BUDGET", 64)
        inflight = self.env_uint("SIE_PULL_LOOP_INFLIGHT", max_concurrent_batches)
        outstanding, outstanding_pinned = self.env_uint_given(
            "SIE_PULL_LOOP_MAX_OUTSTANDING", max(fetch_budget, inflight)
        )
        storage = (self._environ.get("SIE_STREAM_STORAGE") or "").strip().lower()
        max_deliver = self.env_uint("SIE_MAX_DELIVER", 20)
        stream_max_age_s = self.env_uint("SIE_STREAM_MAX_AGE_S", 1800)

        return Settings(
            pool=pool,
            bundle=bundle,
            machine_profile=machine_profile,
            worker_id=self._worker_id(),
            ingest=ingest,
            local_socket=local_socket,
            nats_url=nats_url,
            **login,
            ipc_socket_path=primary,
            ipc_socket_paths=socket_paths,
            ipc_pool_size=ipc_pool_size,
            ipc_request_timeout_s=float(ipc_request_timeout_s),
            model_ready_timeout_s=float(model_ready_timeout_s),
            worker_liveness_budget_s=liveness,
            payload_store_url=payload_store_url,
            gateway_url=self.text("SIE_GATEWAY_URL"),
            gateway_api_key=self.text("SIE_GATEWAY_API_KEY"),
            pool_admission_enabled=self._flag(
                "SIE_POOL_ADMISSION_ENABLED", self.raw("SIE_POOL_ADMISSION_ENABLED"), default=True
            ),
            pool_admission_check_interval_ms=self.seconds_to_ms("SIE_POOL_ADMISSION_CHECK_INTERVAL_S", 5.0, 1000),
            pool_admission_pause_ms=self.seconds_to_ms("SIE_POOL_ADMISSION_PAUSE_S", 1.0, 100),
            pool_admission_stale_after_ms=self.seconds_to_ms("SIE_POOL_ADMISSION_STALE_AFTER_S", 30.0, 0),
            worker_probe_port=port,
            worker_ping_interval_ms=ping_interval_ms,
            worker_readyz_stale_mult=stale_mult,
            gpu_count=self.uint("SIE_GPU_COUNT", 1),
            bundle_config_hash=self.raw("SIE_BUNDLE_CONFIG_HASH") or "",
            config_service_url=self.text("SIE_CONFIG_SERVICE_URL"),
            config_service_token=config_service_token,
            admin_token=admin_token,
            worker_config_poll_interval_ms=max(1000, self.uint("SIE_WORKER_CONFIG_POLL_INTERVAL_MS", 30000)),
            worker_config_full_export_interval_ms=self.uint("SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS", 300000),
            nats_config_trusted_producers=producers,
            nats_config_trust_any_producer=trust_any,
            health_publish_interval_ms=self._period("SIE_HEALTH_PUBLISH_INTERVAL_MS", 5000),
            max_deliver=max_deliver,
            max_ack_pending=self.env_uint("SIE_MAX_ACK_PENDING", 1000),
            stream_max_age_s=stream_max_age_s,
            stream_storage="file" if storage in ("file", "disk") else "memory",
            stream_replicas=self.env_uint("SIE_STREAM_REPLICAS", 1),
            nats_conservative_cleanup=self.env_flag("SIE_NATS_CONSERVATIVE_CLEANUP", default=False, true=_CLEANUP_ON),
            nats_consumer_reconcile_interval_ms=self._reconcile_interval(),
            nats_fetch_budget=fetch_budget,
            fallback_batch_budget=self._fallback_batch_budget(),
            nats_pull_expires_s=self.env_uint("SIE_NATS_PULL_EXPIRES_S", 5, lambda n: 1 <= n <= 29),
            pull_loop_inflight=inflight,
            pull_loop_max_outstanding=outstanding,
            pull_outstanding_pinned=outstanding_pinned,
            max_concurrent_batches=max_concurrent_batches,
            audio_prep_permits=self.env_uint("SIE_AUDIO_PREP_PERMITS", 1),
            nak_delay_ms=self._nak_delay_ms(),
            scheduler_drain_deadline_ms=self.env_uint("SIE_SCHEDULER_DRAIN_DEADLINE_MS", 10000),
            pipeline_depth=min(8, max(1, self.env_uint("SIE_RUST_PIPELINE_DEPTH", 2, lambda n: True))),
            wave_cadence=self.env_flag("SIE_RUST_WAVE_CADENCE", default=True, false=_WAVE_OFF),
            batcher_idle_bypass_enabled=self.env_flag("SIE_BATCHER_IDLE_BYPASS_ENABLED", default=True),
            batcher_jit_dispatch_enabled=self.env_flag("SIE_BATCHER_JIT_DISPATCH_ENABLED", default=True),
            **self._quantum(),
            **self._batcher(),
            adaptive_batch_env=self._adaptive_batch_env(),
            controller_trace_dir=self.text("SIE_SIDECAR_CONTROLLER_TRACE"),
            **self._debug_endpoint(),
            pull_quantum_include_queue_ms=self.env_flag("SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS", default=False),
            health_publish_enabled=self.env_flag("SIE_HEALTH_PUBLISH_ENABLED", default=True, blank=False),
            generate_ipc_frame_timeout_s=self.env_uint("SIE_GENERATE_IPC_FRAME_TIMEOUT_S", 300),
            ipc_mux=self._ipc_mux(),
            nats_connect_timeout_s=self.env_float("SIE_NATS_CONNECT_TIMEOUT_S", 30.0),
            nats_ping_interval_s=self.env_float("SIE_NATS_PING_INTERVAL_S", 5.0),
            nats_max_outstanding_pings=self.env_uint("SIE_NATS_MAX_OUTSTANDING_PINGS", 3),
            nats_ack_confirm_s=self.env_float("SIE_NATS_ACK_CONFIRM_S", 2.0, lambda x: x >= 0),
            metrics_enabled=self._metrics_enabled(otel),
            otel=otel,
            tracing_enabled=self._tracing_enabled(otel),
            **self._work_deadlines(tombstone_horizon(stream_max_age_s, max_deliver)),
            log_filter=(self._environ.get("RUST_LOG") or "").strip() or "info",
            warnings=tuple(self.warnings),
        )

    def _work_deadlines(self, horizon_s: float) -> dict[str, Any]:
        """§1.2 / §15.3: enforcement is a flag (an unrecognised word is refused, like every boolean's);
        the skew tolerance is capped at 60 s, the max budget at 24 h and at the tombstone horizon."""
        enforce = self.env_flag("SIE_WORK_DEADLINE_ENFORCE", default=False)
        skew = self.env_uint("SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS", 5000, lambda n: True)
        budget = self.env_float("SIE_WORK_DEADLINE_MAX_BUDGET_S", 180.0)
        cap = min(MAX_DEADLINE_BUDGET_S, horizon_s)
        if skew > MAX_DEADLINE_SKEW_MS:
            self.warnings.append(f"SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS={skew} capped at {MAX_DEADLINE_SKEW_MS}")
            skew = MAX_DEADLINE_SKEW_MS
        if budget > cap:
            self.warnings.append(f"SIE_WORK_DEADLINE_MAX_BUDGET_S={budget:g} capped at {cap:g}")
            budget = cap
        return {
            "work_deadline_enforce": enforce,
            "work_deadline_skew_tolerance_ms": skew,
            "work_deadline_max_budget_s": budget,
        }

    def _otel_value(self, *names: str) -> tuple[str, str] | None:
        """(name, trimmed value) of the first of `names` set and not blank: a signal-specific OTEL
        variable, then the generic one (the OTLP exporter spec's precedence)."""
        for name in names:
            value = (self._environ.get(name) or "").strip()
            if value:
                return name, value
        return None

    def _otlp_value(self, signal: str, setting: str) -> tuple[str, str] | None:
        """`OTEL_EXPORTER_OTLP_<SIGNAL>_<SETTING>`, else `OTEL_EXPORTER_OTLP_<SETTING>` (`setting` in
        lower case, as the `OtlpTransport` field it fills)."""
        suffix = setting.upper()
        return self._otel_value(f"OTEL_EXPORTER_OTLP_{signal}_{suffix}", f"OTEL_EXPORTER_OTLP_{suffix}")

    def _otlp_target(self, signal: str) -> tuple[str | None, str]:
        """(endpoint, protocol) of one signal (§1.2): the signal-specific ones win over the generic
        ones; the protocol defaults to gRPC; a generic HTTP endpoint gets `/v1/<signal>` appended,
        a generic gRPC one is used as it is (OTLP exporter spec)."""
        picked = self._otlp_value(signal, "protocol")
        protocol = picked[1].lower() if picked is not None else "grpc"
        specific = self._otel_value(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        if specific is not None:
            return specific[1], protocol
        generic = self._otel_value("OTEL_EXPORTER_OTLP_ENDPOINT")
        if generic is None:
            return None, protocol
        if protocol.startswith("http"):
            return generic[1].rstrip("/") + f"/v1/{signal.lower()}", protocol
        return generic[1], protocol

    def _otlp_transport(self, signal: str) -> OtlpTransport:
        """Headers, compression, TLS files, timeout and gRPC plaintext of one signal, each variable
        signal-specific first. A value that cannot be used is ignored with a warning."""
        headers = self._otlp_value(signal, "headers")
        compression = "none"
        if (picked := self._otlp_value(signal, "compression")) is not None:
            compression = picked[1].lower()
            if compression not in OTLP_COMPRESSIONS:
                self.warnings.append(f"{picked[0]}={picked[1]!r} ignored (gzip or none); using none")
                compression = "none"
        timeout_s = 10.0
        if (picked := self._otlp_value(signal, "timeout")) is not None:
            try:
                millis = float(picked[1])
            except ValueError:
                millis = math.nan
            if math.isfinite(millis) and millis > 0:
                timeout_s = millis / 1000.0
            else:
                self.warnings.append(f"{picked[0]}={picked[1]!r} ignored (milliseconds > 0); using 10000")
        insecure = self._otlp_value(signal, "insecure")
        files = {setting: self._otlp_value(signal, setting) for setting in _OTLP_FILES}
        return OtlpTransport(
            headers=OtlpHeaders(headers[1] if headers is not None else ""),
            compression=compression,
            certificate=_picked(files["certificate"]),
            client_key=_picked(files["client_key"]),
            client_certificate=_picked(files["client_certificate"]),
            timeout_s=timeout_s,
            insecure=insecure is not None and insecure[1].lower() == "true",
        )

    def _resource_attributes(self) -> tuple[tuple[str, str], ...]:
        """`OTEL_RESOURCE_ATTRIBUTES` read as the SDK reads it: comma-separated `key=value`, both
        trimmed, the value URL-decoded; an entry without `=` is ignored with a warning."""
        raw = self._environ.get("OTEL_RESOURCE_ATTRIBUTES") or ""
        out: dict[str, str] = {}
        for item in raw.split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                self.warnings.append(f"OTEL_RESOURCE_ATTRIBUTES entry {item.strip()!r} is not key=value; ignored")
                continue
            out[key.strip()] = unquote(value.strip())
        return tuple(out.items())

    def _otel_exporter(self, name: str) -> str:
        """`OTEL_METRICS_EXPORTER` / `OTEL_TRACES_EXPORTER`: `otlp` when the list names it (the
        default), else `none`; the exporters this build has not (console, prometheus, ...) are
        ignored with a warning."""
        raw = self._environ.get(name) or ""
        values = [v.strip().lower() for v in raw.split(",") if v.strip()] or ["otlp"]
        unknown = [v for v in values if v not in ("otlp", "none")]
        if unknown:
            self.warnings.append(f"{name}={raw!r}: {', '.join(unknown)} not available (otlp and none are); ignored")
        return "otlp" if "otlp" in values else "none"

    def _otel(self) -> OtelSettings:
        """§1.2 and §13 from the standard variables: the metrics' endpoint, protocol and transport,
        the SDK switches, the temporality and the resource."""
        env = self._environ
        endpoint, protocol = self._otlp_target("METRICS")
        interval = self.env_float("OTEL_METRIC_EXPORT_INTERVAL", 5000.0)
        attributes = self._resource_attributes()
        from_resource = dict(attributes)
        region = (env.get("SIE_OTEL_CLOUD_REGION") or env.get("SIE_CLOUD_REGION") or "").strip()
        environment = (env.get("SIE_OTEL_DEPLOYMENT_ENVIRONMENT") or "").strip()
        disabled = (env.get("OTEL_SDK_DISABLED") or "").strip().lower()
        if disabled not in ("", "true", "false"):
            self.warnings.append(f"OTEL_SDK_DISABLED={env['OTEL_SDK_DISABLED']!r} is not true or false; read as false")
        temporality = (env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") or "").strip().lower()
        if temporality and temporality not in OTLP_TEMPORALITIES:
            raw = env["OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"]
            self.warnings.append(
                f"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={raw!r} ignored"
                " (cumulative, delta or lowmemory); using cumulative"
            )
            temporality = ""
        return OtelSettings(
            metrics_endpoint=endpoint,
            metrics_protocol=protocol,
            export_interval_s=max(0.1, interval / 1000.0),
            service_name=(env.get("OTEL_SERVICE_NAME") or "").strip()
            or from_resource.get("service.name")
            or "sie-worker-sidecar",
            lane=(env.get("SIE_OTEL_LANE") or "").strip() or "other",
            deployment_environment=environment or from_resource.get("deployment.environment") or "unknown",
            cloud_region=region or from_resource.get("cloud.region") or "unknown",
            model_allowlist=tuple(
                m.strip() for m in (env.get("SIE_METRIC_MODEL_ALLOWLIST") or "").split(",") if m.strip()
            ),
            resource_attributes=attributes,
            sdk_disabled=disabled == "true",
            metrics_exporter=self._otel_exporter("OTEL_METRICS_EXPORTER"),
            traces_exporter=self._otel_exporter("OTEL_TRACES_EXPORTER"),
            metrics_temporality=temporality or "cumulative",
            metrics_transport=self._otlp_transport("METRICS"),
        )

    def _traces(self, otel: OtelSettings) -> OtelSettings:
        """The traces' side of §1.2, resolved like the metrics' (signal-specific variables win; a
        generic HTTP endpoint gets `/v1/traces`), and the OTEL sampler and batch span processor."""
        env = self._environ
        endpoint, protocol = self._otlp_target("TRACES")
        sampler = (env.get("OTEL_TRACES_SAMPLER") or "").strip().lower() or "parentbased_always_on"
        if sampler not in TRACES_SAMPLERS:
            self.warnings.append(f"OTEL_TRACES_SAMPLER={sampler!r} ignored; using parentbased_always_on")
            sampler = "parentbased_always_on"
        ratio = 1.0
        if sampler.endswith("traceidratio"):
            ratio = self.env_float("OTEL_TRACES_SAMPLER_ARG", 1.0, lambda x: 0.0 <= x <= 1.0)
        queue = self.env_uint("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        return dataclasses.replace(
            otel,
            traces_endpoint=endpoint,
            traces_protocol=protocol,
            traces_transport=self._otlp_transport("TRACES"),
            traces_sampler=sampler,
            traces_sampler_ratio=ratio,
            traces_schedule_delay_s=max(0.01, self.env_float("OTEL_BSP_SCHEDULE_DELAY", 5000.0) / 1000.0),
            traces_max_queue=queue,
            traces_max_export_batch=min(queue, self.env_uint("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
            traces_export_timeout_s=self.env_float("OTEL_BSP_EXPORT_TIMEOUT", 30000.0) / 1000.0,
        )

    def _otlp_off(self, signal: str, otel: OtelSettings) -> str | None:
        """Why one enabled signal cannot be exported (the warning's reason), or None."""
        endpoint, protocol, exporter, transport = (
            (otel.metrics_endpoint, otel.metrics_protocol, otel.metrics_exporter, otel.metrics_transport)
            if signal == "METRICS"
            else (otel.traces_endpoint, otel.traces_protocol, otel.traces_exporter, otel.traces_transport)
        )
        if otel.sdk_disabled:
            return "OTEL_SDK_DISABLED is true"
        if exporter == "none":
            return f"OTEL_{signal}_EXPORTER is none"
        if endpoint is None:
            return f"no OTLP {signal.lower()} endpoint is set"
        if protocol not in OTLP_PROTOCOLS:
            return f"OTLP {signal.lower()} protocol {protocol!r} is not exported (grpc and http/protobuf are)"
        for setting in _OTLP_FILES:
            path = getattr(transport, setting)
            if path is not None and not os.path.isfile(path):
                name, _ = self._otlp_value(signal, setting) or (f"OTEL_EXPORTER_OTLP_{setting.upper()}", "")
                return f"{name}={path!r} is not a file"
        return None

    def _tracing_enabled(self, otel: OtelSettings) -> bool:
        """`SIE_TRACING_ENABLED`, off (with one warning) when the spans cannot be exported: the SDK
        disabled, `OTEL_TRACES_EXPORTER=none`, no endpoint, a protocol the SDK has no exporter for
        (`http/json`) or a TLS file that is not there."""
        if not self.env_flag("SIE_TRACING_ENABLED", default=False):
            return False
        reason = self._otlp_off("TRACES", otel)
        if reason is not None:
            self.warnings.append(f"SIE_TRACING_ENABLED is set but {reason}: tracing is off")
            return False
        return True

    def _metrics_enabled(self, otel: OtelSettings) -> bool:
        """`SIE_METRICS_ENABLED`, off (with one warning) when the metrics cannot be exported, for the
        reasons tracing can be off (`_tracing_enabled`)."""
        if not self.env_flag("SIE_METRICS_ENABLED", default=False):
            return False
        reason = self._otlp_off("METRICS", otel)
        if reason is not None:
            self.warnings.append(f"SIE_METRICS_ENABLED is set but {reason}: metrics are off")
            return False
        return True

    def _ingest(self) -> IngestMode:
        mode = (self.raw("SIE_SIDECAR_INGEST") or "").strip().lower()
        if mode in ("", "nats"):
            return "nats"
        if mode == "local":
            return "local"
        self.fail("SIE_SIDECAR_INGEST", f"expected nats or local, got {mode!r}")

    def _nats_urls(self, value: str) -> None:
        """Each comma-separated entry of SIE_NATS_URL is `scheme://host[:port]` with a scheme nats-py
        connects with; all WebSocket or none (nats-py refuses a mix). Refused here, since nats-py
        would retry a bad one until the connect deadline with an error naming no host. Entries are
        shown without their userinfo."""
        entries = [entry.strip() for entry in value.split(",") if entry.strip()]
        if not entries:
            self.fail("SIE_NATS_URL", "names no server")
        kinds: set[bool] = set()
        for entry in entries:
            shown = redact_url_userinfo(entry)
            scheme, sep, _ = entry.partition("://")
            if not sep or not scheme or any(c.isspace() for c in entry):
                self.fail(
                    "SIE_NATS_URL", f"{shown!r} is not a URL: expected nats://host:port (or tls://, ws://, wss://)"
                )
            scheme = scheme.lower()
            if scheme not in NATS_URL_SCHEMES:
                self.fail("SIE_NATS_URL", f"{shown!r}: {scheme}:// is not a NATS scheme (nats, tls, ws or wss)")
            try:
                parts = urlsplit(entry)
                port = parts.port
            except ValueError:
                self.fail("SIE_NATS_URL", f"{shown!r}: the port is not a number in 1..65535")
            if not parts.hostname:
                self.fail("SIE_NATS_URL", f"{shown!r} names no host")
            if port == 0:
                self.fail("SIE_NATS_URL", f"{shown!r}: the port is not a number in 1..65535")
            kinds.add(scheme in NATS_WEBSOCKET_SCHEMES)
        if len(kinds) > 1:
            self.fail("SIE_NATS_URL", "mixes ws:// or wss:// with nats:// or tls:// URLs, which nats-py refuses")

    def _nats_login(self) -> dict[str, Any]:  # splatted into Settings, like `_batcher`
        """The NATS login (env only): user/password, a token, a creds file or an NKey seed file, at most
        one of them, and client-certificate TLS with any; each file is checked here (`check_*`)."""
        env = self._environ
        user = env.get("SIE_NATS_USER") or None
        password = env.get("SIE_NATS_PASSWORD") or None
        if (user is None) != (password is None):
            raise ConfigError("SIE_NATS_USER and SIE_NATS_PASSWORD must be set together")
        token = env.get("SIE_NATS_TOKEN") or None
        creds = self.text("SIE_NATS_CREDS_FILE")
        seed = self.text("SIE_NATS_NKEY_SEED_FILE")
        given = [
            name
            for name, value in (
                ("SIE_NATS_USER/SIE_NATS_PASSWORD", user),
                ("SIE_NATS_TOKEN", token),
                ("SIE_NATS_CREDS_FILE", creds),
                ("SIE_NATS_NKEY_SEED_FILE", seed),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigError(
                f"{' and '.join(given)} are set: set one NATS login (user/password, token, creds file or NKey seed)"
            )
        if creds is not None:
            check_creds_file("SIE_NATS_CREDS_FILE", creds)
        if seed is not None:
            check_nkey_seed_file("SIE_NATS_NKEY_SEED_FILE", seed)
        cert = self.text("SIE_NATS_TLS_CERT_FILE")
        key = self.text("SIE_NATS_TLS_KEY_FILE")
        ca = self.text("SIE_NATS_TLS_CA_FILE")
        if cert is not None or key is not None or ca is not None:
            nats_tls_context(cert, key, ca)  # loads each file; the connection builds its own
        return {
            "nats_user": user,
            "nats_password": password,
            "nats_token": token,
            "nats_creds_file": creds,
            "nats_nkey_seed_file": seed,
            "nats_tls_cert_file": cert,
            "nats_tls_key_file": key,
            "nats_tls_ca_file": ca,
        }

    def _socket_paths(self, primary: str) -> tuple[str, ...]:
        """Comma list, entries trimmed, blanks dropped; empty → the primary only; duplicates rejected (TV-S5)."""
        value = self.raw("SIE_IPC_SOCKET_PATHS") or ""
        paths = [path.strip() for path in value.split(",") if path.strip()]
        seen: set[str] = set()
        for path in paths:
            if path in seen:
                self.fail("SIE_IPC_SOCKET_PATHS", f"duplicate socket path {path!r}")
            seen.add(path)
        return tuple(paths) if paths else (primary,)

    def _liveness_budget(self, model_ready_timeout_s: int) -> float | None:
        if self.text("SIE_WORKER_LIVENESS_BUDGET_S") is None:
            return None
        budget = self.uint("SIE_WORKER_LIVENESS_BUDGET_S", 0)
        if budget <= 0:
            self.fail("SIE_WORKER_LIVENESS_BUDGET_S", "must be > 0")
        if model_ready_timeout_s >= budget:
            self.fail(
                "SIE_WORKER_LIVENESS_BUDGET_S",
                f"must be greater than SIE_MODEL_READY_TIMEOUT_S ({model_ready_timeout_s} >= {budget})",
            )
        return float(budget)

    def _port(self, env: str, default: int) -> int:
        value = self.uint(env, default, limit=False)
        if not 1 <= value <= LIMITS[env]:
            self.fail(env, f"port {value} is out of range 1..65535")
        return value

    def _adaptive_batch_env(self) -> tuple[tuple[str, str], ...]:
        """The `SIE_ADAPTIVE_BATCH_*` overrides, parsed by each model's controller; here only a number
        too large to be a duration (`*_MS`) or a 64-bit cost (`*_COST`) is refused."""
        found = sorted((k, v) for k, v in self._environ.items() if k.startswith("SIE_ADAPTIVE_BATCH_"))
        for key, value in found:
            text = value.strip()
            if key.endswith("_COST") and _UINT_RE.fullmatch(text) and int(text) > INT64_MAX:
                self.fail(key, f"{text} is out of range (at most {INT64_MAX})")
            if key.endswith("_MS") and _FLOAT_RE.fullmatch(text):
                number = float(text)
                if math.isfinite(number) and number > MAX_DURATION_MS:
                    self.fail(key, f"{text} is out of range (at most {MAX_DURATION_MS})")
        return tuple(found)

    def _period(self, env: str, default: int) -> int:
        """A timer period in ms; 0 would spin a timer loop, so it is refused."""
        value = self.uint(env, default)
        if value == 0:
            self.fail(env, "must be > 0")
        return value

    def _worker_id(self) -> str:
        value = self.raw("SIE_WORKER_ID")
        if value is not None and value.strip():
            return value  # not trimmed: the id is normalised verbatim into subjects (TV-S2)
        hostname = self._environ.get("HOSTNAME", "")
        return hostname if hostname.strip() else f"worker-{uuid.uuid4()}"

    def _producers(self, trust_any: bool) -> tuple[str, ...]:
        value = self.raw("SIE_NATS_CONFIG_TRUSTED_PRODUCERS")
        if value is None:
            return DEFAULT_TRUSTED_PRODUCERS
        producers = tuple(p.strip() for p in value.split(",") if p.strip())
        if not producers and not trust_any:
            # An empty allow-list trusts everyone (§9.2); that takes the explicit dev-only switch.
            self.warnings.append(
                "SIE_NATS_CONFIG_TRUSTED_PRODUCERS is empty and SIE_NATS_CONFIG_TRUST_ANY_PRODUCER is off;"
                " using sie-config"
            )
            return DEFAULT_TRUSTED_PRODUCERS
        return producers

    def _fallback_batch_budget(self) -> int:
        """The per-model budget reader accepts any unsigned integer, 0 included (§1.2); no second warning."""
        value = (self._environ.get("SIE_NATS_FETCH_BUDGET") or "").strip()
        return int(value) if _UINT_RE.fullmatch(value) else 64

    def _reconcile_interval(self) -> int:
        """0 disables; positive values floored to 10 s; unparsable → 30 s (§1.2)."""
        value = self.env_uint("SIE_NATS_CONSUMER_RECONCILE_INTERVAL_MS", 30000, lambda n: True)
        return 0 if value == 0 else max(10000, value)

    def _nak_delay_ms(self) -> int:
        """Float seconds > 0, truncated to whole ms; anything else keeps 5 s."""
        value = self._environ.get("SIE_NAK_DELAY_S")
        if value is None:
            return 5000
        stripped = value.strip()
        if _FLOAT_RE.fullmatch(stripped):
            seconds = float(stripped)
            if math.isfinite(seconds):
                self.within_limit("SIE_NAK_DELAY_S", seconds)
            if math.isfinite(seconds) and seconds > 0:
                return int(seconds * 1000)
        self.warnings.append(f"SIE_NAK_DELAY_S={value!r} ignored; using 5.0")
        return 5000


__all__ = [
    "CHECKED_ONLY",
    "ENV_ONLY",
    "ENV_ONLY_HELP",
    "INT64_MAX",
    "LIMITS",
    "MAX_DURATION_MS",
    "MAX_DURATION_S",
    "MAX_LOGIN_FILE_BYTES",
    "NATS_LOGIN_ENV",
    "NATS_URL_SCHEMES",
    "NATS_WEBSOCKET_SCHEMES",
    "NOT_YET",
    "NOT_YET_FLAGS",
    "READ_ELSEWHERE",
    "REDACTED",
    "RUN_FLAGS",
    "ConfigError",
    "IngestMode",
    "RunFlag",
    "Settings",
    "add_run_arguments",
    "build_run_parser",
    "check_creds_file",
    "check_nkey_seed_file",
    "known_env",
    "nats_tls_context",
    "read_login_file",
    "redact_text",
    "redact_url_userinfo",
    "refuse_secret_flags",
    "strip_url_userinfo",
    "unknown_env_warnings",
    "user_seed_public_key",
]
