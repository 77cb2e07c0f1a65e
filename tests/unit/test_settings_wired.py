# SPDX-License-Identifier: Apache-2.0
"""Every setting is either read by the module that owns it or refused at start-up (`NOT_YET`), and
every number is held to what the server and the protocol take (`LIMITS`): no silent no-ops, no
value that passes here and fails later with a traceback."""

from __future__ import annotations

import ast
import dataclasses
import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sie_sidecar
from sie_sidecar import cli, config
from sie_sidecar.config import CHECKED_ONLY, INT64_MAX, LIMITS, NOT_YET, ConfigError, Settings

PACKAGE = Path(sie_sidecar.__file__).resolve().parent
CONFIG = Path(config.__file__).resolve().parent  # the settings package
SETTINGS_MODULE = Path(config.settings.__file__).resolve()  # where `Settings` is defined
BASE = {
    "SIE_NATS_URL": "nats://127.0.0.1:4222",
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "l4",
    "HOSTNAME": "pod-0",
}
#: The settings; fields derived from them at construction (`dispatch`) are not settings of their own.
FIELDS = [f.name for f in dataclasses.fields(Settings) if f.init]
DERIVED = {f.name for f in dataclasses.fields(Settings) if not f.init}
REFUSED = {name: env for name, env in NOT_YET}


def _attributes_read(path: Path) -> set[str]:
    return {node.attr for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)}


def _self_attributes(node: ast.AST) -> set[str]:
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def _read_outside_config() -> set[str]:
    """Attribute names read anywhere in the package but the config package, plus the fields behind
    each `Settings` property read there (`settings.nats_servers` reads `nats_url`) and behind each
    derived field read there (`settings.dispatch` reads what `__post_init__` and what it calls read),
    to a fixed point."""
    outside: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if CONFIG not in path.parents:
            outside |= _attributes_read(path)
    tree = ast.parse(SETTINGS_MODULE.read_text())
    settings_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    methods = {n.name: n for n in settings_class.body if isinstance(n, ast.FunctionDef)}
    # Properties and the private helpers they (or `__post_init__`) call; public methods such as
    # `unsupported` are checks, not reads.
    behind = {
        name: _self_attributes(node)
        for name, node in methods.items()
        if (name.startswith("_") and not name.startswith("__"))
        or any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
    }
    for name in DERIVED:
        behind[name] = _self_attributes(methods["__post_init__"])
    while True:
        grown = outside | {attr for name in outside & set(behind) for attr in behind[name]}
        if grown == outside:
            return outside
        outside = grown


READ = _read_outside_config()


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_is_read_or_refused(name: str) -> None:
    """A field nobody reads must be in NOT_YET (refused when set) or CHECKED_ONLY (its whole effect is
    a start-up check); a refused field that something reads has landed and must leave NOT_YET."""
    if name in REFUSED:
        assert name not in READ, f"{name} is read outside the config package: remove it from NOT_YET"
    elif name in CHECKED_ONLY:
        assert name not in READ
    else:
        assert name in READ, f"Settings.{name} is read nowhere: wire it or add it to NOT_YET"


#: A value that differs from the default, for each refused variable (none since work deadlines landed).
NOT_DEFAULT: dict[str, str] = {}
#: The same variables at their defaults: accepted (a harmless carried value is not refused).
AT_DEFAULT: dict[str, str] = {}


def test_the_refusal_table_covers_every_refused_variable() -> None:
    assert set(NOT_DEFAULT) == set(REFUSED.values())


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str]
) -> tuple[int, str]:
    """`sie-sidecar run` in-process; the sidecar itself is replaced by a stub that reports being reached
    (exit code 99), so only the refusal in front of it is under test."""
    for key in [k for k in os.environ if k.startswith("SIE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    async def reached(settings: Settings) -> int:
        return 99

    monkeypatch.setattr("sie_sidecar.runtime.run", reached)
    monkeypatch.setattr("sie_sidecar.logs.configure_logging", lambda *a, **k: None)
    code = cli.main(["run"])
    return code, capsys.readouterr().err


def test_a_setting_this_build_lacks_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal path, with a table entry of the test's own (nothing is refused today)."""
    monkeypatch.setattr(config.settings, "NOT_YET", (("nats_ack_confirm_s", "SIE_NATS_ACK_CONFIRM_S"),))
    code, err = run_cli(monkeypatch, capsys, {**BASE, "SIE_NATS_ACK_CONFIRM_S": "7"})
    assert code == 2
    assert err.splitlines() == ["sie-sidecar: SIE_NATS_ACK_CONFIRM_S is not supported yet"]  # no value shown
    assert run_cli(monkeypatch, capsys, {**BASE, "SIE_NATS_ACK_CONFIRM_S": "2"})[0] == 99  # its default: accepted


def test_nothing_is_refused_any_more() -> None:
    """Work deadlines and Azure stores landed: no setting and no store scheme is refused."""
    assert NOT_YET == ()
    assert frozenset() == config.STORES_NOT_YET


def test_work_deadline_settings_are_taken_not_refused() -> None:
    """§15.3 landed: enforcement, skew and budget are read (and capped), never refused."""
    s = Settings.from_env(
        {
            **BASE,
            "SIE_WORK_DEADLINE_ENFORCE": "on",
            "SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS": "90000",
            "SIE_WORK_DEADLINE_MAX_BUDGET_S": "100000",
        }
    )
    s.require_supported()
    assert s.work_deadline_enforce is True
    assert s.work_deadline_skew_tolerance_ms == 60_000
    # 24 h, and the tombstone horizon (max(1800, 30 x 20) = 1800 s here) is lower still.
    assert s.work_deadline_max_budget_s == 1800.0
    assert any("SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS=90000 capped at 60000" in w for w in s.warnings)
    long_lived = Settings.from_env({**BASE, "SIE_STREAM_MAX_AGE_S": "200000", "SIE_WORK_DEADLINE_MAX_BUDGET_S": "1e5"})
    assert long_lived.work_deadline_max_budget_s == 86_400.0


@pytest.mark.parametrize(("value", "enforce"), [("yes", True), ("off", False), ("maybe", None)])
def test_an_unrecognised_enforcement_value_is_off_with_a_warning(value: str, enforce: bool | None) -> None:
    """The name is the spec-coverage row's; since issue 32 an unrecognised word is refused at start-up
    (exit 2, like every boolean's) instead of being off with a warning."""
    if enforce is None:
        with pytest.raises(ConfigError, match=r"^SIE_WORK_DEADLINE_ENFORCE: expected"):
            Settings.from_env({**BASE, "SIE_WORK_DEADLINE_ENFORCE": value})
        return
    s = Settings.from_env({**BASE, "SIE_WORK_DEADLINE_ENFORCE": value})
    assert s.work_deadline_enforce is enforce
    assert not any("SIE_WORK_DEADLINE_ENFORCE" in w for w in s.warnings)


@pytest.mark.parametrize(
    ("max_age", "max_deliver", "horizon"), [(1800, 20, 1800.0), (60, 20, 600.0), (10**9, 20, 30 * 86400.0)]
)
def test_the_tombstone_horizon(max_age: int, max_deliver: int, horizon: float) -> None:
    env = {**BASE, "SIE_STREAM_MAX_AGE_S": str(max_age), "SIE_MAX_DELIVER": str(max_deliver)}
    assert Settings.from_env(env).tombstone_horizon_s == horizon


@pytest.mark.parametrize("url", [None, "", "s3://bucket/prefix", "file:///srv/payloads", "/srv/payloads"])
def test_supported_payload_stores_are_accepted(url: str | None) -> None:
    env = dict(BASE) if url is None else {**BASE, "SIE_PAYLOAD_STORE_URL": url}
    Settings.from_env(env).require_supported()


def test_the_checked_only_setting_is_checked() -> None:
    assert sorted(CHECKED_ONLY) == ["worker_liveness_budget_s"]
    with pytest.raises(ConfigError, match="SIE_WORKER_LIVENESS_BUDGET_S"):
        Settings.from_env({**BASE, "SIE_WORKER_LIVENESS_BUDGET_S": "60"})
    assert Settings.from_env({**BASE, "SIE_WORKER_LIVENESS_BUDGET_S": "901"}).worker_liveness_budget_s == 901


# ------------------------------------------------------------------------------------------------ ranges

#: Every numeric variable; `LIMITS` must name each (and nothing else).
NUMERIC = [
    "SIE_IPC_POOL_SIZE",
    "SIE_IPC_REQUEST_TIMEOUT_S",
    "SIE_MODEL_READY_TIMEOUT_S",
    "SIE_WORKER_LIVENESS_BUDGET_S",
    "SIE_POOL_ADMISSION_CHECK_INTERVAL_S",
    "SIE_POOL_ADMISSION_PAUSE_S",
    "SIE_POOL_ADMISSION_STALE_AFTER_S",
    "SIE_WORKER_PROBE_PORT",
    "SIE_WORKER_PING_INTERVAL_MS",
    "SIE_WORKER_READYZ_STALE_MULT",
    "SIE_GPU_COUNT",
    "SIE_WORKER_CONFIG_POLL_INTERVAL_MS",
    "SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS",
    "SIE_HEALTH_PUBLISH_INTERVAL_MS",
    "SIE_MAX_DELIVER",
    "SIE_MAX_ACK_PENDING",
    "SIE_STREAM_MAX_AGE_S",
    "SIE_STREAM_REPLICAS",
    "SIE_NATS_CONSUMER_RECONCILE_INTERVAL_MS",
    "SIE_NATS_FETCH_BUDGET",
    "SIE_NATS_PULL_EXPIRES_S",
    "SIE_NATS_CONNECT_TIMEOUT_S",
    "SIE_NATS_PING_INTERVAL_S",
    "SIE_NATS_MAX_OUTSTANDING_PINGS",
    "SIE_NATS_ACK_CONFIRM_S",
    "SIE_PULL_LOOP_INFLIGHT",
    "SIE_PULL_LOOP_MAX_OUTSTANDING",
    "SIE_MAX_CONCURRENT_BATCHES",
    "SIE_AUDIO_PREP_PERMITS",
    "SIE_NAK_DELAY_S",
    "SIE_SCHEDULER_DRAIN_DEADLINE_MS",
    "SIE_RUST_PIPELINE_DEPTH",
    "SIE_BATCHER_MAX_BATCH_WAIT_MS",
    "SIE_BATCHER_MAX_BATCH_COST",
    "SIE_BATCHER_MAX_BATCH_REQUESTS",
    "SIE_BATCHER_COALESCE_MS",
    "SIE_BATCHER_COALESCE_RATIO",
    "SIE_ADAPTIVE_MIN_QUANTUM_MS",
    "SIE_ADAPTIVE_MAX_QUANTUM_MS",
    "SIE_ADAPTIVE_TARGET_P50_MS",
    "SIE_GENERATE_IPC_FRAME_TIMEOUT_S",
    "SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS",
    "SIE_WORK_DEADLINE_MAX_BUDGET_S",
]
BOUNDED = [env for env in NUMERIC if math.isfinite(LIMITS[env])]
#: The smallest value that is a valid setting (below it the spec's own rule applies), and what else
#: the variable needs to be valid.
LOWEST = {
    "SIE_WORKER_PROBE_PORT": 1,
    "SIE_WORKER_LIVENESS_BUDGET_S": 2,
    # Timer periods: 0 would spin a timer loop, so it is refused.
    "SIE_WORKER_PING_INTERVAL_MS": 1,
    "SIE_HEALTH_PUBLISH_INTERVAL_MS": 1,
}
NEEDS = {"SIE_WORKER_LIVENESS_BUDGET_S": {"SIE_MODEL_READY_TIMEOUT_S": "1"}}


def test_limits_name_every_numeric_variable() -> None:
    assert set(LIMITS) == set(NUMERIC)


def test_the_reported_defect_is_a_config_error() -> None:
    """Defect 6: this passed validation and crashed at topology creation with a raw traceback."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env({**BASE, "SIE_MAX_ACK_PENDING": "99999999999999999999"})
    assert str(info.value) == "SIE_MAX_ACK_PENDING: 99999999999999999999 is out of range (at most 9223372036854775807)"


@given(env=st.sampled_from(BOUNDED), data=st.data())
def test_a_number_beyond_its_limit_is_a_config_error_naming_the_variable(env: str, data: st.DataObject) -> None:
    limit = int(LIMITS[env])
    value = data.draw(st.integers(min_value=limit + 1, max_value=max(10**30, limit * 10)))
    with pytest.raises(ConfigError) as info:
        Settings.from_env({**BASE, **NEEDS.get(env, {}), env: str(value)})
    assert str(info.value).startswith(env)
    assert "\n" not in str(info.value)


@given(env=st.sampled_from(BOUNDED), data=st.data())
def test_a_number_within_its_limit_is_accepted(env: str, data: st.DataObject) -> None:
    limit = int(LIMITS[env])
    value = data.draw(st.integers(min_value=LOWEST.get(env, 0), max_value=limit) | st.just(limit))
    Settings.from_env({**BASE, **NEEDS.get(env, {}), env: str(value)})


@given(
    env=st.sampled_from(NUMERIC),
    value=st.text(max_size=24) | st.from_regex(r"-?[0-9]{1,40}(\.[0-9]{0,5})?(e[0-9]{1,3})?", fullmatch=True),
)
def test_any_text_is_a_setting_or_a_config_error(env: str, value: str) -> None:
    """Whatever a numeric variable holds, start-up gets Settings or a ConfigError, never another exception."""
    try:
        Settings.from_env({**BASE, env: value})
    except ConfigError as exc:
        assert str(exc).startswith(env) and "\n" not in str(exc)


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("SIE_ADAPTIVE_BATCH_MAX_WAIT_MS", "1e20"),
        ("SIE_ADAPTIVE_BATCH_MAX_COST", str(INT64_MAX + 1)),
    ],
)
def test_adaptive_overrides_beyond_their_limit_are_config_errors(env: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{env}: "):
        Settings.from_env({**BASE, env: value})


def test_adaptive_overrides_within_range_are_carried() -> None:
    s = Settings.from_env({**BASE, "SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "40", "SIE_ADAPTIVE_BATCH_MAX_COST": "x"})
    assert dict(s.adaptive_batch_env) == {"SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "40", "SIE_ADAPTIVE_BATCH_MAX_COST": "x"}


def test_derived_durations_fit_their_wire_fields() -> None:
    """The worker-direct max_age (300 s x max_deliver) and the readiness window stay valid durations."""
    top = Settings.from_env(
        {**BASE, "SIE_MAX_DELIVER": str(int(LIMITS["SIE_MAX_DELIVER"])), "SIE_STREAM_MAX_AGE_S": "1"}
    )
    assert top.worker_stream_max_age_s * 1_000_000_000 <= INT64_MAX
    window = Settings.from_env(
        {
            **BASE,
            "SIE_WORKER_PING_INTERVAL_MS": str(int(LIMITS["SIE_WORKER_PING_INTERVAL_MS"])),
            "SIE_WORKER_READYZ_STALE_MULT": str(int(LIMITS["SIE_WORKER_READYZ_STALE_MULT"])),
        }
    )
    assert window.readyz_stale_ms * 1_000_000 <= INT64_MAX


def test_the_concurrency_limits_come_from_their_variables() -> None:
    """The limits are named once; each reflects its own variable (and nothing else)."""
    env = {
        "SIE_PULL_LOOP_MAX_OUTSTANDING": "301",
        "SIE_PULL_LOOP_INFLIGHT": "7",
        "SIE_MAX_CONCURRENT_BATCHES": "5",
        "SIE_RUST_PIPELINE_DEPTH": "3",
        "SIE_IPC_POOL_SIZE": "6",
        "SIE_AUDIO_PREP_PERMITS": "2",
    }
    limits = Settings.from_env({**BASE, **env}).concurrency
    assert (
        limits.pull_outstanding,
        limits.pull_batches,
        limits.model_groups,
        limits.pipeline_depth,
        limits.ipc_connections,
        limits.audio_decodes,
    ) == (301, 7, 5, 3, 6, 2)


def test_local_ingest_reaches_the_sidecar(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """§11 has landed: `SIE_SIDECAR_INGEST=local` with a socket is no longer refused, NATS not needed."""
    env = {k: v for k, v in BASE.items() if k != "SIE_NATS_URL"}
    env |= {"SIE_SIDECAR_INGEST": "local", "SIE_SIDECAR_LOCAL_SOCKET": "/tmp/local-ingest.sock"}
    code, _ = run_cli(monkeypatch, capsys, env)
    assert code == 99


@pytest.mark.parametrize(("max_deliver", "envelope"), [(20, 600.0), (1, 30.0), (30_744_573, 30.0 * 30_744_573)])
def test_the_redelivery_envelope(max_deliver: int, envelope: float) -> None:
    """§2.3: a parked group's deadline, 30 s x max_deliver (the largest valid max_deliver stays under the cap)."""
    assert Settings.from_env({**BASE, "SIE_MAX_DELIVER": str(max_deliver)}).redelivery_envelope_s == envelope
