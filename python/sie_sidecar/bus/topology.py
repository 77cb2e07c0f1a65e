# SPDX-License-Identifier: Apache-2.0
"""JetStream topology: get-or-create and reconcile the streams and durable consumers a worker pulls from.

Names and settings follow sidecar-behaviour §1.3 and §2. Ensuring is idempotent, so the same code serves
startup (where a failure is fatal) and the slow reconciler (where a failure is logged and retried), which is
also what recreates memory-storage streams after a nats-server restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from .. import wire
from ..config.limits import worker_stream_max_age
from ..errors import TopologyError

if TYPE_CHECKING:
    from ..config import Settings

logger = logging.getLogger(__name__)

POOL_ACK_WAIT_S = 30.0
WORKER_ACK_WAIT_S = 300.0
STREAM_MAX_MSGS = 100_000
_LIST_PAGE = 256  # the server's page size for consumer listings


@dataclass(frozen=True)
class TopologySpec:
    """The lane (pool, machine profile, bundle, worker) and the tunables of §1.2 that shape the topology."""

    pool: str
    machine_profile: str
    bundle: str
    worker_id: str
    stream_max_age_s: float = 1800.0
    max_deliver: int = 20
    max_ack_pending: int = 1000
    conservative_cleanup: bool = False
    # v0.7.1 always uses memory storage; file storage (SIE_STREAM_STORAGE, newer) is never changed in place.
    storage: js_api.StorageType = js_api.StorageType.MEMORY
    # v0.7.1 always creates one replica; SIE_STREAM_REPLICAS (newer) is created and reconciled in place.
    replicas: int = 1

    @classmethod
    def from_settings(cls, settings: Settings) -> TopologySpec:
        """The topology `sie-sidecar run` ensures for these settings (benchmarks reuse it)."""
        return cls(
            pool=settings.pool,
            machine_profile=settings.machine_profile,
            bundle=settings.bundle,
            worker_id=settings.worker_id,
            stream_max_age_s=settings.stream_max_age_s,
            max_deliver=settings.max_deliver,
            max_ack_pending=settings.max_ack_pending,
            conservative_cleanup=settings.nats_conservative_cleanup,
            storage=js_api.StorageType.FILE if settings.stream_storage == "file" else js_api.StorageType.MEMORY,
            replicas=settings.stream_replicas,
        )

    @property
    def pool_stream(self) -> str:
        return wire.pool_stream_name(self.pool)

    @property
    def pool_durable(self) -> str:
        return wire.pool_durable_name(self.pool, self.machine_profile, self.bundle)

    @property
    def pool_filter(self) -> str:
        return wire.pool_durable_filter(self.pool, self.machine_profile, self.bundle)

    @property
    def worker_stream(self) -> str:
        return wire.worker_stream_name(self.worker_id)

    @property
    def worker_consumer(self) -> str:
        return wire.worker_consumer_name(self.worker_id)

    @property
    def worker_filter(self) -> str:
        return wire.worker_direct_filter(self.pool, self.machine_profile, self.bundle, self.worker_id)

    @property
    def worker_max_age_s(self) -> float:
        """Direct work must outlive every redelivery of its consumer (300 s per delivery)."""
        return worker_stream_max_age(self.stream_max_age_s, self.max_deliver)


async def establish_topology(
    js: JetStreamContext, spec: TopologySpec, describe: Callable[[BaseException], str]
) -> None:
    """`ensure_topology` for start-up: any failure becomes one `TopologyError` line (`describe` redacts),
    and a server that does not answer the JetStream API is named as such."""
    try:
        await ensure_topology(js, spec)
    except (ServiceUnavailableError, NoRespondersError) as exc:  # nobody answers the JetStream API
        raise TopologyError(f"JetStream is not enabled on the server ({describe(exc)})") from None
    except (NatsError, TimeoutError, OSError) as exc:
        raise TopologyError(describe(exc)) from None


async def consumer_ack_wait_s(js: JetStreamContext, spec: TopologySpec) -> float:
    """The shortest ack_wait of the consumers this worker pulls from, as the server has them (an
    operator may have changed the pool durable's; ensure_topology only warns about it)."""
    waits = []
    for stream, durable, default in (
        (spec.pool_stream, spec.pool_durable, POOL_ACK_WAIT_S),
        (spec.worker_stream, spec.worker_consumer, WORKER_ACK_WAIT_S),
    ):
        try:
            info = await js.consumer_info(stream, durable)
            waits.append(float(info.config.ack_wait or default))
        except Exception as exc:  # the configured value is the best guess left
            logger.warning("consumer info unavailable", extra={"consumer": durable, "error": repr(exc)})
            waits.append(default)
    return min(waits)


async def ensure_topology(js: JetStreamContext, spec: TopologySpec) -> None:
    """Ensure the pool stream and durable, then the worker-direct stream and consumer."""
    await ensure_pool(js, spec)
    await ensure_worker_direct(js, spec)


async def ensure_pool(js: JetStreamContext, spec: TopologySpec) -> None:
    """Ensure the pool stream and the lane's pool durable (startup step that must succeed before pulling)."""
    await _ensure_stream(js, spec.pool_stream, wire.pool_stream_subjects(spec.pool), spec.stream_max_age_s, spec)
    desired = _consumer_config(spec.pool_durable, spec.pool_filter, POOL_ACK_WAIT_S, spec)
    await _ensure_consumer(js, spec.pool_stream, desired, spec, warn_settings=True)


async def ensure_worker_direct(js: JetStreamContext, spec: TopologySpec) -> None:
    """Ensure this worker's direct stream and consumer."""
    await _ensure_stream(js, spec.worker_stream, [spec.worker_filter], spec.worker_max_age_s, spec)
    desired = _consumer_config(spec.worker_consumer, spec.worker_filter, WORKER_ACK_WAIT_S, spec)
    await _ensure_consumer(js, spec.worker_stream, desired, spec, warn_settings=False)


async def reconcile_forever(js: JetStreamContext, spec: TopologySpec, interval_s: float, stop: asyncio.Event) -> None:
    """Re-ensure the topology every `interval_s` until `stop` is set; failures are logged and retried next tick.

    This is what heals a deleted durable or a memory stream lost to a server restart. `interval_s <= 0`
    disables it (the caller floors positive values per §1.2).
    """
    if interval_s <= 0:
        return
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()
        if stop.is_set():
            return
        try:
            await ensure_topology(js, spec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning(
                "topology reconcile failed",
                extra={"pool": spec.pool, "worker_id": spec.worker_id, "error": repr(exc)},
            )


def _consumer_config(name: str, filter_subject: str, ack_wait_s: float, spec: TopologySpec) -> js_api.ConsumerConfig:
    return js_api.ConsumerConfig(
        durable_name=name,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=filter_subject,
    )


async def _ensure_stream(
    js: JetStreamContext, name: str, subjects: list[str], max_age_s: float, spec: TopologySpec
) -> None:
    """Get-or-create; on an existing stream reconcile only the subject list and max_age (v0.7.1 rule)."""
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        config = js_api.StreamConfig(
            name=name,
            subjects=list(subjects),
            retention=js_api.RetentionPolicy.WORK_QUEUE,
            storage=spec.storage,
            discard=js_api.DiscardPolicy.NEW,
            max_msgs=STREAM_MAX_MSGS,
            max_age=max_age_s,
            num_replicas=spec.replicas,
        )
        try:
            await js.add_stream(config)
        except APIError as exc:
            # Another worker of the pool may have created it between our lookup and create: reconcile theirs.
            try:
                info = await js.stream_info(name)
            except NotFoundError:
                raise exc from None
        else:
            logger.info("stream created", extra={"stream": name, "subjects": subjects, "max_age_s": max_age_s})
            return
    current = info.config
    changes: dict[str, object] = {}
    if list(current.subjects or []) != list(subjects):
        changes["subjects"] = list(subjects)
    if current.max_age is None or abs(current.max_age - max_age_s) > 1e-6:
        changes["max_age"] = max_age_s
    # Newer than v0.7.1 (§2.2): the discard policy is forced to New and the replica count follows
    # SIE_STREAM_REPLICAS (JetStream moves the data; a cluster with fewer servers refuses, and the
    # error stops the start-up with the server's reason).
    if current.discard != js_api.DiscardPolicy.NEW:
        changes["discard"] = js_api.DiscardPolicy.NEW
    if (current.num_replicas or 1) != spec.replicas:
        changes["num_replicas"] = spec.replicas
    if current.storage != spec.storage:
        logger.warning(
            "stream storage differs from the configured one; not changed in place",
            extra={"stream": name, "observed": str(current.storage), "expected": str(spec.storage)},
        )
    if changes:
        await js.update_stream(current.evolve(**changes))
        logger.info(
            "stream reconciled",
            extra={"stream": name, "changed": sorted(changes), "subjects": subjects, "max_age_s": max_age_s},
        )


async def _ensure_consumer(
    js: JetStreamContext, stream: str, desired: js_api.ConsumerConfig, spec: TopologySpec, *, warn_settings: bool
) -> None:
    """Clean up stale overlapping durables, get-or-create ours, then fix its filter if it drifted."""
    name = desired.durable_name
    assert name is not None and desired.filter_subject is not None
    await _delete_stale_overlapping(js, stream, name, desired.filter_subject, spec.conservative_cleanup)
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        await js.add_consumer(stream, desired)
        logger.info("consumer created", extra={"stream": stream, "consumer": name, "filter": desired.filter_subject})
        return
    current: js_api.ConsumerConfig = info.config
    if not _filter_is_exactly(current, desired.filter_subject):
        await _update_or_recreate(js, stream, desired, current)
        return
    if warn_settings:
        mismatched = [
            field
            for field in ("max_deliver", "ack_wait", "max_ack_pending")
            if not _same(getattr(current, field), getattr(desired, field))
        ]
        if mismatched:
            logger.warning(
                "pool consumer settings differ from the configured ones; left as they are",
                extra={
                    "stream": stream,
                    "consumer": name,
                    "fields": mismatched,
                    "observed": {f: getattr(current, f) for f in mismatched},
                    "expected": {f: getattr(desired, f) for f in mismatched},
                },
            )


async def _update_or_recreate(
    js: JetStreamContext, stream: str, desired: js_api.ConsumerConfig, current: js_api.ConsumerConfig
) -> None:
    name = desired.durable_name
    assert name is not None
    observed = current.filter_subjects or current.filter_subject
    try:
        # Without an action the create API is create-or-update, so this updates the existing durable.
        await js.add_consumer(stream, desired)
        logger.info(
            "consumer filter updated",
            extra={"stream": stream, "consumer": name, "observed": observed, "filter": desired.filter_subject},
        )
    except APIError as exc:
        logger.warning(
            "consumer update failed; deleting and recreating it",
            extra={"stream": stream, "consumer": name, "observed": observed, "error": repr(exc)},
        )
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, name)
        await js.add_consumer(stream, desired)


async def _delete_stale_overlapping(
    js: JetStreamContext, stream: str, ours: str, our_filter: str, conservative: bool
) -> None:
    """Delete other consumers whose filters overlap ours: a WorkQueue stream refuses overlapping consumers.

    Listing failure skips the clean-up (the create that follows reports any real conflict).
    """
    try:
        consumers = await _list_consumers(js, stream)
    except Exception as exc:
        logger.warning("consumer listing failed; skipping stale clean-up", extra={"stream": stream, "error": repr(exc)})
        return
    for info in consumers:
        if info.name == ours:
            continue
        filters = _filters_of(info.config)
        # An unfiltered consumer takes the whole stream, so it overlaps every filter of ours.
        if filters and not any(wire.filters_overlap(f, our_filter) for f in filters):
            continue
        waiting = info.num_waiting or 0
        ack_pending = info.num_ack_pending or 0
        fields = {"stream": stream, "consumer": info.name, "filters": filters, "ours": our_filter}
        if conservative and (waiting > 0 or ack_pending > 0):
            logger.warning(
                "overlapping consumer is active; kept (conservative clean-up)",
                extra={**fields, "num_waiting": waiting, "num_ack_pending": ack_pending},
            )
            continue
        try:
            await js.delete_consumer(stream, info.name)
        except NotFoundError:
            continue
        except APIError as exc:
            logger.warning("stale consumer delete failed", extra={**fields, "error": repr(exc)})
            continue
        logger.warning("stale overlapping consumer deleted", extra=fields)


async def _list_consumers(js: JetStreamContext, stream: str) -> list[js_api.ConsumerInfo]:
    result: list[js_api.ConsumerInfo] = []
    while True:
        page = await js.consumers_info(stream, offset=len(result) or None)
        result.extend(page)
        if len(page) < _LIST_PAGE:
            return result


def _filters_of(config: js_api.ConsumerConfig) -> list[str]:
    if config.filter_subjects:
        return list(config.filter_subjects)
    if config.filter_subject:
        return [config.filter_subject]
    return []


def _filter_is_exactly(config: js_api.ConsumerConfig, ours: str) -> bool:
    """Exactly ours: primary filter equal with no multi-filters, or no primary and exactly one multi-filter equal."""
    if config.filter_subject:
        return config.filter_subject == ours and not config.filter_subjects
    return list(config.filter_subjects or []) == [ours]


def _same(observed: object, expected: object) -> bool:
    if isinstance(observed, float | int) and isinstance(expected, float | int):
        return abs(float(observed) - float(expected)) < 1e-6
    return observed == expected
