# SPDX-License-Identifier: Apache-2.0
"""The largest value each numeric setting may take, and the §7 horizons derived from settings.

A number larger than the server or the protocol can take (JetStream's int64 fields, durations that
must fit int64 nanoseconds, ports, per-process counts) is a start-up error naming the variable: it
would otherwise pass the reader and fail later with a traceback. One table, so that the reader, the
known-variable list and the tests agree on which variables are numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

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
#: The worker-direct stream keeps 300 s x max_deliver of history (§2.2), which must fit max_age.
WORKER_AGE_PER_DELIVERY_S: Final = 300
#: The most messages a derived pull-ahead keeps outstanding per consumer (an explicit
#: SIE_PULL_LOOP_MAX_OUTSTANDING may go higher).
MAX_DERIVED_OUTSTANDING = 2048


def tombstone_horizon(stream_max_age_s: int, max_deliver: int) -> float:
    """§7: how long anything about a work item can matter, max(stream max age, 30 s x max_deliver),
    at most 30 days (request tombstones, and the cap of deadline leases and budgets)."""
    return float(min(max(stream_max_age_s, REDELIVERY_S_PER_DELIVERY * max_deliver), MAX_TOMBSTONE_S))


def worker_stream_max_age(stream_max_age_s: float, max_deliver: int) -> float:
    """§2.2: direct work must outlive every redelivery, max(pool max_age, 300 s x max_deliver): the
    worker-direct stream's max_age (the topology) and the settings' view of it."""
    return float(max(stream_max_age_s, WORKER_AGE_PER_DELIVERY_S * max_deliver))


def redelivery_envelope(max_deliver: int) -> float:
    """§2.3: 30 s x max_deliver (600 s by default), capped near 30 years: a parked group's deadline."""
    return min(float(REDELIVERY_S_PER_DELIVERY * max_deliver), MAX_REDELIVERY_ENVELOPE_S)


#: The largest value each numeric variable may take; `math.inf` where any finite value is
#: meaningful. Below-range values keep the spec's treatment (error, floor or default).
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
    "SIE_MAX_DELIVER": MAX_DURATION_S // WORKER_AGE_PER_DELIVERY_S,
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
