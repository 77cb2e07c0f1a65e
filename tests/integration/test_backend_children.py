# SPDX-License-Identifier: Apache-2.0
"""Several backend children (`SIE_IPC_SOCKET_PATHS`, sidecar-behaviour §9.5, §10): models placed on
the child that holds them, a child killed and restarted mid-load, GPU slots in the health beat, and
the config fan-out with its quarantine. Real nats-server, real reference-backend processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sie_sidecar.backend.config_registry import registry_hash
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer, encode_response
from sie_sidecar.errors import IpcTimeout, IpcTransportError
from sie_sidecar.ipc.children import BackendChildren, merge
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.ipc.types import ConfigResponse, PingResponse

from .config_service import running_config_service
from .conftest import NatsServer
from .stack import MODEL, running_stack, work_item
from .test_failures import backend_process, wait_socket
from .test_ipc import RawServer, request_id_of
from .test_live_config import DEBUG_ENV, debug, live, notify

pytestmark = pytest.mark.timeout(120)

OTHER = "org/model-b"


@contextlib.contextmanager
def reaped(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.parametrize(("children", "mux"), [(2, "0"), (3, "1")])
async def test_children_serve_while_one_is_killed_and_restarted(
    nats_server: NatsServer, tmp_path: Path, children: int, mux: str
) -> None:
    """Child 0 holds MODEL, child 1 holds OTHER. Under load child 0 is SIGKILLed, then restarted on
    the same socket: MODEL moves to a live child, every item is answered exactly once, and the
    health beat counts the slots down and up again. Over the pooled transport, and the mux."""
    socks = [str(tmp_path / f"child-{n}.sock") for n in range(children)]
    models = [MODEL, OTHER] + [f"org/spare-{n}" for n in range(children - 2)]
    procs = [backend_process(sock, "--preload", model) for sock, model in zip(socks, models, strict=True)]
    with reaped(procs):
        for sock, proc in zip(socks, procs, strict=True):
            await wait_socket(sock, proc)
        env = DEBUG_ENV | {
            "SIE_IPC_SOCKET_PATHS": ",".join(socks),
            "SIE_HEALTH_PUBLISH_INTERVAL_MS": "200",
            "SIE_IPC_MUX": mux,
        }
        async with running_stack(nats_server, tmp_path, external_backend=socks[0], env=env) as stack:
            beats: list[dict[str, Any]] = []

            async def on_beat(msg: Any) -> None:
                beats.append(json.loads(msg.data))

            await stack.nc.subscribe("sie.health.w-test", cb=on_beat)
            await stack.wait_for(lambda: any(b["ready_gpu_slots"] == children for b in beats))
            warm = [await stack.publish(work_item(model=m, text="warm")) for m in (MODEL, OTHER)]
            await stack.wait_for(lambda: all(stack.results_for(w) for w in warm))
            placement = (await debug(stack))["placement"]
            assert placement == {MODEL: 0, OTHER: 1}

            ids: list[str] = []
            for n in range(120):
                ids.append(await stack.publish(work_item(model=models[n % 2], text=f"t{n}")))
                if n == 40:
                    os.kill(procs[0].pid, signal.SIGKILL)
                    await asyncio.get_running_loop().run_in_executor(None, procs[0].wait, 10)
                    await stack.wait_for(lambda: any(b["ready_gpu_slots"] == children - 1 for b in beats))
                if n == 80:
                    Path(socks[0]).unlink(missing_ok=True)
                    procs.append(backend_process(socks[0], "--preload", MODEL))
                    await wait_socket(socks[0], procs[-1])
                await asyncio.sleep(0.005)
            await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids), timeout=60)
            assert all(stack.results_for(i)[0]["success"] for i in ids)
            await stack.wait_for(lambda: beats[-1]["ready_gpu_slots"] == children)
            assert {b["total_gpu_slots"] for b in beats} == {children}
            await stack.settled_pool()
            await asyncio.sleep(0.3)
            assert all(len(stack.results_for(i)) == 1 for i in ids)


async def test_config_fans_out_to_every_child_and_a_split_quarantines_the_pool(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A write goes to all three children. When one answers another hash, the merge is not applied:
    the pool is quarantined (no batch runs on any child, /readyz is 503) until the reconciler's
    export brings every child to the same configs."""
    adapters = [NullAdapter(dim=8, preloaded_models=[MODEL]) for _ in range(3)]
    socks = [str(tmp_path / f"c{n}.sock") for n in range(3)]
    servers = [
        BackendServer(a, s, worker_id=f"child-{n}") for n, (a, s) in enumerate(zip(adapters, socks, strict=True))
    ]
    for server in servers:
        await server.start()
    try:
        async with running_config_service() as service:
            service.fail_status = 503
            env = DEBUG_ENV | {
                "SIE_IPC_SOCKET_PATHS": ",".join(socks),
                "SIE_CONFIG_SERVICE_URL": service.url,
                "SIE_WORKER_CONFIG_POLL_INTERVAL_MS": "60000",
            }
            async with running_stack(nats_server, tmp_path, external_backend=socks[0], env=env) as stack:
                a = "sie_id: org/a"
                service.write("org/a", a)
                assert await notify(stack, service.notification("org/a")) == "applied"
                assert [x.configs.configs for x in adapters] == [{"org/a": a}] * 3
                state = await live(stack)
                assert state["bundle_config_hash"] == registry_hash("default", {"org/a": a})
                # Child 2 drifted (it holds a config nobody sent): the next write splits the pool.
                adapters[2].configs.configs["org/stray"] = "sie_id: org/stray"
                service.write("org/b", "sie_id: org/b")
                assert await notify(stack, service.notification("org/b")) == "apply_rejected"
                before = [x.items for x in adapters]
                pinned = await stack.publish(work_item(text="pinned", bundle_config_hash=service.bundle_hash()))
                legacy = await stack.publish(work_item(text="legacy"))
                await asyncio.sleep(1.0)
                assert [x.items for x in adapters] == before  # quarantined: nothing executes anywhere
                status, body = await stack.readyz()
                assert status == 503, body
                assert not stack.results_for(legacy)
                service.fail_status = None  # the reconciler (woken by the split) repairs every child
                await stack.wait_for(lambda: bool(stack.results_for(pinned) and stack.results_for(legacy)), timeout=20)
                assert len({json.dumps(x.configs.configs, sort_keys=True) for x in adapters}) == 1
                assert stack.results_for(pinned)[0]["executed_bundle_config_hash"] == service.bundle_hash()
                assert (await debug(stack))["live_config"]["last_outcome"]["export"] == "applied"
    finally:
        for server in servers:
            await server.close()


async def test_generate_cancel_goes_to_every_child_and_matches_if_any_did(tmp_path: Path) -> None:
    """§9.5: SignalGenerateCancel to every child; a child that is gone does not stop the others."""
    socks = [str(tmp_path / f"g{n}.sock") for n in range(3)]
    matched = {"value": True}

    def respond(_: int, body: bytes) -> list[bytes]:
        return [encode_response(request_id_of(body), True, {"matched": matched["value"]}, None)]

    real = BackendServer(NullAdapter(dim=8), socks[0], worker_id="real")
    await real.start()
    children = BackendChildren([IpcClient(s, request_timeout_s=2) for s in socks])  # socks[2]: nobody there
    try:
        async with RawServer(socks[1], respond) as raw:
            assert await children.signal_generate_cancel("req-7") is True
            matched["value"] = False
            assert await children.signal_generate_cancel("req-7") is False
            assert len(raw.requests) == 2
        assert real.method_calls["SignalGenerateCancel"] == 2
    finally:
        await children.close()
        await real.close()


def answer(
    applied: bool = True, config_hash: str = "h", version: int = 1, models: tuple[str, ...] = ()
) -> ConfigResponse:
    return ConfigResponse(
        applied=applied, bundle_config_hash=config_hash, config_version=version, applied_models=models
    )


def test_the_fan_out_merge() -> None:
    """§9.5: applied only if every child applied with agreeing non-empty hashes (and, for a replace,
    the same applied models); the version is the maximum."""
    assert merge([answer(version=2), answer(version=5)], replace=False) == answer(version=5)
    assert merge([answer(), answer(config_hash="")], replace=False).applied  # empty hashes do not disagree
    assert not merge([answer(), answer(config_hash="other")], replace=False).applied
    assert not merge([answer(), answer(applied=False)], replace=False).applied
    assert merge([answer(models=("a",)), answer(models=("a",))], replace=True).applied
    assert not merge([answer(models=("a",)), answer(models=("a", "b"))], replace=True).applied


def test_placement_prefers_the_holding_child_then_the_least_placed_ready_one(tmp_path: Path) -> None:
    children = BackendChildren([IpcClient(str(tmp_path / f"p{n}.sock")) for n in range(3)])
    children.observe(0, PingResponse(ready=True, loaded_models=("a",)))
    children.observe(1, PingResponse(ready=True, loaded_models=("b",)))
    children.observe(2, PingResponse(ready=False))
    assert children._choose("b") == 1 and children._choose("a") == 0
    children._placed.update({"a": 0, "c": 0})
    assert children._choose("new") == 1  # child 2 is not ready; child 1 has the fewest models
    children.observe(0, IpcTransportError("gone"))
    assert children.placement() == {}  # a child that cannot be reached loses its placements
    children._placed["x"] = 1
    children.observe(1, IpcTimeout("slow"))
    assert children.placement() == {"x": 1}  # a slow one keeps them


def test_placement_weighs_models_then_pending_cost_items_and_batches_in_flight(tmp_path: Path) -> None:
    """scheduler-and-prep §5: a new model goes to the child minimising (unready while some child is
    ready, models placed, pending cost, pending items, batches in flight, index)."""
    children = BackendChildren([IpcClient(str(tmp_path / f"q{n}.sock")) for n in range(3)])
    for i in range(3):
        children.observe(i, PingResponse(ready=True))
    pressure = {"a": (100, 4), "b": (10, 9), "c": (10, 2)}
    children.pressure = lambda model: pressure.get(model, (0, 0))
    children._placed.update({"a": 0, "b": 1, "c": 2})  # one model each: the tie goes to pending work
    assert children._choose("new") == 2  # cost 10 like child 1, but fewer items
    pressure["c"] = (10, 9)
    children._inflight[1] = 2
    assert children._choose("new") == 2  # all else equal: fewer batches in flight
    children._inflight[2] = 3
    assert children._choose("new") == 1
    pressure["a"] = (0, 0)
    assert children._choose("new") == 0  # the least pending cost first
    children.observe(0, PingResponse(ready=False))
    assert children._choose("new") == 1  # an unready child only when none is ready
    children._placed["d"] = 1
    assert children._choose("new") == 2  # fewer models placed comes before pending work
