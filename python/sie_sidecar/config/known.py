# SPDX-License-Identifier: Apache-2.0
"""Every `SIE_*` variable something reads, and the warning for one nothing reads.

An `SIE_*` variable that nothing reads gets one warning naming the closest known one: a misspelt name
is otherwise ignored without a word (`SIE_MAX_DELIVERY=5` serves with 20). The list is the flag
table, the `LIMITS` rows and the two lists here; tests/unit/test_config_refusals.py keeps it equal to
what the code reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from .flags import RUN_FLAGS
from .limits import LIMITS

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
#: What the env reader (`reader.py`) reads that has no flag and no `LIMITS` row.
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
#: Read outside this package: the wire switch, the payload stores, the backend, the per-model
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
