# SPDX-License-Identifier: Apache-2.0
"""SIE_STREAM_REPLICAS (newer than v0.7.1, sidecar-behaviour §2.2) on a real three-node JetStream
cluster on loopback (the chaos rig's `NatsCluster`): streams are created with the configured replica
count, and an existing stream's count is reconciled in place, up and down, keeping its messages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from benches.chaos.cluster import NatsCluster
from nats.aio.client import Client

from sie_sidecar.bus.topology import TopologySpec, ensure_topology

#: JetStream API timeout: a replicated stream answers once its Raft group has formed and elected,
#: which takes seconds on this shared 2-core machine under load (nats-py's default is 5 s; a scale-down
#: timed out at 10 s while a fuzz campaign ran beside it). The cluster's own time stays out of the test.
API_TIMEOUT_S = 30


def _spec(replicas: int) -> TopologySpec:
    return TopologySpec(pool="default", machine_profile="cpu", bundle="b", worker_id="pod-0", replicas=replicas)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[NatsCluster, Client]]:
    cluster = NatsCluster(tmp_path)
    await cluster.start()
    nc = await nats.connect(servers=cluster.urls)
    try:
        await cluster.wait_jetstream(nc)
        yield cluster, nc
    finally:
        await nc.close()
        cluster.stop()


async def _replicas(nc: Client, stream: str) -> int:
    return (await nc.jetstream(timeout=API_TIMEOUT_S).stream_info(stream)).config.num_replicas or 1


async def test_streams_are_created_with_the_configured_replicas(cluster: tuple[NatsCluster, Client]) -> None:
    _, cluster_nc = cluster
    spec = _spec(3)
    await ensure_topology(cluster_nc.jetstream(timeout=API_TIMEOUT_S), spec)
    assert await _replicas(cluster_nc, spec.pool_stream) == 3
    assert await _replicas(cluster_nc, spec.worker_stream) == 3


async def test_an_existing_streams_replicas_are_reconciled_in_place(cluster: tuple[NatsCluster, Client]) -> None:
    rig, cluster_nc = cluster
    js = cluster_nc.jetstream(timeout=API_TIMEOUT_S)
    await ensure_topology(js, _spec(1))
    assert await _replicas(cluster_nc, _spec(1).pool_stream) == 1
    await js.publish("sie.work.default.cpu.b.org__m", b"kept")
    await ensure_topology(js, _spec(3))
    # The new peers catch up and elect before the next change (the cluster's own time, not ours: the
    # sidecar's ensure at start-up and its periodic reconcile retry anyway).
    assert await rig.wait_replicas_current(cluster_nc, _spec(3).pool_stream)
    info = await js.stream_info(_spec(3).pool_stream)
    assert (info.config.num_replicas, info.state.messages) == (3, 1)
    await ensure_topology(js, _spec(1))
    assert await _replicas(cluster_nc, _spec(1).pool_stream) == 1
