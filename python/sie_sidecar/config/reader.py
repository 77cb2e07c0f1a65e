# SPDX-License-Identifier: Apache-2.0
"""The env reader: raw values flag-first, parsed and checked, as the keyword arguments of `Settings`.

Parsing policy (the spec is silent on malformed values, so the reader settles it):

* a malformed §1.1 number is a startup error (`ConfigError`), as a typed CLI flag would be;
* a malformed §1.2 value, or one outside the range the spec gives it, falls back to its default and
  adds a line to `Settings.warnings`, which the caller logs once logging is up (the modules that
  read these variables upstream ignore what they cannot parse);
* a number larger than the server or the protocol can take (`LIMITS`: JetStream's int64 fields,
  durations that must fit int64 nanoseconds, ports, per-process counts) is a startup error naming the
  variable, in §1.1 and §1.2 alike: it would otherwise pass here and fail later with a traceback;
* a setting this build parses but does not implement yet (`settings.NOT_YET`) is refused by
  `Settings.require_supported()` when its value differs from the default: `SIE_X is not supported
  yet`, never a silent no-op;
* a blank (whitespace-only) §1.1 value counts as unset, except `SIE_PAYLOAD_STORE_URL`, where only
  the empty string does (§1.1, §12), and `SIE_CONFIG_SERVICE_TOKEN`, where blank means "send none";
* a boolean takes 1/true/yes/on or 0/false/no/off (any case; some variables take fewer, see
  `EnvValues.flag`), and any other word is a startup error: upstream reads an unknown word as off,
  silently;
* `SIE_NATS_URL` is parsed here (scheme, host, port) and each NATS login is checked here (the file
  readable, the creds or seed well formed, the certificate and key loading), so a mistake stops
  start-up with exit code 2 and one line naming the variable instead of a retry loop;
* an `SIE_*` variable that nothing reads (`known_env`) gets one warning naming the closest known one.
"""

from __future__ import annotations

import math
import uuid
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import ConfigError
from .flags import DEFAULT_IPC_SOCKET_PATH, DEFAULT_TRUSTED_PRODUCERS, refuse_secret_flags
from .known import unknown_env_warnings
from .limits import INT64_MAX, LIMITS, MAX_DEADLINE_BUDGET_S, MAX_DEADLINE_SKEW_MS, MAX_DURATION_MS, tombstone_horizon
from .logins import NATS_URL_SCHEMES, NATS_WEBSOCKET_SCHEMES, check_creds_file, check_nkey_seed_file, nats_tls_context
from .otlp_reader import OtlpEnvReader
from .redaction import redact_url_userinfo
from .values import FALSY, FLOAT_RE, TRUTHY, UINT_RE, words

IngestMode = Literal["nats", "local"]
#: Who `GET /debug/state` answers (`SIE_SIDECAR_DEBUG_ENDPOINT`): loopback peers only, or any peer.
DebugPeers = Literal["loopback", "all"]

_MUX_ON = frozenset({"1", "true", "TRUE", "on", "ON"})  # exactly these spellings (§1.2), no trimming
_WAVE_OFF = frozenset({"0", "off", "false", "no", "disabled"})
#: SIE_NATS_CONSERVATIVE_CLEANUP is on for exactly these (v0.7.1 reads `yes` and `on` as off, so
#: those two are refused rather than read either way).
_CLEANUP_ON = frozenset({"1", "true"})


class EnvReader(OtlpEnvReader):
    """The whole of `Settings` from the flags and the environment (`read`), on `EnvValues`' typed
    access and `OtlpEnvReader`'s OTLP settings."""

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

    def _debug_endpoint(self) -> dict[str, Any]:
        """`loopback` (the default; also the on words), `all` or `off` (also the off words); blank is
        the default. Anything else is refused, as a boolean's unknown word is."""
        env = "SIE_SIDECAR_DEBUG_ENDPOINT"
        value = self.environ.get(env)
        word = (value or "").strip().lower()
        if word in ("loopback", "all"):
            return {"debug_endpoint": True, "debug_endpoint_peers": word}
        if word not in TRUTHY | FALSY | {""}:
            self.fail(
                env,
                f"expected loopback (or {words(TRUTHY)}), all, or off (or {words(FALSY - {'off'})}), got {value!r}",
            )
        return {"debug_endpoint": self.flag(env, value, default=True), "debug_endpoint_peers": "loopback"}

    def _ipc_mux(self) -> bool:
        """§1.2: on for exactly `1`, `true`, `TRUE`, `on`, `ON` (no trimming); off for the usual off
        words and blank; anything else (`yes`, `True`, ` 1`: off upstream) is refused."""
        value = self.environ.get("SIE_IPC_MUX")
        if value is None or value in _MUX_ON:
            return value is not None
        if value.strip().lower() in FALSY | {""}:
            return False
        self.fail(
            "SIE_IPC_MUX",
            f"expected exactly 1, true, TRUE, on or ON (on) or {words(FALSY)} (off), got {value!r}",
        )

    # -- assembly

    def read(self) -> dict[str, Any]:  # heterogeneous values: the keyword arguments of `Settings`
        """Every field of `Settings` but the derived ones, by name; raises ConfigError on a refusal."""
        refuse_secret_flags(self.namespace)
        self.warnings.extend(unknown_env_warnings(self.environ))
        ingest = self._ingest()
        otel = self.otel()
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

        trust_any = self.flag(
            "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER", self.raw("SIE_NATS_CONFIG_TRUST_ANY_PRODUCER"), default=False
        )
        producers = self._producers(trust_any)

        fetch_budget = self.env_uint("SIE_NATS_FETCH_BUDGET", 64)
        inflight = self.env_uint("SIE_PULL_LOOP_INFLIGHT", max_concurrent_batches)
        outstanding, outstanding_pinned = self.env_uint_given(
            "SIE_PULL_LOOP_MAX_OUTSTANDING", max(fetch_budget, inflight)
        )
        storage = (self.environ.get("SIE_STREAM_STORAGE") or "").strip().lower()
        max_deliver = self.env_uint("SIE_MAX_DELIVER", 20)
        stream_max_age_s = self.env_uint("SIE_STREAM_MAX_AGE_S", 1800)

        return dict(
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
            pool_admission_enabled=self.flag(
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
            metrics_enabled=self.metrics_enabled(otel),
            otel=otel,
            tracing_enabled=self.tracing_enabled(otel),
            **self._work_deadlines(tombstone_horizon(stream_max_age_s, max_deliver)),
            log_filter=(self.environ.get("RUST_LOG") or "").strip() or "info",
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
        env = self.environ
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
        found = sorted((k, v) for k, v in self.environ.items() if k.startswith("SIE_ADAPTIVE_BATCH_"))
        for key, value in found:
            text = value.strip()
            if key.endswith("_COST") and UINT_RE.fullmatch(text) and int(text) > INT64_MAX:
                self.fail(key, f"{text} is out of range (at most {INT64_MAX})")
            if key.endswith("_MS") and FLOAT_RE.fullmatch(text):
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
        hostname = self.environ.get("HOSTNAME", "")
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
        value = (self.environ.get("SIE_NATS_FETCH_BUDGET") or "").strip()
        return int(value) if UINT_RE.fullmatch(value) else 64

    def _reconcile_interval(self) -> int:
        """0 disables; positive values floored to 10 s; unparsable → 30 s (§1.2)."""
        value = self.env_uint("SIE_NATS_CONSUMER_RECONCILE_INTERVAL_MS", 30000, lambda n: True)
        return 0 if value == 0 else max(10000, value)

    def _nak_delay_ms(self) -> int:
        """Float seconds > 0, truncated to whole ms; anything else keeps 5 s."""
        value = self.environ.get("SIE_NAK_DELAY_S")
        if value is None:
            return 5000
        stripped = value.strip()
        if FLOAT_RE.fullmatch(stripped):
            seconds = float(stripped)
            if math.isfinite(seconds):
                self.within_limit("SIE_NAK_DELAY_S", seconds)
            if math.isfinite(seconds) and seconds > 0:
                return int(seconds * 1000)
        self.warnings.append(f"SIE_NAK_DELAY_S={value!r} ignored; using 5.0")
        return 5000
