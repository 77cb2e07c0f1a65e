# SPDX-License-Identifier: Apache-2.0
"""Settings of `sie-sidecar run`: sidecar-behaviour §1.1 (flag ⇄ env), §1.2 (env-only tuning), §1.3 (names).

Two entry points build the same frozen `Settings`:

* `Settings.from_env(environ, argv)` parses `argv` (the flags of `run` only, no sub-command) with a
  parser of its own and then reads `environ`;
* `Settings.from_sources(environ, namespace)` takes an `argparse.Namespace` the CLI already parsed
  after calling `add_run_arguments(parser)` on its `run` sub-parser.

One module per job, none importing another's private names, none importing `__init__`:

* `flags`: the §1.1 flag table and the `run` parser (secrets' flags are refused, never read);
* `known`: every `SIE_*` variable something reads, and the warning for one nothing reads;
* `limits`: the largest value of each numeric variable, and the §7 horizons;
* `reader`: the env reader (`EnvReader`), its parsing policy and every refusal line;
* `settings`: the `Settings` value and what is derived from it;
* `groups`: the dispatcher's, the schedulers' and the deadline rules' share (`Settings.dispatch`);
* `otlp`: the OTLP export settings from the standard `OTEL_*` variables;
* `logins`: the NATS login files and client TLS, checked at start-up;
* `redaction`: secrets out of text.

Names are re-exported here, so `from sie_sidecar.config import X` keeps working for every X it had.
The NATS names of the lane are the wire's functions, applied by `bus.topology.TopologySpec`.
"""

from __future__ import annotations

from ..errors import ConfigError
from .flags import (
    DEFAULT_IPC_SOCKET_PATH,
    DEFAULT_TRUSTED_PRODUCERS,
    ENV_ONLY_HELP,
    NOT_YET_FLAGS,
    RUN_FLAGS,
    RunFlag,
    add_run_arguments,
    build_run_parser,
    help_text,
    refuse_secret_flags,
)
from .groups import DEFAULT_ACK_WAIT_S, MAX_ITEM_WAIT_S, DeadlineRules, DispatchSettings, SchedulerConfig
from .known import ENV_ONLY, NATS_LOGIN_ENV, READ_ELSEWHERE, known_env, unknown_env_warnings
from .limits import (
    INT64_MAX,
    LIMITS,
    MAX_DERIVED_OUTSTANDING,
    MAX_DURATION_MS,
    MAX_DURATION_S,
    redelivery_envelope,
    tombstone_horizon,
)
from .logins import (
    MAX_LOGIN_FILE_BYTES,
    NATS_URL_SCHEMES,
    NATS_WEBSOCKET_SCHEMES,
    check_creds_file,
    check_nkey_seed_file,
    nats_tls_context,
    read_login_file,
    user_seed_public_key,
)
from .otlp import OtelSettings, OtlpHeaders, OtlpTransport
from .reader import DebugPeers, EnvReader, IngestMode
from .redaction import NKEY_SEED_RE, REDACTED, redact_text, redact_url_userinfo, strip_url_userinfo
from .settings import CHECKED_ONLY, NOT_YET, STORES_NOT_YET, ConcurrencyLimits, Settings

__all__ = [
    "CHECKED_ONLY",
    "DEFAULT_ACK_WAIT_S",
    "DEFAULT_IPC_SOCKET_PATH",
    "DEFAULT_TRUSTED_PRODUCERS",
    "ENV_ONLY",
    "ENV_ONLY_HELP",
    "INT64_MAX",
    "LIMITS",
    "MAX_DERIVED_OUTSTANDING",
    "MAX_DURATION_MS",
    "MAX_DURATION_S",
    "MAX_ITEM_WAIT_S",
    "MAX_LOGIN_FILE_BYTES",
    "NATS_LOGIN_ENV",
    "NATS_URL_SCHEMES",
    "NATS_WEBSOCKET_SCHEMES",
    "NKEY_SEED_RE",
    "NOT_YET",
    "NOT_YET_FLAGS",
    "READ_ELSEWHERE",
    "REDACTED",
    "RUN_FLAGS",
    "STORES_NOT_YET",
    "ConcurrencyLimits",
    "ConfigError",
    "DeadlineRules",
    "DebugPeers",
    "DispatchSettings",
    "EnvReader",
    "IngestMode",
    "OtelSettings",
    "OtlpHeaders",
    "OtlpTransport",
    "RunFlag",
    "SchedulerConfig",
    "Settings",
    "add_run_arguments",
    "build_run_parser",
    "check_creds_file",
    "check_nkey_seed_file",
    "help_text",
    "known_env",
    "nats_tls_context",
    "read_login_file",
    "redact_text",
    "redact_url_userinfo",
    "redelivery_envelope",
    "refuse_secret_flags",
    "strip_url_userinfo",
    "tombstone_horizon",
    "unknown_env_warnings",
    "user_seed_public_key",
]
