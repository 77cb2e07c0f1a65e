# SPDX-License-Identifier: Apache-2.0
"""The NATS names of one worker's lane (sidecar-behaviour §1.3, §2): streams, durables, filters and
subjects, derived from the lane tokens and the worker id by the wire core's name functions.

One value, so that callers ask the wire for a name instead of each keeping a copy of the rule
(`Settings.names` is the lane of the running sidecar).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import (
    health_subject,
    pool_durable_filter,
    pool_durable_name,
    pool_stream_name,
    pool_stream_subjects,
    worker_consumer_name,
    worker_direct_filter,
    worker_stream_name,
)


@dataclass(frozen=True, slots=True)
class LaneNames:
    """The names of the lane `pool` / `machine_profile` / `bundle` as seen by `worker_id`."""

    pool: str
    machine_profile: str
    bundle: str
    worker_id: str

    @property
    def pool_stream_name(self) -> str:
        return pool_stream_name(self.pool)

    @property
    def pool_stream_subjects(self) -> list[str]:
        return pool_stream_subjects(self.pool)

    @property
    def pool_durable_name(self) -> str:
        return pool_durable_name(self.pool, self.machine_profile, self.bundle)

    @property
    def pool_durable_filter(self) -> str:
        return pool_durable_filter(self.pool, self.machine_profile, self.bundle)

    @property
    def worker_stream_name(self) -> str:
        return worker_stream_name(self.worker_id)

    @property
    def worker_consumer_name(self) -> str:
        return worker_consumer_name(self.worker_id)

    @property
    def worker_direct_filter(self) -> str:
        return worker_direct_filter(self.pool, self.machine_profile, self.bundle, self.worker_id)

    @property
    def worker_stream_subjects(self) -> list[str]:
        """The worker-direct stream carries exactly its consumer's filter (TV-S4)."""
        return [self.worker_direct_filter]

    @property
    def health_subject(self) -> str:
        return health_subject(self.worker_id)

    @property
    def config_subject(self) -> str:
        """Live config deltas for this bundle (§2.4)."""
        return f"sie.config.models.{self.bundle}"


__all__ = ["LaneNames"]
