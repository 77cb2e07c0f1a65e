# SPDX-License-Identifier: Apache-2.0
"""The chaos rig's cluster start-up (`benches.chaos.cluster.NatsCluster`) against real nats-servers: a
route port taken between `free_port` and the node's bind is found at start (the node is started again
on fresh ports), and a cluster with a dead node says so at once instead of waiting out its timeout."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import nats
import pytest
from benches.chaos.cluster import NatsCluster


@pytest.mark.parametrize(("node", "which"), [(0, "port"), (2, "cluster_port")])
async def test_a_port_taken_before_the_bind_gets_fresh_ports(tmp_path: Path, node: int, which: str) -> None:
    """Whichever of a node's ports another process holds (an outgoing connection's ephemeral port,
    or another test's listener), the node exits, and the cluster starts again on fresh ports."""
    cluster = NatsCluster(tmp_path)
    taken = getattr(cluster.nodes[node], which)
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", taken))
        thief.listen()
        try:
            await cluster.start()
            assert taken not in {getattr(n, which) for n in cluster.nodes}
            assert all(n.proc.alive for n in cluster.nodes)
            nc = await nats.connect(servers=cluster.urls)
            try:
                await cluster.wait_jetstream(nc, timeout_s=20)  # an R3 stream can be placed
            finally:
                await nc.close()
        finally:
            cluster.stop()


async def test_each_cluster_configures_its_own_name(tmp_path: Path) -> None:
    """Two clusters never share a name, so nats-server refuses a stray node of one that dials the
    other's route port (a leaked process of an earlier test whose old port a new node holds)."""
    first, second = NatsCluster(tmp_path / "a"), NatsCluster(tmp_path / "b")
    assert first.name != second.name
    for node in first.nodes:
        assert f'name: "{first.name}"' in (tmp_path / "a" / f"{node.name}.conf").read_text()


async def test_waiting_for_jetstream_with_a_dead_node_fails_at_once(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path)
    await cluster.start()
    try:
        nc = await nats.connect(servers=cluster.urls[:2])
        try:
            cluster.kill(cluster.nodes[2])
            began = time.monotonic()
            with pytest.raises(RuntimeError, match="nats-n2 exited"):
                await cluster.wait_jetstream(nc)
            assert time.monotonic() - began < 5
        finally:
            await nc.close()
    finally:
        cluster.stop()
