# SPDX-License-Identifier: Apache-2.0
"""`Settings`: everything `sie-sidecar run` is configured with, one frozen value.

Build it with `Settings.from_env(environ, argv)` (the run flags in `argv`, then the environment) or
`Settings.from_sources(environ, namespace)` (a namespace the CLI parsed after `add_run_arguments`);
the env reader (`reader.py`) parses and checks every value. What is derived from the fields stays
here: the §7 horizons, the concurrency limits, the dispatcher's group (`dispatch`), redaction for
the start-up log. The NATS names of the lane are the wire's functions, which the topology
(`bus.topology.TopologySpec`) applies: no copy of them here.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote

from ..errors import ConfigError
from .flags import DEFAULT_IPC_SOCKET_PATH, DEFAULT_TRUSTED_PRODUCERS, build_run_parser
from .groups import DEFAULT_ACK_WAIT_S, DeadlineRules, DispatchSettings, SchedulerConfig
from .limits import MAX_DERIVED_OUTSTANDING, redelivery_envelope, tombstone_horizon, worker_stream_max_age
from .otlp import OtelSettings
from .reader import DebugPeers, EnvReader, IngestMode
from .redaction import REDACTED, redact_text, redact_url_userinfo, strip_url_userinfo, userinfo_parts


def _lower_scheme(url: str) -> str:
    """`NATS://host` as nats-py reads schemes (case-sensitively): `nats://host`."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}" if sep else url


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
    #: The dispatcher's and the schedulers' share of the above (§1.2 batching and pipelining, §15.3
    #: deadlines) for the pool consumer's ack_wait (`DispatchSettings.for_ack_wait` for another one).
    #: Derived from the fields at construction, so direct construction and `dataclasses.replace`
    #: keep it in step; not a setting of its own (no variable, not in `redacted()`).
    dispatch: DispatchSettings = field(init=False, repr=False, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], argv: Sequence[str] = ()) -> Settings:
        """Parse the run flags in `argv` (flags only) and fill the rest from `environ`."""
        namespace = build_run_parser().parse_args(list(argv))
        return cls.from_sources(environ, namespace)

    @classmethod
    def from_sources(cls, environ: Mapping[str, str], namespace: argparse.Namespace | None = None) -> Settings:
        """Build from an already parsed namespace (see `add_run_arguments`) and the environment."""
        return cls(**EnvReader(environ, namespace).read())

    def __post_init__(self) -> None:
        object.__setattr__(self, "dispatch", self._dispatch_group())

    def _dispatch_group(self) -> DispatchSettings:
        """`dispatch`: the settings the dispatcher, its schedulers and its deadline rules take."""
        limits = self.concurrency
        return DispatchSettings(
            worker_id=self.worker_id,
            nak_delay_ms=self.nak_delay_ms,
            fetch_budget=self.fallback_batch_budget,
            max_concurrent_batches=limits.model_groups,
            scheduler=SchedulerConfig(
                max_batch_cost=self.batcher_max_batch_cost,
                max_batch_requests=self.batcher_max_batch_requests,
                requests_from_budget=not self.batcher_requests_pinned,
                max_batch_wait_ms=self.batcher_max_batch_wait_ms,
                coalesce_ms=self.batcher_coalesce_ms,
                coalesce_ratio=self.batcher_coalesce_ratio,
                pipeline_depth=limits.pipeline_depth,
                idle_bypass=self.batcher_idle_bypass_enabled,
                jit_dispatch=self.batcher_jit_dispatch_enabled,
                drain_deadline_s=self.scheduler_drain_deadline_ms / 1000.0,
            ),
            wave_cadence=self.wave_cadence,
            controller_env=dict(self.adaptive_batch_env),
            controller_trace_dir=self.controller_trace_dir,
            cost_pinned=self.batcher_cost_pinned,
            parked_deadline_s=self.redelivery_envelope_s,
            generate_frame_timeout_s=self.generate_ipc_frame_timeout_s,
            deadlines=DeadlineRules(
                enforce=self.work_deadline_enforce,
                skew_s=self.work_deadline_skew_tolerance_ms / 1000.0,
                max_budget_s=self.work_deadline_max_budget_s,
                horizon_s=self.tombstone_horizon_s,
            ),
            ipc_request_timeout_s=self.ipc_request_timeout_s,
        ).for_ack_wait(DEFAULT_ACK_WAIT_S)

    # ---------------------------------------------------------------------------- derived (§1.3, §2, §10)

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
        return int(worker_stream_max_age(self.stream_max_age_s, self.max_deliver))

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
        if "://" in store and f"{scheme}://" in STORES_NOT_YET:
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
            values.extend(userinfo_parts(getattr(self, name)))
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
            if f.name in ("warnings", "dispatch"):
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
STORES_NOT_YET: frozenset[str] = frozenset()
#: Fields whose whole specified effect is a start-up check (§1.1: the liveness budget must exceed the
#: model-ready timeout), so nothing reads them later.
CHECKED_ONLY = frozenset({"worker_liveness_budget_s"})
