# SPDX-License-Identifier: Apache-2.0
"""Settings: sidecar-behaviour §1.1/§1.2 defaults, parsing rules and startup errors, §1.3 names, TV-S4/TV-S5,
CLI precedence and secret redaction."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import config, wire
from sie_sidecar.bus.config_sub import config_subject
from sie_sidecar.bus.topology import TopologySpec
from sie_sidecar.config import (
    DEFAULT_ACK_WAIT_S,
    NOT_YET_FLAGS,
    REDACTED,
    RUN_FLAGS,
    ConfigError,
    DeadlineRules,
    DispatchSettings,
    OtelSettings,
    SchedulerConfig,
    Settings,
    add_run_arguments,
    build_run_parser,
    help_text,  # the secret rendering, while no secret flag is shown
    redact_url_userinfo,
)

BASE = {
    "SIE_NATS_URL": "nats://127.0.0.1:4222",
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "l4",
    "HOSTNAME": "pod-0",
}

SECRETS = {
    "SIE_GATEWAY_API_KEY": "gw-key-0xDEADBEEF",
    "SIE_ADMIN_TOKEN": "admin-token-0xC0FFEE",
    "SIE_CONFIG_SERVICE_TOKEN": "cfg-token-0xFACADE",
    "SIE_NATS_USER": "worker",
    "SIE_NATS_PASSWORD": "nats-pass-0xBADCAB",
    "SIE_NATS_URL": "nats://urluser:url-pass-0xABBA@nats.internal:4222",
}
SECRET_VALUES = [
    "gw-key-0xDEADBEEF",
    "admin-token-0xC0FFEE",
    "cfg-token-0xFACADE",
    "nats-pass-0xBADCAB",
    "url-pass-0xABBA",
    "urluser",
]


def env_with(**overrides: str | None) -> dict[str, str]:
    """BASE plus overrides; an override of None removes the variable."""
    env = dict(BASE)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def build(argv: list[str] | None = None, /, **overrides: str | None) -> Settings:
    return Settings.from_env(env_with(**overrides), argv or [])


def config_error(argv: list[str] | None = None, /, **overrides: str | None) -> str:
    with pytest.raises(ConfigError) as info:
        build(argv, **overrides)
    return str(info.value)


# ------------------------------------------------------------------------------------------- defaults

DEFAULTS: list[tuple[str, object]] = [
    ("ingest", "nats"),
    ("local_socket", None),
    ("nats_url", "nats://127.0.0.1:4222"),
    ("nats_user", None),
    ("nats_password", None),
    ("nats_token", None),
    ("nats_creds_file", None),
    ("nats_nkey_seed_file", None),
    ("nats_tls_cert_file", None),
    ("nats_tls_key_file", None),
    ("nats_tls_ca_file", None),
    ("pool", "default"),
    ("bundle", "default"),
    ("machine_profile", "l4"),
    ("ipc_socket_path", "/tmp/sie-ipc.sock"),
    ("ipc_socket_paths", ("/tmp/sie-ipc.sock",)),
    ("ipc_pool_size", 4),
    ("ipc_request_timeout_s", 60.0),
    ("model_ready_timeout_s", 900.0),
    ("worker_liveness_budget_s", None),
    ("payload_store_url", None),
    ("gateway_url", None),
    ("gateway_api_key", None),
    ("pool_admission_enabled", True),
    ("pool_admission_check_interval_ms", 5000),
    ("pool_admission_pause_ms", 1000),
    ("pool_admission_stale_after_ms", 30000),
    ("worker_probe_port", 9095),
    ("worker_id", "pod-0"),
    ("worker_ping_interval_ms", 2000),
    ("worker_readyz_stale_mult", 3),
    ("gpu_count", 1),
    ("bundle_config_hash", ""),
    ("config_service_url", None),
    ("config_service_token", None),
    ("admin_token", None),
    ("worker_config_poll_interval_ms", 30000),
    ("worker_config_full_export_interval_ms", 300000),
    ("nats_config_trusted_producers", ("sie-config",)),
    ("nats_config_trust_any_producer", False),
    ("health_publish_interval_ms", 5000),
    ("max_deliver", 20),
    ("max_ack_pending", 1000),
    ("stream_max_age_s", 1800),
    ("stream_storage", "memory"),
    ("stream_replicas", 1),
    ("nats_conservative_cleanup", False),
    ("nats_consumer_reconcile_interval_ms", 30000),
    ("nats_fetch_budget", 64),
    ("fallback_batch_budget", 64),
    ("nats_pull_expires_s", 5),
    ("pull_loop_inflight", 4),
    ("pull_loop_max_outstanding", 64),
    ("pull_outstanding_pinned", False),
    ("max_concurrent_batches", 4),
    ("audio_prep_permits", 1),
    ("nak_delay_ms", 5000),
    ("scheduler_drain_deadline_ms", 10000),
    ("pipeline_depth", 2),
    ("wave_cadence", True),
    ("batcher_idle_bypass_enabled", True),
    ("batcher_jit_dispatch_enabled", True),
    ("batcher_max_batch_wait_ms", 15.0),
    ("batcher_max_batch_cost", 16384),
    ("batcher_max_batch_requests", 12),
    ("batcher_requests_pinned", False),
    ("batcher_coalesce_ms", 5.0),
    ("batcher_coalesce_ratio", 0.5),
    ("batcher_cost_pinned", False),
    ("adaptive_batch_env", ()),
    ("controller_trace_dir", None),
    ("debug_endpoint", True),
    ("debug_endpoint_peers", "loopback"),
    ("adaptive_min_quantum_ms", 2.0),
    ("adaptive_max_quantum_ms", 15.0),
    ("adaptive_target_p50_ms", 50.0),
    ("pull_quantum_include_queue_ms", False),
    ("health_publish_enabled", True),
    ("generate_ipc_frame_timeout_s", 300),
    ("ipc_mux", False),
    ("nats_connect_timeout_s", 30.0),
    ("nats_ping_interval_s", 5.0),
    ("nats_max_outstanding_pings", 3),
    ("nats_ack_confirm_s", 2.0),
    ("metrics_enabled", False),
    ("tracing_enabled", False),
    ("otel", OtelSettings()),
    ("work_deadline_enforce", False),
    ("work_deadline_skew_tolerance_ms", 5000),
    ("work_deadline_max_budget_s", 180.0),
    ("log_filter", "info"),
    ("warnings", ()),
    # Derived: the dispatcher's group for the pool consumer's ack_wait (30 s: items wait at most 5 s,
    # progress ACKs after 15 s); the count cap follows the backend's budget, as nothing pins it.
    (
        "dispatch",
        DispatchSettings(worker_id="pod-0", scheduler=SchedulerConfig(requests_from_budget=True), controller_env={}),
    ),
]


@pytest.mark.parametrize(("name", "expected"), DEFAULTS, ids=[name for name, _ in DEFAULTS])
def test_default(name: str, expected: object) -> None:
    assert getattr(build(), name) == expected


def test_defaults_cover_every_field() -> None:
    assert {f.name for f in dataclasses.fields(Settings)} == {name for name, _ in DEFAULTS}


def test_dataclass_defaults_match_parsed_defaults() -> None:
    """Direct construction (used by other modules' tests) gives the same values as an empty environment."""
    parsed = build()
    direct = Settings(pool="default", bundle="default", machine_profile="l4", worker_id="pod-0")
    assert dataclasses.replace(direct, nats_url=parsed.nats_url) == parsed


def test_settings_are_frozen() -> None:
    settings = build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.pool = "other"  # type: ignore[misc]


# ------------------------------------------------------------------------------------------ ingest mode


@pytest.mark.parametrize("value", ["", "   ", "nats", "NATS", " Nats "])
def test_ingest_nats_spellings(value: str) -> None:
    assert build(SIE_SIDECAR_INGEST=value).ingest == "nats"


@pytest.mark.parametrize("value", ["local", "LOCAL", " Local\t"])
def test_ingest_local_spellings(value: str) -> None:
    settings = build(SIE_SIDECAR_INGEST=value, SIE_SIDECAR_LOCAL_SOCKET="/run/sie/ingest.sock")
    assert settings.ingest == "local"
    assert settings.local_socket == "/run/sie/ingest.sock"


def test_ingest_unknown_mode_is_a_startup_error() -> None:
    assert "SIE_SIDECAR_INGEST" in config_error(SIE_SIDECAR_INGEST="kafka")


@pytest.mark.parametrize("value", [None, "", "  "])
def test_nats_mode_requires_nats_url(value: str | None) -> None:
    assert "SIE_NATS_URL" in config_error(SIE_NATS_URL=value)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_local_mode_requires_local_socket(value: str | None) -> None:
    assert "SIE_SIDECAR_LOCAL_SOCKET" in config_error(SIE_SIDECAR_INGEST="local", SIE_SIDECAR_LOCAL_SOCKET=value)


def test_local_mode_does_not_need_nats_url() -> None:
    settings = build(SIE_SIDECAR_INGEST="local", SIE_SIDECAR_LOCAL_SOCKET="/s.sock", SIE_NATS_URL=None)
    assert settings.nats_url is None
    assert settings.nats_servers == []


def test_nats_servers_split_the_url_list() -> None:
    settings = build(SIE_NATS_URL=" nats://a:4222, ,nats://b:4222 ")
    assert settings.nats_servers == ["nats://a:4222", "nats://b:4222"]


@pytest.mark.parametrize("present", ["SIE_NATS_USER", "SIE_NATS_PASSWORD"])
def test_nats_user_and_password_must_come_together(present: str) -> None:
    message = config_error(**{present: "x"})
    assert "SIE_NATS_USER" in message
    assert "SIE_NATS_PASSWORD" in message


def test_nats_user_and_password_both_set() -> None:
    settings = build(SIE_NATS_USER="u", SIE_NATS_PASSWORD="p")
    assert (settings.nats_user, settings.nats_password) == ("u", "p")


def test_nats_user_and_password_both_empty_mean_no_auth() -> None:
    settings = build(SIE_NATS_USER="", SIE_NATS_PASSWORD="")
    assert (settings.nats_user, settings.nats_password) == (None, None)


# ----------------------------------------------------------------------------------- lanes (TV-S5)

LANE_VARS = ["SIE_POOL", "SIE_BUNDLE", "SIE_MACHINE_PROFILE"]
LANE_FIELDS = {"SIE_POOL": "pool", "SIE_BUNDLE": "bundle", "SIE_MACHINE_PROFILE": "machine_profile"}


@pytest.mark.parametrize("var", LANE_VARS)
def test_tv_s5_lane_token_is_trimmed(var: str) -> None:
    assert getattr(build(**{var: " default-pool "}), LANE_FIELDS[var]) == "default-pool"


@pytest.mark.parametrize("value", ["", "   ", "foo.bar", "foo*", "foo>", "foo bar"])
@pytest.mark.parametrize("var", LANE_VARS)
def test_tv_s5_bad_lane_token_is_a_startup_error(var: str, value: str) -> None:
    assert config_error(**{var: value}).startswith(var)


@pytest.mark.parametrize("var", LANE_VARS)
def test_missing_lane_token_is_a_startup_error(var: str) -> None:
    assert config_error(**{var: None}).startswith(var)


_BAD_LANE_CHARS = st.sampled_from([".", "*", ">", " ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0", "\u2003"])


@given(prefix=st.text(max_size=8), bad=_BAD_LANE_CHARS, suffix=st.text(max_size=8))
def test_lane_validation_never_accepts_dot_star_gt_or_whitespace(prefix: str, bad: str, suffix: str) -> None:
    value = f"{prefix}x{bad}y{suffix}"  # the bad character is inside, so trimming cannot remove it
    with pytest.raises(ConfigError):
        Settings.from_env(env_with(SIE_POOL=value))


@given(
    token=st.text(st.characters(categories=["L", "N"], include_characters="-_"), min_size=1, max_size=20),
    pad=st.sampled_from(["", " ", "\t", "  \n"]),
)
def test_lane_validation_accepts_safe_tokens(token: str, pad: str) -> None:
    assert Settings.from_env(env_with(SIE_BUNDLE=f"{pad}{token}{pad}")).bundle == token


# --------------------------------------------------------------------------------- IPC sockets (TV-S5)


def test_tv_s5_socket_list_trims_and_drops_blanks() -> None:
    assert build(SIE_IPC_SOCKET_PATHS=" /a.sock, ,/b.sock ").ipc_socket_paths == ("/a.sock", "/b.sock")


def test_tv_s5_blank_socket_list_falls_back_to_primary() -> None:
    settings = build(SIE_IPC_SOCKET_PATHS=" , ", SIE_IPC_SOCKET_PATH="/run/backend.sock")
    assert settings.ipc_socket_paths == ("/run/backend.sock",)


def test_tv_s5_duplicate_socket_is_a_startup_error() -> None:
    message = config_error(SIE_IPC_SOCKET_PATHS="/a.sock,/b.sock,/a.sock")
    assert message.startswith("SIE_IPC_SOCKET_PATHS")
    assert "/a.sock" in message


def test_primary_socket_is_kept_when_a_list_is_given() -> None:
    settings = build(SIE_IPC_SOCKET_PATH="/p.sock", SIE_IPC_SOCKET_PATHS="/a.sock")
    assert (settings.ipc_socket_path, settings.ipc_socket_paths) == ("/p.sock", ("/a.sock",))


def test_blank_primary_socket_keeps_the_default() -> None:
    assert build(SIE_IPC_SOCKET_PATH="  ").ipc_socket_paths == ("/tmp/sie-ipc.sock",)


def test_ipc_pool_size_defaults_to_max_concurrent_batches() -> None:
    assert build(SIE_MAX_CONCURRENT_BATCHES="7").ipc_pool_size == 7


def test_ipc_pool_size_zero_counts_as_unset() -> None:
    assert build(SIE_IPC_POOL_SIZE="0", SIE_MAX_CONCURRENT_BATCHES="6").ipc_pool_size == 6


def test_ipc_pool_size_explicit() -> None:
    assert build(SIE_IPC_POOL_SIZE="2").ipc_pool_size == 2


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "1_000"])
def test_malformed_section_1_1_integer_is_a_startup_error(value: str) -> None:
    assert config_error(SIE_IPC_POOL_SIZE=value).startswith("SIE_IPC_POOL_SIZE (--ipc-pool-size)")


@pytest.mark.parametrize(
    ("var", "field"),
    [("SIE_IPC_REQUEST_TIMEOUT_S", "ipc_request_timeout_s"), ("SIE_MODEL_READY_TIMEOUT_S", "model_ready_timeout_s")],
)
@pytest.mark.parametrize(("value", "expected"), [("0", 1.0), ("1", 1.0), ("30", 30.0)])
def test_ipc_timeouts_floor_at_one_second(var: str, field: str, value: str, expected: float) -> None:
    assert getattr(build(**{var: value}), field) == expected


# --------------------------------------------------------------------------- liveness budget (TV-S5)


@pytest.mark.parametrize(
    ("ready", "budget", "expected"), [("900", None, None), ("900", "1080", 1080.0), (None, "901", 901.0)]
)
def test_tv_s5_liveness_budget_accepted(ready: str | None, budget: str | None, expected: float | None) -> None:
    settings = build(SIE_MODEL_READY_TIMEOUT_S=ready, SIE_WORKER_LIVENESS_BUDGET_S=budget)
    assert settings.worker_liveness_budget_s == expected


def test_tv_s5_liveness_budget_must_be_positive() -> None:
    message = config_error(SIE_MODEL_READY_TIMEOUT_S="900", SIE_WORKER_LIVENESS_BUDGET_S="0")
    assert message == "SIE_WORKER_LIVENESS_BUDGET_S (--worker-liveness-budget-s): must be > 0"


@pytest.mark.parametrize(("ready", "budget"), [("900", "900"), ("1200", "1080"), (None, "900")])
def test_tv_s5_model_ready_timeout_must_be_below_liveness_budget(ready: str | None, budget: str) -> None:
    message = config_error(SIE_MODEL_READY_TIMEOUT_S=ready, SIE_WORKER_LIVENESS_BUDGET_S=budget)
    assert message.startswith("SIE_WORKER_LIVENESS_BUDGET_S")
    assert "SIE_MODEL_READY_TIMEOUT_S" in message


def test_blank_liveness_budget_is_unset() -> None:
    assert build(SIE_WORKER_LIVENESS_BUDGET_S=" ").worker_liveness_budget_s is None


# ------------------------------------------------------------------------------ payload store, gateway


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("", None), ("  ", "  "), ("s3://b/p", "s3://b/p")])
def test_payload_store_url_only_the_empty_string_is_empty(value: str | None, expected: str | None) -> None:
    assert build(SIE_PAYLOAD_STORE_URL=value).payload_store_url == expected


@pytest.mark.parametrize("var", ["SIE_GATEWAY_URL", "SIE_GATEWAY_API_KEY", "SIE_CONFIG_SERVICE_URL"])
def test_blank_optional_string_is_unset(var: str) -> None:
    field = var.removeprefix("SIE_").lower()
    assert getattr(build(**{var: "   "}), field) is None


def test_gateway_url_is_trimmed() -> None:
    assert build(SIE_GATEWAY_URL=" http://gw:8080 ").gateway_url == "http://gw:8080"


@pytest.mark.parametrize("value", ["0", "false", "NO", "off", " Off ", "FALSE"])
def test_pool_admission_disabled_spellings(value: str) -> None:
    assert build(SIE_POOL_ADMISSION_ENABLED=value).pool_admission_enabled is False


@pytest.mark.parametrize("value", ["", " ", "1", "yes", "true"])
def test_pool_admission_anything_else_is_enabled(value: str) -> None:
    assert build(SIE_POOL_ADMISSION_ENABLED=value).pool_admission_enabled is True


def test_pool_admission_refuses_an_unknown_word() -> None:
    """Issue 32: an unknown word was read as enabled; it is refused (exit 2) now."""
    assert config_error(SIE_POOL_ADMISSION_ENABLED="garbage").startswith("SIE_POOL_ADMISSION_ENABLED")


def test_pool_admission_active_needs_a_gateway() -> None:
    assert build().pool_admission_active is False
    assert build(SIE_GATEWAY_URL="http://gw").pool_admission_active is True
    assert build(SIE_GATEWAY_URL="http://gw", SIE_POOL_ADMISSION_ENABLED="off").pool_admission_active is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5.0", 5000),
        ("2.5", 2500),
        ("1e1", 10000),
        ("0.5", 1000),
        ("0", 1000),
        ("-3", 1000),
        ("nan", 1000),
        ("inf", 1000),
    ],
)
def test_pool_admission_check_interval_floor(value: str, expected: int) -> None:
    assert build(SIE_POOL_ADMISSION_CHECK_INTERVAL_S=value).pool_admission_check_interval_ms == expected


@pytest.mark.parametrize(
    ("value", "expected"), [("1.0", 1000), ("0.25", 250), ("0.05", 100), ("0", 100), ("-inf", 100)]
)
def test_pool_admission_pause_floor(value: str, expected: int) -> None:
    assert build(SIE_POOL_ADMISSION_PAUSE_S=value).pool_admission_pause_ms == expected


@pytest.mark.parametrize(("value", "expected"), [("2.5", 2500), ("0", 0), ("-1", 0), ("0.0004", 0), ("NaN", 0)])
def test_pool_admission_stale_after_floor(value: str, expected: int) -> None:
    assert build(SIE_POOL_ADMISSION_STALE_AFTER_S=value).pool_admission_stale_after_ms == expected


@pytest.mark.parametrize("value", ["abc", "5s", "1,5"])
def test_malformed_section_1_1_float_is_a_startup_error(value: str) -> None:
    assert config_error(SIE_POOL_ADMISSION_CHECK_INTERVAL_S=value).startswith("SIE_POOL_ADMISSION_CHECK_INTERVAL_S")


# ----------------------------------------------------------------------------- probe, identity, health


def test_probe_port_explicit() -> None:
    assert build(SIE_WORKER_PROBE_PORT="8080").worker_probe_port == 8080


@pytest.mark.parametrize("value", ["0", "65536", "70000", "99999999999999999999"])
def test_probe_port_out_of_range_is_a_startup_error(value: str) -> None:
    assert config_error(SIE_WORKER_PROBE_PORT=value).startswith("SIE_WORKER_PROBE_PORT")


def test_worker_id_explicit_is_not_trimmed() -> None:
    assert build(SIE_WORKER_ID=" w-1 ").worker_id == " w-1 "


def test_worker_id_defaults_to_hostname() -> None:
    assert build(SIE_WORKER_ID="").worker_id == "pod-0"


@pytest.mark.parametrize("hostname", [None, "", "  "])
def test_worker_id_falls_back_to_uuid(hostname: str | None) -> None:
    worker_id = build(HOSTNAME=hostname).worker_id
    assert re.fullmatch(r"worker-[0-9a-f-]{36}", worker_id)
    assert uuid.UUID(worker_id.removeprefix("worker-")).version == 4


def test_ping_interval_explicit() -> None:
    assert build(SIE_WORKER_PING_INTERVAL_MS="500").worker_ping_interval_ms == 500


@pytest.mark.parametrize("var", ["SIE_WORKER_PING_INTERVAL_MS", "SIE_HEALTH_PUBLISH_INTERVAL_MS"])
def test_zero_timer_period_is_a_startup_error(var: str) -> None:
    assert config_error(**{var: "0"}) == f"{var} (--{var.removeprefix('SIE_').lower().replace('_', '-')}): must be > 0"


def test_readyz_stale_mult_zero_means_three_with_warning() -> None:
    settings = build(SIE_WORKER_READYZ_STALE_MULT="0")
    assert settings.worker_readyz_stale_mult == 3
    assert any("SIE_WORKER_READYZ_STALE_MULT" in line for line in settings.warnings)


def test_readyz_stale_window() -> None:
    assert build().readyz_stale_ms == 6000
    assert build(SIE_WORKER_PING_INTERVAL_MS="1000", SIE_WORKER_READYZ_STALE_MULT="5").readyz_stale_ms == 5000


def test_gpu_count_and_bundle_config_hash() -> None:
    settings = build(SIE_GPU_COUNT="8", SIE_BUNDLE_CONFIG_HASH="abc123")
    assert (settings.gpu_count, settings.bundle_config_hash) == (8, "abc123")


def test_health_publish_interval_explicit() -> None:
    assert build(SIE_HEALTH_PUBLISH_INTERVAL_MS="250").health_publish_interval_ms == 250


# ---------------------------------------------------------------------------------------- live config


@pytest.mark.parametrize(
    ("overrides", "bearer", "deprecated"),
    [
        ({}, None, False),
        ({"SIE_ADMIN_TOKEN": "a"}, "a", True),
        ({"SIE_ADMIN_TOKEN": "  "}, None, False),
        ({"SIE_CONFIG_SERVICE_TOKEN": "c", "SIE_ADMIN_TOKEN": "a"}, "c", False),
        ({"SIE_CONFIG_SERVICE_TOKEN": "", "SIE_ADMIN_TOKEN": "a"}, None, False),
        ({"SIE_CONFIG_SERVICE_TOKEN": "  ", "SIE_ADMIN_TOKEN": "a"}, None, False),
    ],
)
def test_config_service_bearer(overrides: dict[str, str], bearer: str | None, deprecated: bool) -> None:
    settings = build(**overrides)
    assert settings.config_service_bearer == bearer
    assert any("deprecated" in line for line in settings.warnings) is deprecated


@pytest.mark.parametrize(("value", "expected"), [("0", 1000), ("500", 1000), ("1000", 1000), ("2000", 2000)])
def test_config_poll_interval_floor(value: str, expected: int) -> None:
    assert build(SIE_WORKER_CONFIG_POLL_INTERVAL_MS=value).worker_config_poll_interval_ms == expected


def test_full_export_interval_zero_disables() -> None:
    assert build(SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS="0").worker_config_full_export_interval_ms == 0


def test_trusted_producers_list() -> None:
    settings = build(SIE_NATS_CONFIG_TRUSTED_PRODUCERS=" a, b ,,c")
    assert settings.nats_config_trusted_producers == ("a", "b", "c")
    assert settings.config_producer_allow_list == ("a", "b", "c")


def test_empty_trusted_producers_without_trust_any_keeps_the_default() -> None:
    settings = build(SIE_NATS_CONFIG_TRUSTED_PRODUCERS=" , ")
    assert settings.config_producer_allow_list == ("sie-config",)
    assert any("SIE_NATS_CONFIG_TRUSTED_PRODUCERS" in line for line in settings.warnings)


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_trust_any_producer_empties_the_allow_list(value: str) -> None:
    settings = build(SIE_NATS_CONFIG_TRUST_ANY_PRODUCER=value)
    assert settings.nats_config_trust_any_producer is True
    assert settings.config_producer_allow_list == ()


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_trust_any_producer_other_values_are_false(value: str) -> None:
    assert build(SIE_NATS_CONFIG_TRUST_ANY_PRODUCER=value).nats_config_trust_any_producer is False


def test_trust_any_producer_refuses_an_unknown_word() -> None:
    assert "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER" in config_error(SIE_NATS_CONFIG_TRUST_ANY_PRODUCER="maybe")


# --------------------------------------------------------------------------------- §1.2 env-only tuning

POSITIVE_INTS = [
    ("SIE_MAX_DELIVER", "max_deliver", 20),
    ("SIE_MAX_ACK_PENDING", "max_ack_pending", 1000),
    ("SIE_STREAM_MAX_AGE_S", "stream_max_age_s", 1800),
    ("SIE_STREAM_REPLICAS", "stream_replicas", 1),
    ("SIE_NATS_FETCH_BUDGET", "nats_fetch_budget", 64),
    ("SIE_MAX_CONCURRENT_BATCHES", "max_concurrent_batches", 4),
    ("SIE_AUDIO_PREP_PERMITS", "audio_prep_permits", 1),
    ("SIE_SCHEDULER_DRAIN_DEADLINE_MS", "scheduler_drain_deadline_ms", 10000),
    ("SIE_GENERATE_IPC_FRAME_TIMEOUT_S", "generate_ipc_frame_timeout_s", 300),
    ("SIE_PULL_LOOP_INFLIGHT", "pull_loop_inflight", 4),
    ("SIE_PULL_LOOP_MAX_OUTSTANDING", "pull_loop_max_outstanding", 64),
]


@pytest.mark.parametrize(("var", "field", "default"), POSITIVE_INTS, ids=[v for v, _, _ in POSITIVE_INTS])
def test_positive_int_accepted(var: str, field: str, default: int) -> None:
    assert getattr(build(**{var: " 3 "}), field) == 3


@pytest.mark.parametrize("value", ["0", "-1", "abc", "2.5", ""])
@pytest.mark.parametrize(("var", "field", "default"), POSITIVE_INTS, ids=[v for v, _, _ in POSITIVE_INTS])
def test_positive_int_invalid_falls_back_with_warning(var: str, field: str, default: int, value: str) -> None:
    settings = build(**{var: value})
    assert getattr(settings, field) == default
    assert any(line.startswith(f"{var}=") for line in settings.warnings)


@pytest.mark.parametrize(
    ("value", "expected"), [("file", "file"), ("disk", "file"), (" FILE ", "file"), ("ssd", "memory")]
)
def test_stream_storage(value: str, expected: str) -> None:
    assert build(SIE_STREAM_STORAGE=value).stream_storage == expected


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("TRUE", True), ("0", False)])
def test_conservative_cleanup(value: str, expected: bool) -> None:
    assert build(SIE_NATS_CONSERVATIVE_CLEANUP=value).nats_conservative_cleanup is expected


@pytest.mark.parametrize("value", ["yes", "on"])
def test_conservative_cleanup_refuses_the_words_v0_7_1_reads_as_off(value: str) -> None:
    """v0.7.1 reads `yes` and `on` as off: refused (issue 32) rather than read either way."""
    assert config_error(SIE_NATS_CONSERVATIVE_CLEANUP=value).startswith("SIE_NATS_CONSERVATIVE_CLEANUP: expected")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", 0), ("5000", 10000), ("10000", 10000), ("20000", 20000), ("abc", 30000), ("-5", 30000)],
)
def test_consumer_reconcile_interval(value: str, expected: int) -> None:
    assert build(SIE_NATS_CONSUMER_RECONCILE_INTERVAL_MS=value).nats_consumer_reconcile_interval_ms == expected


@pytest.mark.parametrize(("value", "pull", "fallback"), [("32", 32, 32), ("0", 64, 0), ("x", 64, 64)])
def test_fetch_budget_and_model_fallback_budget(value: str, pull: int, fallback: int) -> None:
    settings = build(SIE_NATS_FETCH_BUDGET=value)
    assert (settings.nats_fetch_budget, settings.fallback_batch_budget) == (pull, fallback)


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("29", 29), ("10", 10), ("0", 5), ("30", 5), ("x", 5)])
def test_pull_expires_accepted_only_1_to_29(value: str, expected: int) -> None:
    assert build(SIE_NATS_PULL_EXPIRES_S=value).nats_pull_expires_s == expected


def test_pull_loop_inflight_defaults_to_max_concurrent_batches() -> None:
    assert build(SIE_MAX_CONCURRENT_BATCHES="8").pull_loop_inflight == 8


def test_pull_loop_max_outstanding_defaults_to_max_of_fetch_and_inflight() -> None:
    assert build(SIE_NATS_FETCH_BUDGET="16", SIE_PULL_LOOP_INFLIGHT="32").pull_loop_max_outstanding == 32
    assert build(SIE_NATS_FETCH_BUDGET="16", SIE_PULL_LOOP_INFLIGHT="8").pull_loop_max_outstanding == 16


@pytest.mark.parametrize(("value", "expected"), [("2.5", 2500), ("0.0019", 1), (" 1 ", 1000), ("1e-4", 0)])
def test_nak_delay_truncated_to_whole_ms(value: str, expected: int) -> None:
    assert build(SIE_NAK_DELAY_S=value).nak_delay_ms == expected


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x", ""])
def test_nak_delay_invalid_falls_back_with_warning(value: str) -> None:
    settings = build(SIE_NAK_DELAY_S=value)
    assert settings.nak_delay_ms == 5000
    assert any(line.startswith("SIE_NAK_DELAY_S=") for line in settings.warnings)


@pytest.mark.parametrize(("value", "expected"), [("0", 1), ("1", 1), ("4", 4), ("8", 8), ("20", 8), ("x", 2)])
def test_pipeline_depth_clamped_1_to_8(value: str, expected: int) -> None:
    assert build(SIE_RUST_PIPELINE_DEPTH=value).pipeline_depth == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(v, False) for v in ["0", "off", "false", "no", "disabled", "OFF"]] + [("1", True), ("on", True)],
)
def test_wave_cadence(value: str, expected: bool) -> None:
    assert build(SIE_RUST_WAVE_CADENCE=value).wave_cadence is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(v, False) for v in ["0", "false", "no", "off", "", "  ", "OFF"]] + [(v, True) for v in ["1", "yes"]],
)
def test_health_publish_enabled(value: str, expected: bool) -> None:
    assert build(SIE_HEALTH_PUBLISH_ENABLED=value).health_publish_enabled is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(v, True) for v in ["1", "true", "TRUE", "on", "ON"]] + [(v, False) for v in ["0", "", "off", "False"]],
)
def test_ipc_mux_exact_spellings(value: str, expected: bool) -> None:
    assert build(SIE_IPC_MUX=value).ipc_mux is expected


@pytest.mark.parametrize("value", ["True", "yes", " 1"])
def test_ipc_mux_refuses_the_spellings_v0_7_1_reads_as_off(value: str) -> None:
    """v0.7.1 reads these as off though they look on: refused (issue 32) rather than read either way."""
    assert config_error(SIE_IPC_MUX=value).startswith("SIE_IPC_MUX: expected exactly 1, true, TRUE, on or ON")


@pytest.mark.parametrize(
    ("value", "expected"), [("debug", "debug"), (" warn,sie_sidecar=debug ", "warn,sie_sidecar=debug"), ("", "info")]
)
def test_rust_log(value: str, expected: str) -> None:
    assert build(RUST_LOG=value).log_filter == expected


ENV_ONLY_VARS = [
    "SIE_MAX_DELIVER",
    "SIE_MAX_ACK_PENDING",
    "SIE_STREAM_MAX_AGE_S",
    "SIE_STREAM_STORAGE",
    "SIE_STREAM_REPLICAS",
    "SIE_NATS_CONSERVATIVE_CLEANUP",
    "SIE_NATS_CONSUMER_RECONCILE_INTERVAL_MS",
    "SIE_NATS_FETCH_BUDGET",
    "SIE_NATS_PULL_EXPIRES_S",
    "SIE_PULL_LOOP_INFLIGHT",
    "SIE_PULL_LOOP_MAX_OUTSTANDING",
    "SIE_MAX_CONCURRENT_BATCHES",
    "SIE_AUDIO_PREP_PERMITS",
    "SIE_NAK_DELAY_S",
    "SIE_SCHEDULER_DRAIN_DEADLINE_MS",
    "SIE_RUST_PIPELINE_DEPTH",
    "SIE_RUST_WAVE_CADENCE",
    "SIE_BATCHER_IDLE_BYPASS_ENABLED",
    "SIE_BATCHER_JIT_DISPATCH_ENABLED",
    "SIE_BATCHER_MAX_BATCH_WAIT_MS",
    "SIE_BATCHER_MAX_BATCH_COST",
    "SIE_BATCHER_MAX_BATCH_REQUESTS",
    "SIE_BATCHER_COALESCE_MS",
    "SIE_BATCHER_COALESCE_RATIO",
    "SIE_ADAPTIVE_MIN_QUANTUM_MS",
    "SIE_ADAPTIVE_MAX_QUANTUM_MS",
    "SIE_ADAPTIVE_TARGET_P50_MS",
    "SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS",
    "SIE_HEALTH_PUBLISH_ENABLED",
    "SIE_GENERATE_IPC_FRAME_TIMEOUT_S",
    "SIE_IPC_MUX",
    "RUST_LOG",
]


#: Booleans: since issue 32 an unknown word stops start-up (exit 2) rather than switching them off.
ENV_ONLY_BOOLEANS = frozenset(
    {
        "SIE_NATS_CONSERVATIVE_CLEANUP",
        "SIE_RUST_WAVE_CADENCE",
        "SIE_BATCHER_IDLE_BYPASS_ENABLED",
        "SIE_BATCHER_JIT_DISPATCH_ENABLED",
        "SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS",
        "SIE_HEALTH_PUBLISH_ENABLED",
        "SIE_IPC_MUX",
    }
)


@given(var=st.sampled_from(ENV_ONLY_VARS), value=st.text(max_size=12))
def test_env_only_tuning_never_fails_startup(var: str, value: str) -> None:
    """Malformed values fall back with a warning; only a number beyond what the server or protocol
    takes (`LIMITS`), or a word that is no boolean's, stops start-up, with a ConfigError naming the
    variable."""
    try:
        settings = Settings.from_env(env_with(**{var: value}))
    except ConfigError as exc:
        refused = f"{var}: expected " if var in ENV_ONLY_BOOLEANS else "is out of range (at most"
        assert str(exc).startswith(f"{var}: ") and refused in str(exc)
        return
    assert settings.nak_delay_ms >= 0
    assert 1 <= settings.nats_pull_expires_s <= 29
    assert 1 <= settings.pipeline_depth <= 8
    assert 0 < settings.adaptive_min_quantum_ms <= settings.adaptive_max_quantum_ms
    assert math.isfinite(settings.adaptive_target_p50_ms)
    assert min(settings.max_deliver, settings.nats_fetch_budget, settings.pull_loop_max_outstanding) > 0


# --------------------------------------------------------------------------------- derived names (§1.3)


def _topology(**env: str) -> TopologySpec:
    """The names the sidecar establishes for these settings (start-up's `TopologySpec.from_settings`)."""
    return TopologySpec.from_settings(build(**env))


def test_tv_s4_worker_direct_names() -> None:
    spec = _topology(SIE_POOL="default", SIE_MACHINE_PROFILE="rtx6000", SIE_BUNDLE="sglang", SIE_WORKER_ID="pod-0.svc")
    # The worker-direct stream carries exactly its consumer's filter (ensure_topology).
    assert spec.worker_filter == "sie.work.default.rtx6000.sglang.*.pod-0_dot_svc"
    assert spec.worker_stream == "WORK_WORKER_pod-0_dot_svc"
    assert spec.worker_consumer == "gen-pod-0_dot_svc"


def test_tv_s4_pool_names() -> None:
    spec = _topology(SIE_POOL="l4", SIE_MACHINE_PROFILE="l4-spot", SIE_BUNDLE="default")
    assert spec.pool_stream == "WORK_POOL_l4"
    assert wire.pool_stream_subjects(spec.pool) == ["sie.work.l4.*.*.*"]
    assert spec.pool_durable == "l4_l4-spot_default"
    assert spec.pool_filter == "sie.work.l4.l4-spot.default.*"


def test_tv_s4_health_subject_inserts_worker_id_as_is() -> None:
    assert wire.health_subject(build(SIE_WORKER_ID="worker-l4-0").worker_id) == "sie.health.worker-l4-0"
    assert wire.health_subject(build(SIE_WORKER_ID="pod-0.svc").worker_id) == "sie.health.pod-0.svc"


def test_config_subject() -> None:
    assert config_subject(build(SIE_BUNDLE="sglang").bundle) == "sie.config.models.sglang"


def test_durable_name_normalises_lane_tokens() -> None:
    spec = _topology(SIE_POOL="eval/l4", SIE_MACHINE_PROFILE="a/b", SIE_BUNDLE="c")
    assert spec.pool_durable == "eval__l4_a__b_c"
    assert spec.pool_filter == "sie.work.eval/l4.a__b.c.*"


# --------------------------------------------------------------------------- the dispatcher's settings

#: Environments for the dispatcher's group, each with the group it gives for the pool consumer's
#: ack_wait (30 s), written out.
DISPATCH_CASES: list[tuple[dict[str, str], DispatchSettings]] = [
    ({}, DispatchSettings(worker_id="pod-0", scheduler=SchedulerConfig(requests_from_budget=True), controller_env={})),
    (
        {
            "SIE_WORKER_ID": "w-1",
            "SIE_BATCHER_MAX_BATCH_REQUESTS": "32",
            "SIE_BATCHER_MAX_BATCH_COST": "4096",
            "SIE_BATCHER_MAX_BATCH_WAIT_MS": "8",
            "SIE_BATCHER_COALESCE_MS": "2",
            "SIE_BATCHER_COALESCE_RATIO": "0.25",
            "SIE_RUST_PIPELINE_DEPTH": "4",
            "SIE_MAX_CONCURRENT_BATCHES": "6",
            "SIE_NAK_DELAY_S": "2.5",
            "SIE_NATS_FETCH_BUDGET": "0",
            "SIE_SCHEDULER_DRAIN_DEADLINE_MS": "2500",
            "SIE_RUST_WAVE_CADENCE": "off",
            "SIE_BATCHER_IDLE_BYPASS_ENABLED": "0",
            "SIE_BATCHER_JIT_DISPATCH_ENABLED": "no",
            "SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "40",
            "SIE_SIDECAR_CONTROLLER_TRACE": "/tmp/traces",
            "SIE_MAX_DELIVER": "3",
            "SIE_GENERATE_IPC_FRAME_TIMEOUT_S": "60",
        },
        DispatchSettings(
            worker_id="w-1",
            nak_delay_ms=2500,
            fetch_budget=0,
            max_concurrent_batches=6,
            scheduler=SchedulerConfig(
                max_batch_cost=4096,
                max_batch_requests=32,
                requests_from_budget=False,
                max_batch_wait_ms=8.0,
                coalesce_ms=2.0,
                coalesce_ratio=0.25,
                pipeline_depth=4,
                idle_bypass=False,
                jit_dispatch=False,
                drain_deadline_s=2.5,
            ),
            wave_cadence=False,
            generate_frame_timeout_s=60,
            controller_env={"SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "40"},
            controller_trace_dir="/tmp/traces",
            cost_pinned=True,
            parked_deadline_s=90.0,
        ),
    ),
    (
        {
            "SIE_WORK_DEADLINE_ENFORCE": "on",
            "SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS": "90000",
            "SIE_WORK_DEADLINE_MAX_BUDGET_S": "100000",
            "SIE_STREAM_MAX_AGE_S": "600",
            "SIE_MAX_DELIVER": "40",
            "SIE_IPC_REQUEST_TIMEOUT_S": "5",
        },
        DispatchSettings(
            worker_id="pod-0",
            scheduler=SchedulerConfig(requests_from_budget=True),
            controller_env={},
            parked_deadline_s=1200.0,
            deadlines=DeadlineRules(enforce=True, skew_s=60.0, max_budget_s=1200.0, horizon_s=1200.0),
            ipc_request_timeout_s=5.0,
        ),
    ),
]
#: (ack_wait_s, the longest any item waits, the progress-ACK interval): a quarter of ack_wait at
#: most 5 s, and half of it.
ACK_WAITS = [(30.0, 5.0, 15.0), (8.0, 2.0, 4.0), (120.0, 5.0, 60.0), (1.0, 0.25, 0.5)]


@pytest.mark.parametrize(("env", "at_30_s"), DISPATCH_CASES)
@pytest.mark.parametrize(("ack_wait_s", "item_wait_s", "progress_s"), ACK_WAITS)
def test_the_dispatch_group_is_read_with_the_settings(
    env: dict[str, str], at_30_s: DispatchSettings, ack_wait_s: float, item_wait_s: float, progress_s: float
) -> None:
    """`settings.dispatch.for_ack_wait(x)`, which the runtime hands the dispatcher as it is (no second
    mapping of the settings), holds the values the settings say, written out here field by field."""
    settings = build(**env)
    expected = dataclasses.replace(
        at_30_s,
        scheduler=dataclasses.replace(at_30_s.scheduler, max_item_wait_s=item_wait_s, progress_after_s=progress_s),
    )
    assert settings.dispatch.for_ack_wait(ack_wait_s) == expected


def test_the_dispatch_group_is_for_the_pool_consumers_ack_wait() -> None:
    from sie_sidecar.bus.topology import POOL_ACK_WAIT_S

    assert DEFAULT_ACK_WAIT_S == POOL_ACK_WAIT_S
    settings = build()
    assert settings.dispatch == settings.dispatch.for_ack_wait(POOL_ACK_WAIT_S)


def test_the_dispatch_group_follows_its_fields() -> None:
    """Derived at construction: a replaced or directly constructed Settings carries its own group."""
    settings = dataclasses.replace(build(), scheduler_drain_deadline_ms=2500, worker_id="other")
    assert settings.dispatch.scheduler.drain_deadline_s == 2.5
    assert settings.dispatch.worker_id == "other"
    direct = Settings(pool="p", bundle="b", machine_profile="m", worker_id="w", work_deadline_enforce=True)
    assert direct.dispatch.deadlines.enforce is True
    assert "dispatch" not in direct.redacted()


def test_worker_stream_max_age() -> None:
    assert build().worker_stream_max_age_s == 6000
    assert build(SIE_MAX_DELIVER="3").worker_stream_max_age_s == 1800
    assert build(SIE_MAX_DELIVER="3", SIE_STREAM_MAX_AGE_S="600").worker_stream_max_age_s == 900


# ----------------------------------------------------------------------------------------- CLI flags

SECTION_1_1 = [
    "SIE_SIDECAR_INGEST",
    "SIE_SIDECAR_LOCAL_SOCKET",
    "SIE_NATS_URL",
    "SIE_POOL",
    "SIE_BUNDLE",
    "SIE_MACHINE_PROFILE",
    "SIE_IPC_SOCKET_PATH",
    "SIE_IPC_SOCKET_PATHS",
    "SIE_IPC_POOL_SIZE",
    "SIE_IPC_REQUEST_TIMEOUT_S",
    "SIE_MODEL_READY_TIMEOUT_S",
    "SIE_WORKER_LIVENESS_BUDGET_S",
    "SIE_PAYLOAD_STORE_URL",
    "SIE_GATEWAY_URL",
    "SIE_GATEWAY_API_KEY",
    "SIE_POOL_ADMISSION_ENABLED",
    "SIE_POOL_ADMISSION_CHECK_INTERVAL_S",
    "SIE_POOL_ADMISSION_PAUSE_S",
    "SIE_POOL_ADMISSION_STALE_AFTER_S",
    "SIE_WORKER_PROBE_PORT",
    "SIE_WORKER_ID",
    "SIE_WORKER_PING_INTERVAL_MS",
    "SIE_WORKER_READYZ_STALE_MULT",
    "SIE_GPU_COUNT",
    "SIE_BUNDLE_CONFIG_HASH",
    "SIE_CONFIG_SERVICE_URL",
    "SIE_CONFIG_SERVICE_TOKEN",
    "SIE_ADMIN_TOKEN",
    "SIE_WORKER_CONFIG_POLL_INTERVAL_MS",
    "SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS",
    "SIE_NATS_CONFIG_TRUSTED_PRODUCERS",
    "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER",
    "SIE_HEALTH_PUBLISH_INTERVAL_MS",
]


def test_every_section_1_1_variable_has_a_flag() -> None:
    assert [spec.env for spec in RUN_FLAGS] == SECTION_1_1


def test_flag_names_follow_the_env_names() -> None:
    flags = {spec.env: spec.flag for spec in RUN_FLAGS}
    assert flags["SIE_NATS_URL"] == "--nats-url"
    assert flags["SIE_POOL_ADMISSION_CHECK_INTERVAL_S"] == "--pool-admission-check-interval-s"
    assert all(spec.flag == "--" + spec.env[4:].lower().replace("_", "-") for spec in RUN_FLAGS)


def test_flag_overrides_env() -> None:
    settings = build(
        ["--pool", "flagpool", "--worker-probe-port", "9100"], SIE_POOL="envpool", SIE_WORKER_PROBE_PORT="1"
    )
    assert (settings.pool, settings.worker_probe_port) == ("flagpool", 9100)


def test_flag_equals_form() -> None:
    assert build(["--ipc-socket-paths=/a.sock,/b.sock"]).ipc_socket_paths == ("/a.sock", "/b.sock")


def test_empty_flag_still_wins_over_env() -> None:
    assert build(["--gateway-url", ""], SIE_GATEWAY_URL="http://gw").gateway_url is None


def test_flag_alone_without_env() -> None:
    settings = Settings.from_env(
        {}, ["--nats-url", "nats://n", "--pool", "p", "--bundle", "b", "--machine-profile", "m"]
    )
    assert (settings.pool, settings.bundle, settings.machine_profile) == ("p", "b", "m")


def test_flag_value_goes_through_the_same_validation() -> None:
    assert config_error(["--pool", "a.b"]).startswith("SIE_POOL (--pool)")


def test_unknown_flag_is_a_config_error() -> None:
    assert "unrecognized arguments" in config_error(["--no-such-flag", "1"])


@pytest.mark.parametrize("flag", ["--max-deliver", "--nats-user", "--nats-password", "--nak-delay-s"])
def test_env_only_variables_have_no_flag(flag: str) -> None:
    with pytest.raises(ConfigError):
        build([flag, "1"])


def test_abbreviated_flags_are_refused() -> None:
    with pytest.raises(ConfigError):
        build(["--machine", "x"])


def test_from_sources_with_a_run_subparser_namespace() -> None:
    parser = argparse.ArgumentParser(prog="sie-sidecar")
    commands = parser.add_subparsers(dest="command", required=True)
    add_run_arguments(commands.add_parser("run"))
    namespace = parser.parse_args(["run", "--bundle", "sglang", "--gpu-count", "2"])
    settings = Settings.from_sources(env_with(SIE_BUNDLE="default"), namespace)
    assert (settings.bundle, settings.gpu_count) == ("sglang", 2)


def test_from_sources_without_namespace_reads_env_only() -> None:
    assert Settings.from_sources(env_with(SIE_POOL="p2")).pool == "p2"
    assert Settings.from_sources(env_with(SIE_POOL="p3"), argparse.Namespace(unrelated=1)).pool == "p3"


def test_parser_defaults_are_all_none() -> None:
    namespace = build_run_parser().parse_args([])
    assert all(getattr(namespace, spec.dest) is None for spec in RUN_FLAGS)


# --------------------------------------------------------------------------------------- startup errors

STARTUP_ERRORS: list[tuple[dict[str, str | None], str]] = [
    ({"SIE_SIDECAR_INGEST": "kafka"}, "SIE_SIDECAR_INGEST (--sidecar-ingest): expected nats or local, got 'kafka'"),
    ({"SIE_NATS_URL": None}, "SIE_NATS_URL (--nats-url): not set (required when SIE_SIDECAR_INGEST is nats)"),
    (
        {"SIE_SIDECAR_INGEST": "local"},
        "SIE_SIDECAR_LOCAL_SOCKET (--sidecar-local-socket): not set (required when SIE_SIDECAR_INGEST is local)",
    ),
    ({"SIE_NATS_USER": "u"}, "SIE_NATS_USER and SIE_NATS_PASSWORD must be set together"),
    ({"SIE_POOL": None}, "SIE_POOL (--pool): not set (required)"),
    ({"SIE_BUNDLE": "  "}, "SIE_BUNDLE (--bundle): lane token must not be empty"),
    (
        {"SIE_MACHINE_PROFILE": "l4.spot"},
        "SIE_MACHINE_PROFILE (--machine-profile): lane token 'l4.spot' must not contain '.', '*', '>' or whitespace",
    ),
    ({"SIE_IPC_SOCKET_PATHS": "/a,/a"}, "SIE_IPC_SOCKET_PATHS (--ipc-socket-paths): duplicate socket path '/a'"),
    ({"SIE_WORKER_LIVENESS_BUDGET_S": "0"}, "SIE_WORKER_LIVENESS_BUDGET_S (--worker-liveness-budget-s): must be > 0"),
    (
        {"SIE_WORKER_LIVENESS_BUDGET_S": "900"},
        "SIE_WORKER_LIVENESS_BUDGET_S (--worker-liveness-budget-s): must be greater than SIE_MODEL_READY_TIMEOUT_S"
        " (900 >= 900)",
    ),
    (
        {"SIE_WORKER_PROBE_PORT": "65536"},
        "SIE_WORKER_PROBE_PORT (--worker-probe-port): port 65536 is out of range 1..65535",
    ),
    ({"SIE_GPU_COUNT": "two"}, "SIE_GPU_COUNT (--gpu-count): expected a non-negative integer, got 'two'"),
    (
        {"SIE_POOL_ADMISSION_PAUSE_S": "1s"},
        "SIE_POOL_ADMISSION_PAUSE_S (--pool-admission-pause-s): expected a number, got '1s'",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), STARTUP_ERRORS, ids=[m.split(" ")[0] for _, m in STARTUP_ERRORS])
def test_startup_error_message(overrides: dict[str, str | None], message: str) -> None:
    text = config_error(**overrides)
    assert text == message
    assert "\n" not in text


# ---------------------------------------------------------------------------------------------- secrets


def secret_settings() -> Settings:
    return Settings.from_env(
        env_with(
            **SECRETS, SIE_GATEWAY_URL="https://gwuser:gw-pass-0xF00D@gw:443/api", SIE_CONFIG_SERVICE_URL="http://cfg"
        )
    )


def test_repr_hides_secrets() -> None:
    text = repr(secret_settings())
    for value in [*SECRET_VALUES, "gw-pass-0xF00D"]:
        assert value not in text
    assert REDACTED in text
    assert "nats://<redacted>@nats.internal:4222" in text


def test_str_hides_secrets() -> None:
    text = f"{secret_settings()}"
    assert not any(value in text for value in SECRET_VALUES)


def test_redacted_replaces_secrets() -> None:
    out = secret_settings().redacted()
    for key in ("gateway_api_key", "admin_token", "config_service_token", "nats_password"):
        assert out[key] == REDACTED
    assert out["nats_url"] == "nats://<redacted>@nats.internal:4222"
    assert out["gateway_url"] == "https://<redacted>@gw:443/api"
    assert out["nats_user"] == "worker"
    assert out["pool"] == "default"
    text = json.dumps(out)
    assert not any(value in text for value in [*SECRET_VALUES, "gw-pass-0xF00D"])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("oss://AKID:s3cretKey@bucket/p", "oss://<redacted>@bucket/p"),
        ("s3://AKID:s3cretKey@bucket", "s3://<redacted>@bucket"),
        ("abfss://container@account.dfs.core.windows.net/p", "abfss://container@account.dfs.core.windows.net/p"),
        ("/data/payloads", "/data/payloads"),
    ],
)
def test_the_payload_store_url_is_logged_without_credentials(url: str, shown: str) -> None:
    """A mistaken `oss://key:secret@bucket` is refused at start-up, but the start-up line comes first."""
    assert build(SIE_PAYLOAD_STORE_URL=url).redacted()["payload_store_url"] == shown


def test_redacted_keeps_unset_secrets_visible_as_unset() -> None:
    out = build().redacted()
    assert out["gateway_api_key"] is None
    assert out["admin_token"] is None


def test_redacted_covers_every_setting() -> None:
    assert set(build().redacted()) == {f.name for f in dataclasses.fields(Settings) if f.init} - {"warnings"}


def test_payload_store_at_sign_is_not_userinfo() -> None:
    url = "abfss://container@account.dfs.core.windows.net/prefix"
    assert build(SIE_PAYLOAD_STORE_URL=url).redacted()["payload_store_url"] == url


def test_help_never_shows_secret_values() -> None:
    parser = argparse.ArgumentParser(prog="sie-sidecar run")
    add_run_arguments(parser)
    text = " ".join(parser.format_help().split())  # undo argparse's line wrapping
    assert not any(value in text for value in SECRET_VALUES)
    for spec in RUN_FLAGS:
        assert (spec.env in text) is (spec.env not in NOT_YET_FLAGS)
    assert "default 9095" in text
    secret = [spec for spec in RUN_FLAGS if spec.secret]
    assert {spec.env for spec in secret} == {"SIE_GATEWAY_API_KEY", "SIE_ADMIN_TOKEN", "SIE_CONFIG_SERVICE_TOKEN"}
    for spec in secret:  # hidden until their features work, and even then without a default or value
        assert help_text(spec) == f"{spec.help} (env {spec.env}; secret)"


def test_help_offers_only_what_works_and_points_to_the_env_only_tuning() -> None:
    parser = argparse.ArgumentParser(prog="sie-sidecar run")
    add_run_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "--sidecar-ingest" in text and "--sidecar-local-socket" in text  # local ingest has landed
    assert "--gateway-url" in text and "--pool-admission-enabled" in text  # pool admission has landed
    assert "--config-service-url" in text and "--nats-config-trusted-producers" in text  # live config too
    assert "--ipc-socket-paths" in text  # and several backend children
    assert "gs://" not in text and "oss://" not in text and "s3://" in text
    assert "docs/operations.md" in text and "SIE_NAK_DELAY_S" in text
    assert parser.parse_args(["--sidecar-ingest", "local"]).sidecar_ingest == "local"


def test_help_after_parsing_secret_flags_still_hides_them() -> None:
    parser = argparse.ArgumentParser(prog="sie-sidecar run")
    add_run_arguments(parser)
    parser.parse_args(["--gateway-api-key", "gw-key-0xDEADBEEF", "--admin-token", "admin-token-0xC0FFEE"])
    text = parser.format_help()
    assert "gw-key-0xDEADBEEF" not in text
    assert "admin-token-0xC0FFEE" not in text


def test_errors_do_not_echo_secrets() -> None:
    message = config_error(**SECRETS, SIE_POOL="bad.pool")
    assert not any(value in message for value in SECRET_VALUES)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://user:pass@host:4222", "nats://<redacted>@host:4222"),
        ("nats://token@host:4222", "nats://<redacted>@host:4222"),
        ("nats://host:4222", "nats://host:4222"),
        ("nats://a:b@h1:4222,nats://h2:4222", "nats://<redacted>@h1:4222,nats://h2:4222"),
        ("user:pass@host:4222", "<redacted>@host:4222"),
        ("nats://host:4222/path@x", "nats://host:4222/path@x"),
        ("http://u:p@h/x?y=a@b", "http://<redacted>@h/x?y=a@b"),
        ("nats://u:p@ss@host", "nats://<redacted>@host"),
        ("", ""),
    ],
)
def test_redact_url_userinfo(url: str, expected: str) -> None:
    assert redact_url_userinfo(url) == expected


_USERINFO = st.text(st.characters(codec="ascii", exclude_characters="@/?#,", exclude_categories=["Cc"]), max_size=12)


@given(user=_USERINFO, password=_USERINFO, host=st.sampled_from(["h", "nats.svc", "10.0.0.1:4222"]))
def test_redact_url_userinfo_never_leaks_the_password(user: str, password: str, host: str) -> None:
    secret = f"S3CR3T{password}"
    out = redact_url_userinfo(f"nats://{user}:{secret}@{host}")
    assert secret not in out
    assert out == f"nats://<redacted>@{host}"


def test_equality_ignores_warnings() -> None:
    assert build(SIE_MAX_DELIVER="0") == build()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (2.0, 15.0, 50.0)),
        ({"SIE_ADAPTIVE_MIN_QUANTUM_MS": "4", "SIE_ADAPTIVE_MAX_QUANTUM_MS": "30"}, (4.0, 30.0, 50.0)),
        ({"SIE_ADAPTIVE_MIN_QUANTUM_MS": "20", "SIE_ADAPTIVE_MAX_QUANTUM_MS": "10"}, (20.0, 20.0, 50.0)),
        ({"SIE_ADAPTIVE_MIN_QUANTUM_MS": "3", "SIE_ADAPTIVE_MAX_QUANTUM_MS": "1"}, (3.0, 15.0, 50.0)),
        ({"SIE_ADAPTIVE_MIN_QUANTUM_MS": "0"}, (2.0, 15.0, 50.0)),
        ({"SIE_ADAPTIVE_TARGET_P50_MS": "inf"}, (2.0, 15.0, 50.0)),
        ({"SIE_ADAPTIVE_TARGET_P50_MS": "nan"}, (2.0, 15.0, 50.0)),
        ({"SIE_ADAPTIVE_TARGET_P50_MS": "12.5"}, (2.0, 15.0, 12.5)),
    ],
)
def test_quantum_controller_settings(env: dict[str, str], expected: tuple[float, float, float]) -> None:
    """Scheduler-and-prep §4.8: ceiling below the floor -> max(15, floor); non-finite target refused."""
    s = build(**env)
    assert (s.adaptive_min_quantum_ms, s.adaptive_max_quantum_ms, s.adaptive_target_p50_ms) == expected


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("off", False), ("No", False), ("1", True), ("", True)])
def test_idle_bypass_flag(value: str, expected: bool) -> None:
    assert build(SIE_BATCHER_IDLE_BYPASS_ENABLED=value).batcher_idle_bypass_enabled is expected


@pytest.mark.parametrize(
    ("value", "expected"), [("0", False), ("OFF", False), ("false", False), ("1", True), ("", True)]
)
def test_jit_dispatch_flag(value: str, expected: bool) -> None:
    """Our extension: just-in-time dispatch is on unless switched off like the idle bypass."""
    assert build(SIE_BATCHER_JIT_DISPATCH_ENABLED=value).batcher_jit_dispatch_enabled is expected


def test_queue_ms_in_quantum_samples_is_opt_in() -> None:
    assert build(SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS="YES").pull_quantum_include_queue_ms is True
    assert build(SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS="0").pull_quantum_include_queue_ms is False
    assert "SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS" in config_error(SIE_PULL_QUANTUM_INCLUDE_QUEUE_MS="2")


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        ({"SIE_BATCHER_MAX_BATCH_REQUESTS": "64"}, "batcher_max_batch_requests", 64),
        ({"SIE_BATCHER_MAX_BATCH_REQUESTS": "0"}, "batcher_max_batch_requests", 12),
        ({"SIE_BATCHER_MAX_BATCH_COST": "720000"}, "batcher_max_batch_cost", 720000),
        ({"SIE_BATCHER_MAX_BATCH_WAIT_MS": "inf"}, "batcher_max_batch_wait_ms", 15.0),
        ({"SIE_BATCHER_MAX_BATCH_WAIT_MS": "2.5"}, "batcher_max_batch_wait_ms", 2.5),
        ({"SIE_BATCHER_COALESCE_MS": "abc"}, "batcher_coalesce_ms", 5.0),
        ({"SIE_BATCHER_COALESCE_RATIO": "0.2"}, "batcher_coalesce_ratio", 0.2),
    ],
)
def test_batcher_settings(env: dict[str, str], field: str, expected: object) -> None:
    """§1.2: static batch-former config; unparsable or non-finite values are ignored with a warning."""
    s = build(**env)
    assert getattr(s, field) == expected
    if expected in (12, 15.0, 5.0) and env:
        assert any(next(iter(env)) in w for w in s.warnings)


def test_adaptive_batch_overrides_and_the_controller_trace_are_carried() -> None:
    s = build(
        SIE_ADAPTIVE_BATCH_MIN_WAIT_MS="5", SIE_ADAPTIVE_BATCH_MAX_COST="9000", SIE_SIDECAR_CONTROLLER_TRACE="/tmp/t"
    )
    assert s.adaptive_batch_env == (("SIE_ADAPTIVE_BATCH_MAX_COST", "9000"), ("SIE_ADAPTIVE_BATCH_MIN_WAIT_MS", "5"))
    assert s.controller_trace_dir == "/tmp/t"


def test_a_valid_batch_cost_pins_every_model() -> None:
    assert build(SIE_BATCHER_MAX_BATCH_COST="8192").batcher_cost_pinned is True
    assert build(SIE_BATCHER_MAX_BATCH_COST="lots").batcher_cost_pinned is False  # ignored with a warning


def test_count_cap_and_pull_ahead_are_pinned_only_by_a_valid_value() -> None:
    """Unset (or ignored as malformed), they are derived from the backend's batch budget."""
    assert build().batcher_requests_pinned is False and build().pull_outstanding_pinned is False
    assert build(SIE_BATCHER_MAX_BATCH_REQUESTS="12").batcher_requests_pinned is True
    assert build(SIE_BATCHER_MAX_BATCH_REQUESTS="many").batcher_requests_pinned is False
    assert build(SIE_PULL_LOOP_MAX_OUTSTANDING="64").pull_outstanding_pinned is True
    assert build(SIE_PULL_LOOP_MAX_OUTSTANDING="0").pull_outstanding_pinned is False  # > 0 required


def test_derived_pull_ahead_holds_the_in_flight_batches_within_the_bounds() -> None:
    limits = build().concurrency  # 64 outstanding, 4 pulled batches in handling
    assert limits.pull_outstanding_for(64, 1000) == 256
    assert limits.pull_outstanding_for(12, 1000) == 64  # never below the configured default
    assert limits.pull_outstanding_for(512, 1000) == 1000  # the server delivers no more than max_ack_pending
    assert limits.pull_outstanding_for(4096, 100_000) == config.MAX_DERIVED_OUTSTANDING


def test_the_steady_state_gc_freezes_start_up_and_collects_young_objects_less_often() -> None:
    import gc

    from sie_sidecar.runtime import gc as runtime_gc

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        runtime_gc.tune_gc_for_steady_state()
        assert gc.get_threshold() == (runtime_gc.GC_GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("value", "on", "peers"),
    [
        (None, True, "loopback"),  # on by default, so `sie-sidecar top` works as installed
        ("", True, "loopback"),
        ("loopback", True, "loopback"),
        (" LoopBack ", True, "loopback"),
        ("1", True, "loopback"),  # the on words keep meaning on, now loopback only
        ("true", True, "loopback"),
        ("yes", True, "loopback"),
        ("ON", True, "loopback"),
        ("all", True, "all"),
        ("ALL", True, "all"),
        ("off", False, "loopback"),
        ("0", False, "loopback"),
        ("false", False, "loopback"),
        ("no", False, "loopback"),
    ],
)
def test_the_debug_endpoint_is_loopback_unless_opened_or_off(value: str | None, on: bool, peers: str) -> None:
    settings = build() if value is None else build(SIE_SIDECAR_DEBUG_ENDPOINT=value)
    assert (settings.debug_endpoint, settings.debug_endpoint_peers) == (on, peers)


@pytest.mark.parametrize("word", ["maybe", "any", "local", "everyone", "2"])
def test_an_unknown_debug_endpoint_word_is_refused_by_name(word: str) -> None:
    assert config_error(SIE_SIDECAR_DEBUG_ENDPOINT=word) == (
        "SIE_SIDECAR_DEBUG_ENDPOINT: expected loopback (or 1, true, yes or on), all, or off (or 0, false or no), "
        f"got {word!r}"
    )
