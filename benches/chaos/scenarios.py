# SPDX-License-Identifier: Apache-2.0
"""The rig (cluster + pods + gateway) and each fault as a function.

A scenario's `inject(rig, mark)` runs once, at `fault_at` of the load's schedule: it marks the fault
(`mark(label, "fault")`), does it, undoes it when the fault has an end, and marks the faulted part back
(`mark(label, "restored")`). `run_scenario` drives the load around it, waits until every item is settled
(or the settle timeout), and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client

from sie_sidecar.bus.topology import TopologySpec
from sie_sidecar.tools.localhost import free_port

from .cluster import NatsCluster, Node, stream_counts, stream_message_ids
from .count import ACK_WAIT_S, Count, Mark, count
from .load import Gateway, Ledger, measure_capacity
from .pods import BUNDLE, POOL, PROFILE, BackendShape, Pod, worker_id

PODS = 3
STALL_S = ACK_WAIT_S + 30.0  # settling gives up once nothing was answered this long
TAIL_MIN_S = 4.0  # the figures after a fault need at least this much load after it
TAIL_MIN_ITEMS = 1000
Marker = Callable[[str, str], None]


class Rig:
    """A fresh cluster, three pods and the gateway, in `workdir`.

    The gateway stand-in is connected to the last node (`gateway_node`), and no fault hits that node:
    replies are NATS Core messages (at most once), so a gateway whose own server dies loses the
    replies in flight, which no sidecar can prevent, and would mix the gateway's failure into each
    node scenario. The node faults hit `target` (n0), with the leaders placed first (`place`)."""

    def __init__(
        self, workdir: Path, shape: BackendShape, sidecar_env: dict[str, str], sidecar_argv: list[str] | None = None
    ) -> None:
        self.workdir = workdir
        self.shape = shape
        self.cluster = NatsCluster(workdir)
        self.specs = [TopologySpec(POOL, PROFILE, BUNDLE, worker_id(i)) for i in range(PODS)]
        self.pods = [
            Pod(
                i,
                workdir,
                self.cluster.urls,
                probe_port=free_port(),
                shape=shape,
                sidecar_env=sidecar_env,
                sidecar_argv=sidecar_argv,
            )
            for i in range(PODS)
        ]
        self.gateway_node = self.cluster.nodes[-1]
        self.target = self.cluster.nodes[0]
        others = [n.url for n in self.cluster.nodes if n is not self.gateway_node]
        self.gateway = Gateway([self.gateway_node.url, *others], "chaosgw")
        self.admin: Client | None = None
        self.marks: list[Mark] = []

    @property
    def pool_stream(self) -> str:
        return self.specs[0].pool_stream

    @property
    def pool_durable(self) -> str:
        return self.specs[0].pool_durable

    @property
    def pool_filter(self) -> str:
        return self.specs[0].pool_filter

    def mark(self, label: str, kind: str = "event") -> None:
        self.marks.append(Mark(self.gateway.now(), label, kind))

    async def start(self) -> None:
        await self.cluster.start()
        self.admin = await nats.connect(
            servers=self.cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.25, error_cb=_quiet
        )
        await self.cluster.wait_jetstream(self.admin)
        await self.cluster.create_streams(self.admin, self.specs)
        for pod in self.pods:
            await pod.start_backend()
        for pod in self.pods:
            await pod.start_sidecar(wait=False)
        for pod in self.pods:
            await pod.wait_ready()
        await self.gateway.connect()
        self.mark("connections: " + ", ".join(f"{p.sidecar.name} -> {self.connected_node(p)}" for p in self.pods))

    def connected_node(self, pod: Pod) -> str:
        """The node a sidecar last logged `NATS connected` (or `NATS reconnected`) to."""
        names = {n.url: n.name for n in self.cluster.nodes}
        found = "?"
        try:
            for line in pod.sidecar.log.read_text(errors="replace").splitlines():
                if '"msg":"NATS connected"' in line or '"msg":"NATS reconnected"' in line:
                    for url, name in names.items():
                        if url in line:
                            found = name
        except OSError:
            pass
        return found

    def sidecars_on(self, node: Node) -> list[Pod]:
        return [pod for pod in self.pods if self.connected_node(pod) == node.name]

    async def place(self, mark: Marker, *, stream_on: Node, durable_on: Node) -> None:
        """Move the pool stream's and the durable's leaders to the given nodes and mark where they are."""
        assert self.admin is not None
        where = await self.cluster.place(
            self.admin, self.pool_stream, self.pool_durable, stream_on=stream_on, durable_on=durable_on
        )
        wanted = (stream_on.name, durable_on.name)
        note = "" if where == wanted else f" (asked for {wanted[0]} / {wanted[1]})"
        mark(f"leaders: stream {where[0]}, durable {where[1]}{note}", "event")

    async def stop(self) -> None:
        await self.gateway.close()
        if self.admin is not None:
            with contextlib.suppress(Exception):
                await self.admin.close()
        for pod in self.pods:
            pod.stop()
        self.cluster.stop()

    async def stream_state(self) -> dict[str, int | None]:
        assert self.admin is not None
        return await stream_counts(self.admin.jetstream(timeout=2), self.pool_stream, self.pool_durable)


async def _quiet(exc: Exception) -> None:
    """The admin connection's errors (EOF from a killed node): it reconnects, nothing to report."""


# --- the faults -----------------------------------------------------------------------------------------------------


async def _none(rig: Rig, mark: Marker) -> None:
    return None


async def kill_sidecar(rig: Rig, mark: Marker) -> None:
    pod = rig.pods[0]
    pod.kill_sidecar()
    mark(f"kill -9 {pod.sidecar.name}", "fault")
    await asyncio.sleep(2.0)
    await pod.start_sidecar()
    mark(f"{pod.sidecar.name} restarted and ready", "restored")


async def kill_backend(rig: Rig, mark: Marker) -> None:
    pod = rig.pods[0]
    pod.kill_backend()
    mark(f"kill -9 {pod.backend.name}", "fault")
    await asyncio.sleep(2.0)
    await pod.start_backend()
    mark(f"{pod.backend.name} restarted", "restored")
    await pod.wait_ready()


async def backend_graceful_restart(rig: Rig, mark: Marker) -> None:
    pod = rig.pods[0]
    mark(f"{pod.backend.name} graceful restart (drain, exit, start)", "fault")
    exited = await pod.graceful_backend_restart()
    mark(f"{pod.backend.name} back (old one drained {exited:.1f} s)", "restored")


def _other(rig: Rig, *not_these: Node) -> Node:
    return next(n for n in rig.cluster.nodes if n not in not_these)


async def _kill_node(rig: Rig, mark: Marker, node: Node, what: str) -> None:
    """kill -9 of `node`, started again 5 s later, until the pool stream's replicas are current."""
    assert rig.admin is not None
    mark(f"sidecars on {node.name}: {', '.join(p.sidecar.name for p in rig.sidecars_on(node)) or 'none'}", "event")
    rig.cluster.kill(node)
    mark(f"kill -9 nats {node.name} ({what})", "fault")
    with contextlib.suppress(RuntimeError):
        new = await rig.cluster.stream_leader(rig.admin, rig.pool_stream, timeout_s=20.0)
        durable = await rig.cluster.consumer_leader(rig.admin, rig.pool_stream, rig.pool_durable)
        mark(f"stream leader {new.name}, durable leader {durable}", "event")
    await asyncio.sleep(5.0)
    await rig.cluster.restart(node)
    mark(f"nats {node.name} restarted", "event")
    current = await rig.cluster.wait_replicas_current(rig.admin, rig.pool_stream)
    mark(f"nats {node.name} {'caught up' if current else 'NOT caught up within 30 s'}", "restored")


async def place_stream_leader(rig: Rig, mark: Marker) -> None:
    await rig.place(mark, stream_on=rig.target, durable_on=_other(rig, rig.target, rig.gateway_node))


async def kill_stream_leader(rig: Rig, mark: Marker) -> None:
    await _kill_node(rig, mark, rig.target, f"leader of {rig.pool_stream}, not of the durable")


async def place_durable_leader(rig: Rig, mark: Marker) -> None:
    await rig.place(mark, stream_on=_other(rig, rig.target, rig.gateway_node), durable_on=rig.target)


async def kill_durable_leader(rig: Rig, mark: Marker) -> None:
    await _kill_node(rig, mark, rig.target, f"leader of the durable {rig.pool_durable}, not of the stream")


async def place_away_from_target(rig: Rig, mark: Marker) -> None:
    leader = _other(rig, rig.target, rig.gateway_node)
    await rig.place(mark, stream_on=leader, durable_on=leader)


async def kill_follower(rig: Rig, mark: Marker) -> None:
    await _kill_node(rig, mark, rig.target, "a follower: it leads neither the stream nor the durable")


async def place_both_on_target(rig: Rig, mark: Marker) -> None:
    await rig.place(mark, stream_on=rig.target, durable_on=rig.target)


async def sigstop_leader(rig: Rig, mark: Marker) -> None:
    """SIGSTOP of the node leading the stream and the durable for 10 s: a partition of one node that
    heals before any client's ping window ends (its routes and clients see silence, not a close)."""
    assert rig.admin is not None
    node = rig.target
    mark(f"sidecars on {node.name}: {', '.join(p.sidecar.name for p in rig.sidecars_on(node)) or 'none'}", "event")
    rig.cluster.pause(node)
    mark(f"SIGSTOP nats {node.name} (leader of {rig.pool_stream} and its durable) for 10 s", "fault")
    await asyncio.sleep(10.0)
    rig.cluster.resume(node)
    mark(f"SIGCONT nats {node.name}", "event")
    current = await rig.cluster.wait_replicas_current(rig.admin, rig.pool_stream)
    mark(f"nats {node.name} {'caught up' if current else 'NOT caught up within 30 s'}", "restored")


FREEZE_S = 40.0  # longer than the sidecar's ping window (5 s x (3 + 1) = 20 s by default)


async def place_away_from_sidecars(rig: Rig, mark: Marker) -> None:
    """The freeze target: the non-gateway node most sidecars are connected to; the leaders go elsewhere."""
    candidates = [n for n in rig.cluster.nodes if n is not rig.gateway_node]
    rig.target = max(candidates, key=lambda n: (len(rig.sidecars_on(n)), -n.index))
    leader = _other(rig, rig.target, rig.gateway_node)
    await rig.place(mark, stream_on=leader, durable_on=leader)


async def freeze_sidecar_node(rig: Rig, mark: Marker) -> None:
    """SIGSTOP for 40 s of a node that leads nothing but has sidecars connected: they must notice (ping
    window) and move to another node, their held items settled there."""
    assert rig.admin is not None
    node = rig.target
    pods = rig.sidecars_on(node)
    mark(f"sidecars on {node.name}: {', '.join(p.sidecar.name for p in pods) or 'none'}", "event")
    rig.cluster.pause(node)
    mark(f"SIGSTOP nats {node.name} (no leader; {len(pods)} sidecars connected) for {FREEZE_S:g} s", "fault")
    loop = asyncio.get_running_loop()
    until = loop.time() + FREEZE_S
    moved: set[str] = set()
    while loop.time() < until:
        await asyncio.sleep(0.5)
        for pod in pods:
            now_on = rig.connected_node(pod)
            if pod.sidecar.name not in moved and now_on not in ("?", node.name):
                moved.add(pod.sidecar.name)
                mark(f"{pod.sidecar.name} reconnected to {now_on}", "event")
    rig.cluster.resume(node)
    mark(f"SIGCONT nats {node.name} ({len(moved)} of {len(pods)} sidecars had moved)", "event")
    current = await rig.cluster.wait_replicas_current(rig.admin, rig.pool_stream)
    mark(f"nats {node.name} {'caught up' if current else 'NOT caught up within 30 s'}", "restored")


async def backend_stall(rig: Rig, mark: Marker) -> None:
    pod = rig.pods[0]
    stall = ACK_WAIT_S + 5.0
    pod.backend.signal(19)  # SIGSTOP: the socket stays open, nothing answers
    mark(f"SIGSTOP {pod.backend.name} for {stall:g} s (> ack_wait {ACK_WAIT_S:g} s)", "fault")
    await asyncio.sleep(stall)
    pod.backend.signal(18)  # SIGCONT
    mark(f"SIGCONT {pod.backend.name}", "restored")


async def backend_batch_hang(rig: Rig, mark: Marker) -> None:
    """Batches hang past ack_wait while the backend's heartbeat answers (SIGUSR2 to the chaos backend):
    the sidecar sees a ready backend and slow batches, so only its progress ACKs keep what it holds."""
    pod = rig.pods[0]
    hang = rig.shape.hang_s
    pod.hang_backend_batches()
    mark(f"{pod.backend.name}: batches hang {hang:g} s (> ack_wait {ACK_WAIT_S:g} s), heartbeat answers", "fault")
    await asyncio.sleep(hang)
    mark(f"{pod.backend.name}: batches run again", "restored")


async def rolling_restart(rig: Rig, mark: Marker) -> None:
    """A rolling restart of the pods, as Kubernetes does it: SIGTERM to the sidecar (which drains and
    sends the backend `Drain`) and to the backend, both started again, the next pod once it is ready."""
    mark("rolling SIGTERM restart of all pods (sidecar, then backend)", "fault")
    for pod in rig.pods:
        code = await pod.terminate_sidecar()
        mark(f"{pod.sidecar.name} exited {code} after SIGTERM", "event")
        pod.backend.stop()
        await pod.start_backend()
        await pod.start_sidecar()
        mark(f"pod {pod.index} ready again", "event")
    mark("all pods restarted", "restored")


async def rolling_sidecar_restart(rig: Rig, mark: Marker) -> None:
    """SIGTERM and restart of each sidecar alone, the backends left running (and drained: the sidecar's
    shutdown sends them `Drain`, and a new sidecar does not pull from a draining backend, as
    docs/operations.md "Shutdown" says). Shows what that leaves behind."""
    mark("rolling SIGTERM restart of the sidecars only", "fault")
    for pod in rig.pods:
        code = await pod.terminate_sidecar()
        mark(f"{pod.sidecar.name} exited {code} after SIGTERM", "event")
        await pod.start_sidecar()
        mark(f"{pod.sidecar.name} ready again (/readyz)", "event")
    mark("all sidecars restarted", "restored")


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    inject: Callable[[Rig, Marker], Awaitable[None]]
    fault_at: float = 0.3  # fraction of the load's schedule
    prepare: Callable[[Rig, Marker], Awaitable[None]] = _none  # before the load (leader placement)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "no fault: the clean path (no duplicate allowed)", _none),
        Scenario("kill_sidecar", "kill -9 of one sidecar, restarted 2 s later", kill_sidecar),
        Scenario("kill_backend", "kill -9 of one backend, restarted 2 s later", kill_backend),
        Scenario(
            "backend_graceful_restart",
            "one backend drains (refuses batches) for 5 s, exits, starts again",
            backend_graceful_restart,
        ),
        Scenario(
            "kill_stream_leader",
            "kill -9 of the pool stream leader's nats-server (not the durable's), restarted 5 s later",
            kill_stream_leader,
            fault_at=0.15,
            prepare=place_stream_leader,
        ),
        Scenario(
            "kill_durable_leader",
            "kill -9 of the durable's leader's nats-server (not the stream's), restarted 5 s later",
            kill_durable_leader,
            fault_at=0.15,
            prepare=place_durable_leader,
        ),
        Scenario(
            "kill_follower",
            "kill -9 of a nats-server leading neither stream nor durable, restarted 5 s later",
            kill_follower,
            fault_at=0.15,
            prepare=place_away_from_target,
        ),
        Scenario(
            "sigstop_leader",
            "SIGSTOP of the node leading the stream and the durable for 10 s",
            sigstop_leader,
            fault_at=0.15,
            prepare=place_both_on_target,
        ),
        Scenario(
            "freeze_sidecar_node",
            "SIGSTOP for 40 s (> the ping window) of a node with sidecars and no leader",
            freeze_sidecar_node,
            fault_at=0.15,
            prepare=place_away_from_sidecars,
        ),
        Scenario("backend_stall", "one backend stalls (SIGSTOP) for ack_wait + 5 s", backend_stall, fault_at=0.1),
        Scenario(
            "backend_batch_hang",
            "one backend's batches hang for ack_wait + 5 s, its heartbeat answering",
            backend_batch_hang,
            fault_at=0.1,
        ),
        Scenario("rolling_restart", "SIGTERM and restart of each pod in turn", rolling_restart, fault_at=0.15),
        Scenario(
            "rolling_sidecar_restart",
            "SIGTERM and restart of each sidecar alone (backends left drained)",
            rolling_sidecar_restart,
            fault_at=0.15,
        ),
    )
}


@dataclass
class Outcome:
    scenario: str
    what: str
    items: int
    rate: float
    capacity: float
    count: Count
    tail: Count | None  # the tail load's count, when the load ended before the fault did
    marks: list[Mark]
    publish_end_s: float
    settled: bool
    wall_s: float
    stream_end: dict[str, int | None]
    unconfirmed_publishes: int
    client_errors: list[str]
    process_notes: list[str] = field(default_factory=list)


async def run_scenario(
    rig: Rig, scenario: Scenario, *, items: int, rate: float | None, capacity_items: int, settle_timeout_s: float
) -> Outcome:
    began = time.monotonic()
    await scenario.prepare(rig, rig.mark)
    capacity = await measure_capacity(rig.gateway, capacity_items)
    rig.mark(f"capacity {capacity:,.0f} items/s", "event")
    rate = rate if rate else 0.7 * capacity
    ledger = rig.gateway.ledger(f"s{scenario.name.replace('_', '')}", items)
    duration = items / rate
    start = rig.gateway.now()
    rig.mark(f"load {items:,} items at {rate:,.0f}/s", "event")
    fault_at = start + scenario.fault_at * duration

    async def inject() -> None:
        await asyncio.sleep(max(0.0, fault_at - rig.gateway.now()))
        await scenario.inject(rig, rig.mark)

    injector = asyncio.create_task(inject())
    publish_end = await rig.gateway.publish_open_loop(ledger, rate)
    rig.mark("last publish", "event")
    try:
        await asyncio.wait_for(injector, timeout=180.0)
    except TimeoutError:
        rig.mark("fault injector timed out", "event")
    ledgers = [ledger]
    tail_end = publish_end
    restored = [m.t for m in rig.marks if m.kind == "restored"]
    if restored and publish_end < max(restored) + 1.0 + TAIL_MIN_S:
        # The load ended before the fault did (or just after): the figures after the fault come from a
        # tail load at the same rate, published once the faulted part is back.
        tail_items = max(TAIL_MIN_ITEMS, round(TAIL_MIN_S * rate))
        tail = rig.gateway.ledger(f"t{scenario.name.replace('_', '')}", tail_items)
        await asyncio.sleep(max(0.0, max(restored) + 1.0 - rig.gateway.now()))
        rig.mark(f"tail load {tail_items:,} items at {rate:,.0f}/s", "event")
        tail_end = await rig.gateway.publish_open_loop(tail, rate)
        rig.mark("last tail publish", "event")
        ledgers.append(tail)
    settled = await _settle(rig, ledgers, settle_timeout_s)
    rig.mark("settled" if settled else "settle timeout", "event")
    state = await rig.stream_state()
    in_stream: set[str] = set()
    if any(lg.answered < lg.count for lg in ledgers) and rig.admin is not None:
        in_stream = set(await stream_message_ids(rig.admin, rig.pool_stream, rig.pool_filter))
    result = count(ledger, rig.marks, in_stream, _gave_up(rig, ledger), publish_end)
    tail_count = None
    if len(ledgers) > 1:
        tail_count = count(ledgers[1], [], in_stream, _gave_up(rig, ledgers[1]), tail_end, drain_rate=True)
        tail_count.windows[0].name = "after (tail)"
    for lg in ledgers:
        _write_ledger(rig.workdir / f"ledger-{lg.prefix}.json", lg, rig.marks)
    notes = _process_notes(rig)
    return Outcome(
        scenario=scenario.name,
        what=scenario.what,
        items=items,
        rate=rate,
        capacity=capacity,
        count=result,
        tail=tail_count,
        marks=list(rig.marks),
        publish_end_s=publish_end,
        settled=settled,
        wall_s=time.monotonic() - began,
        stream_end=state,
        unconfirmed_publishes=rig.gateway.unconfirmed,
        client_errors=rig.gateway.client_errors[:20],
        process_notes=notes,
    )


async def _settle(rig: Rig, ledgers: list[Ledger], timeout_s: float) -> bool:
    """Until every item is answered and the stream and the durable are empty (nothing left that could
    still be redelivered), then one more second for stragglers; False at the timeout, or once nothing
    was answered for STALL_S while items are missing."""
    deadline = time.monotonic() + timeout_s

    def answered() -> int:
        return sum(lg.answered for lg in ledgers)

    total = sum(lg.count for lg in ledgers)
    seen, progress_at = answered(), time.monotonic()
    while time.monotonic() < deadline:
        if answered() != seen:
            seen, progress_at = answered(), time.monotonic()
        elif time.monotonic() - progress_at > STALL_S:
            return False  # nothing answered for longer than any redelivery takes: stuck
        if seen == total:
            state = await rig.stream_state()
            if state["messages"] == 0 and state["num_ack_pending"] == 0 and state["num_pending"] == 0:
                await asyncio.sleep(1.0)
                return True
        await asyncio.sleep(0.5)
    return False


def _gave_up(rig: Rig, ledger: Ledger) -> set[int]:
    return {i for prefix, i in rig.gateway.gave_up if prefix == ledger.prefix}


def _write_ledger(path: Path, ledger: Ledger, marks: list[Mark]) -> None:
    """Every item's first publish, publish attempts, PubAck and answers, with the marks: enough to
    recount a scenario, or to look at one item, after the rig is gone."""
    items = [
        [ledger.work_item_id(i), ledger.publish_t[i], ledger.publishes[i], ledger.acked[i], ledger.answers[i]]
        for i in range(ledger.count)
    ]
    doc = {"marks": [[m.t, m.kind, m.label] for m in marks], "items": items}
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def _process_notes(rig: Rig) -> list[str]:
    """Processes that died without being told to, and error/Traceback lines in the sidecar logs."""
    notes: list[str] = []
    for pod in rig.pods:
        for proc in (pod.sidecar, pod.backend):
            if proc.popen is not None and not proc.alive:
                notes.append(f"{proc.name} not running at the end (exit {proc.returncode})")
        try:
            text = pod.sidecar.log.read_text(errors="replace")
        except OSError:
            continue
        bad = [
            line
            for line in text.splitlines()
            if '"level": "error"' in line or '"level":"error"' in line or "Traceback" in line
        ]
        if bad:
            notes.append(f"{pod.sidecar.name}: {len(bad)} error/Traceback log lines, first: {bad[0][:300]}")
    for node in rig.cluster.nodes:
        if not node.proc.alive:
            notes.append(f"{node.proc.name} not running at the end (exit {node.proc.returncode})")
    return notes


__all__ = ["SCENARIOS", "Outcome", "Rig", "Scenario", "run_scenario"]
