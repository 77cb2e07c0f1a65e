# SPDX-License-Identifier: Apache-2.0
"""Live config end to end (sidecar-behaviour §9): notifications published on real NATS to the real
sidecar, applied to the reference backend over its Unix socket, reconciled against a real aiohttp
config service; every §9.2 outcome, quarantine, an epoch rewind, and a config change racing batches."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sie_sidecar.backend.config_registry import registry_hash
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.control.live_config import MAX_MODEL_CONFIG_BYTES, LiveConfig
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.pipeline.config_gate import ConfigState

from .config_service import running_config_service
from .conftest import NatsServer
from .stack import MODEL, Stack, running_stack, work_item

#: A second model the backend serves: its group never holds the pinned items of MODEL.
OTHER_MODEL = "org/other-model"

pytestmark = pytest.mark.timeout(90)

SUBJECT = "sie.config.models.default"
DEBUG_ENV = {"SIE_SIDECAR_DEBUG_ENDPOINT": "1"}


async def debug(stack: Stack) -> dict[str, Any]:
    url = f"http://127.0.0.1:{stack.settings.worker_probe_port}/debug/state"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        body: dict[str, Any] = await r.json()
        return body


async def live(stack: Stack) -> dict[str, Any]:
    state: dict[str, Any] = (await debug(stack))["live_config"]
    return state


async def notify(stack: Stack, data: bytes, *, reply: str = "", headers: dict[str, str] | None = None) -> str:
    """Publish one notification and return the outcome the sidecar recorded for it."""

    def handled(state: dict[str, Any]) -> int:
        return sum(n for key, n in state["outcomes"].items() if key.startswith("notification/"))

    before = handled(await live(stack))
    await stack.nc.publish(SUBJECT, data, reply=reply, headers=headers)
    deadline = time.monotonic() + 10
    while True:
        state = await live(stack)
        if handled(state) > before:
            return str(state["last_outcome"]["notification"])
        assert time.monotonic() < deadline, "the notification was not handled"
        await asyncio.sleep(0.02)


async def unsupported_naks(stack: Stack) -> float:
    """NAKs counted with the NATS metric reason `model_unsupported` (§13), from `/debug/state`."""
    return sum(
        float(p["value"])
        for p in (await debug(stack))["telemetry"]
        if p["name"] == "sie.worker.nats.operations"
        and p["attrs"].get("operation") == "nak"
        and p["attrs"].get("reason") == "model_unsupported"
    )


def doc(**fields: Any) -> bytes:
    base: dict[str, Any] = {"producer_id": "sie-config", "bundle_id": "default", "epoch": 1, "bundle_config_hash": ""}
    return json.dumps(base | fields).encode()


def hash_of(configs: dict[str, str]) -> str:
    return registry_hash("default", configs)


async def test_every_notification_check_in_order(nats_server: NatsServer, tmp_path: Path) -> None:
    """Each §9.2 outcome from a published notification, and what it advanced (or did not)."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=DEBUG_ENV) as stack:
        a = "sie_id: org/a"
        # 12, epoch 0: the hash is set, the epoch is not touched.
        assert (
            await notify(
                stack, doc(epoch=0, model_id="org/a", model_config=a, bundle_config_hash=hash_of({"org/a": a}))
            )
            == "applied"
        )
        state = await live(stack)
        assert (state["epoch"], state["bundle_config_hash"]) == (0, hash_of({"org/a": a}))
        # 1. A reply subject or a Nats- header: dropped before parsing.
        assert await notify(stack, doc(epoch=5, model_config="x: 1"), reply="_INBOX.x") == "rejected_untrusted"
        assert (
            await notify(stack, doc(epoch=5, model_config="x: 1"), headers={"Nats-Msg-Id": "1"}) == "rejected_untrusted"
        )
        # 2. Not the §9.1 object.
        assert await notify(stack, b"{not json") == "parse_error"
        assert (
            await notify(stack, json.dumps({"producer_id": "sie-config", "bundle_id": "default"}).encode())
            == "parse_error"
        )
        assert await notify(stack, doc(epoch="7")) == "parse_error"
        assert (await live(stack))["outcomes"]["notification/unknown/parse_error"] == 3
        # 3. The allow-list: an entry, or an entry plus a pod suffix.
        assert await notify(stack, doc(producer_id="evil", epoch=5, model_config="x: 1")) == "rejected_untrusted"
        assert await notify(stack, doc(producer_id="sie-configx", epoch=5, model_config="x: 1")) == "rejected_untrusted"
        # 4. Another bundle.
        assert await notify(stack, doc(bundle_id="other", epoch=5, model_config="x: 1")) == "rejected_bundle"
        # A write from a pod of the trusted producer (alias router_id), for this pool spelt loosely.
        b = "sie_id: org/b"
        both = {"org/a": a, "org/b": b}
        note = doc(epoch=3, model_id="org/b", model_config=b, bundle_config_hash=hash_of(both), pool=" Default ")
        note_body = json.loads(note)
        note_body["router_id"] = "sie-config-7f9c"
        del note_body["producer_id"]
        assert await notify(stack, json.dumps(note_body).encode()) == "applied"
        state = await live(stack)
        assert (state["epoch"], state["bundle_config_hash"]) == (3, hash_of(both))
        # 5. Stale: older, or the same non-zero epoch.
        assert await notify(stack, doc(epoch=2, model_config="x: 1")) == "stale"
        assert await notify(stack, doc(epoch=3, model_config="x: 1")) == "stale"
        # 6. An epoch bump: the epoch rises, the hash stays.
        assert await notify(stack, doc(epoch=4, model_config="   ")) == "applied"
        state = await live(stack)
        assert (state["epoch"], state["bundle_config_hash"]) == (4, hash_of(both))
        assert state["outcomes"]["notification/epoch_bump/applied"] == 1
        # 7. Another pool.
        assert await notify(stack, doc(epoch=5, model_config="x: 1", pool="gpu-pool")) == "skipped_pool"
        # 8. (over 1 MiB) needs a NATS max_payload above the default: test_oversized_and_retried_writes.
        # 10. The backend refuses (an error) or answers applied=false: nothing advanced.
        assert await notify(stack, doc(epoch=5, model_id="org/c", model_config="invalid: true")) == "apply_error"
        assert await notify(stack, doc(epoch=5, model_id="org/c", model_config="reject: true")) == "apply_rejected"
        # 11. The backend's hash is not the control plane's: nothing advanced (quarantine).
        c = "sie_id: org/c"
        assert (
            await notify(stack, doc(epoch=5, model_id="org/c", model_config=c, bundle_config_hash="f" * 64))
            == "hash_mismatch"
        )
        state = await live(stack)
        assert (state["epoch"], state["bundle_config_hash"]) == (4, hash_of(both))
        assert state["degraded"] is True
        # The per-pool hash wins over the bundle-wide one; the backend now holds a, b and c.
        three = {"org/a": a, "org/b": b, "org/c": c}
        pools = {"default": {"default": hash_of(three)}}
        assert (
            await notify(
                stack,
                doc(
                    epoch=6,
                    model_id="org/c",
                    model_config=c,
                    bundle_config_hash="0" * 64,
                    bundle_pool_config_hashes=pools,
                ),
            )
            == "applied"
        )
        state = await live(stack)
        assert (state["epoch"], state["bundle_config_hash"], state["degraded"]) == (6, hash_of(three), False)
        assert adapter.configs.configs == three


async def test_unsupported_models_are_committed_with_the_hash_and_reach_health(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=DEBUG_ENV) as stack:
        beats: list[dict[str, Any]] = []

        async def on_beat(msg: Any) -> None:
            beats.append(json.loads(msg.data))

        await stack.nc.subscribe("sie.health.w-test", cb=on_beat)
        config = f"sie_id: {MODEL}\nunsupported: true"
        expected = hash_of({MODEL: config})
        assert await notify(stack, doc(model_id=MODEL, model_config=config, bundle_config_hash=expected)) == "applied"
        # The commit publishes a beat at once (the interval here is 1 s).
        await stack.wait_for(lambda: any(b.get("bundle_config_hash") == expected for b in beats), timeout=5)
        beat = next(b for b in beats if b.get("bundle_config_hash") == expected)
        assert beat["unsupported_models"] == [MODEL]
        # An item for that model is never executed: the group pre-check NAKs it (it comes back).
        items_before = adapter.items
        never = await stack.publish(work_item(text="never"))
        deadline = time.monotonic() + 10
        while (await stack.pool_consumer()).num_redelivered < 1:
            assert time.monotonic() < deadline, "the item was not NAKed"
            await asyncio.sleep(0.05)
        assert adapter.items == items_before and not stack.results_for(never)
        # §13 (newer than v0.7.1): those NAKs carry the reason model_unsupported.
        assert await unsupported_naks(stack) >= 1


async def test_quarantined_work_waits_until_reconciliation_succeeds(nats_server: NatsServer, tmp_path: Path) -> None:
    """A write the backend answers with another hash leaves the old hash advertised: work pinned to
    the new hash is NAKed and never executed, until the reconciler's export makes backend and control
    plane agree; then every pinned item is answered exactly once, stamped with the hash it ran under.
    Legacy work is served meanwhile: before the pinned items arrive, and beside them for another model.

    Not beside them for the same model: the group pre-check NAKs a model's whole group when any hash
    is refused (§4.2), so a legacy item fetched with pinned ones goes back with them, at the same
    delay, and may meet them again (a fetch that took all six at once, under load, failed this test)."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL, OTHER_MODEL])
    async with running_config_service() as service:
        service.write("org/a", "sie_id: org/a")  # epoch 1: the backend never hears of it
        service.fail_status = 503  # the reconciler cannot repair anything yet
        env = DEBUG_ENV | {
            "SIE_CONFIG_SERVICE_URL": service.url,
            "SIE_CONFIG_SERVICE_TOKEN": "cfg-0xBEEF",
            "SIE_WORKER_CONFIG_POLL_INTERVAL_MS": "60000",
        }
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
            service.write(MODEL, f"sie_id: {MODEL}")  # epoch 2: the control plane's hash covers both
            new_hash = service.bundle_hash()
            assert await notify(stack, service.notification(MODEL)) == "hash_mismatch"
            assert adapter.configs.bundle_config_hash != new_hash
            legacy = await stack.publish(work_item(text="legacy"))
            await stack.wait_for(lambda: len(stack.results_for(legacy)) == 1)
            ids = [await stack.publish(work_item(text=f"pinned {n}", bundle_config_hash=new_hash)) for n in range(5)]
            other = await stack.publish(work_item(model=OTHER_MODEL, text="legacy, another model"))
            await stack.wait_for(lambda: len(stack.results_for(other)) == 1)
            await asyncio.sleep(1.0)  # several NAK rounds (0.2 s here)
            assert all(not stack.results_for(i) for i in ids)
            assert adapter.items_on_wrong_hash == 0
            # The config service recovers; the reconciler (polling sooner while degraded, and woken by
            # the refusals; its period is 60 s) repairs.
            service.fail_status = None
            await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids), timeout=15)
            state = await live(stack)
            assert state["bundle_config_hash"] == new_hash and state["epoch"] == 2
            assert state["outcomes"]["export/full_export/applied"] >= 1
            for i in ids:
                assert stack.results_for(i)[0]["executed_bundle_config_hash"] == new_hash
            assert adapter.items_on_wrong_hash == 0
            await asyncio.sleep(0.5)
            assert all(len(stack.results_for(i)) == 1 for i in ids)
        auth = {header for path, header in service.requests}
        assert auth == {"Bearer cfg-0xBEEF"}


async def test_startup_export_and_epoch_rewind(nats_server: NatsServer, tmp_path: Path) -> None:
    """The start-up export installs the control plane's configs; when the control plane's epoch goes
    back (a restored database), the forced export lowers the worker's epoch too."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_config_service() as service:
        service.write("org/a", "sie_id: org/a")
        service.write("org/b", "sie_id: org/b", pool="gpu")  # another pool: not ours
        service.write("org/c", "sie_id: org/c", bundles=("other",))  # another bundle: not ours
        env = DEBUG_ENV | {"SIE_CONFIG_SERVICE_URL": service.url, "SIE_WORKER_CONFIG_POLL_INTERVAL_MS": "1000"}
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
            await stack.wait_for(lambda: adapter.configs.configs == {"org/a": "sie_id: org/a"})
            state = await live(stack)
            assert (state["epoch"], state["bundle_config_hash"]) == (3, service.bundle_hash())
            # A live write at epoch 9 the config service never recorded, then the service is at 4.
            d = "sie_id: org/d"
            assert (
                await notify(
                    stack,
                    doc(
                        epoch=9,
                        model_id="org/d",
                        model_config=d,
                        bundle_config_hash=hash_of({"org/a": "sie_id: org/a", "org/d": d}),
                    ),
                )
                == "applied"
            )
            service.write("org/e", "sie_id: org/e")  # epoch 4 < 9: a rewind
            await stack.wait_for(lambda: adapter.configs.configs == service.configs_for(), timeout=10)
            await stack.wait_for(lambda: True)
            deadline = time.monotonic() + 5
            while (await live(stack))["epoch"] != 4:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            state = await live(stack)
            assert state["bundle_config_hash"] == service.bundle_hash()
            writes = adapter.configs.writes
            # Nothing drifts any more: polls do not write.
            await asyncio.sleep(2.5)
            assert adapter.configs.writes == writes


async def test_a_config_change_never_overlaps_a_batch(nats_server: NatsServer, tmp_path: Path) -> None:
    """Writes take 0.4 s and batches 0.1 s, under steady load: the execution barrier keeps every batch
    out of every write, and each item pinned to a hash runs only while the backend holds that hash."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=0.1, config_apply_delay_s=0.4)
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=DEBUG_ENV) as stack:
        configs: dict[str, str] = {}
        published: list[str] = []
        for epoch in range(1, 4):
            for n in range(20):
                published.append(await stack.publish(work_item(text=f"e{epoch} {n}")))
            configs[f"org/m{epoch}"] = f"sie_id: org/m{epoch}"
            note = doc(
                epoch=epoch,
                model_id=f"org/m{epoch}",
                model_config=configs[f"org/m{epoch}"],
                bundle_config_hash=hash_of(configs),
            )
            assert await notify(stack, note) == "applied"
            current = hash_of(configs)
            for n in range(10):
                published.append(await stack.publish(work_item(text=f"p{epoch} {n}", bundle_config_hash=current)))
        await stack.wait_for(lambda: all(len(stack.results_for(i)) >= 1 for i in published[-10:]), timeout=30)
        assert adapter.batches_during_config_write == 0
        assert adapter.items_on_wrong_hash == 0


async def test_oversized_and_retried_writes(tmp_path: Path) -> None:
    """§9.2 step 8: a config over 1 MiB is refused before any IPC (a NATS server's default max_payload
    is 1 MiB, so LiveConfig is driven directly here). Step 9: transient IPC failures are retried until
    shutdown; then the outcome is `shutdown` and neither epoch nor hash moved. A backend that comes up
    during the retries gets the write."""
    sock = str(tmp_path / "late.sock")
    client = IpcClient(sock, request_timeout_s=2)
    state = ConfigState()
    stop = asyncio.Event()
    config = LiveConfig(state, client, bundle="default", pool="default", allow_list=("sie-config",), stop=stop)
    huge = "x: " + "y" * MAX_MODEL_CONFIG_BYTES
    assert await config.handle_notification(doc(model_id="org/h", model_config=huge)) == "rejected_oversized"
    a = "sie_id: org/a"
    task = asyncio.create_task(
        config.handle_notification(doc(model_id="org/a", model_config=a, bundle_config_hash=hash_of({"org/a": a})))
    )
    await asyncio.sleep(0.8)  # a few retries against a socket nobody listens on
    assert not task.done()
    stop.set()
    assert await asyncio.wait_for(task, 6) == "shutdown"
    assert (state.epoch, state.current) == (0, None)

    stop.clear()
    task = asyncio.create_task(
        config.handle_notification(doc(model_id="org/a", model_config=a, bundle_config_hash=hash_of({"org/a": a})))
    )
    await asyncio.sleep(0.5)
    server = BackendServer(NullAdapter(dim=8), sock, worker_id="late")
    await server.start()
    try:
        assert await asyncio.wait_for(task, 10) == "applied"
        assert (state.epoch, state.current) == (1, hash_of({"org/a": a}))
    finally:
        await client.close()
        await server.close()


async def test_a_persistent_hash_mismatch_is_not_rewritten_in_a_loop(nats_server: NatsServer, tmp_path: Path) -> None:
    """A control plane whose hash no backend can match: each export is a `hash_mismatch`, and even
    with refused items waking the reconciler every second, exports back off (1, 2, 4 s ...)."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_config_service() as service:
        service.hash_salt = "-elsewhere"
        service.write("org/a", "sie_id: org/a")
        # The default 30 s period: degraded, the epoch is polled sooner (1, 2, 4, 5 s), but exports
        # back off (1, 2, 4 ... up to the period) however often refusals wake the reconciler.
        env = DEBUG_ENV | {"SIE_CONFIG_SERVICE_URL": service.url}
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
            await stack.wait_for(lambda: adapter.configs.writes >= 1)
            started = time.monotonic()
            pinned = service.bundle_hash()
            ids = [await stack.publish(work_item(text=f"p{n}", bundle_config_hash=pinned)) for n in range(30)]
            # (each is refused at the gate every NAK round: a wake each time)
            await asyncio.sleep(6.0)
            elapsed = time.monotonic() - started
            state = await live(stack)
            assert state["outcomes"].get("export/full_export/hash_mismatch", 0) == adapter.configs.writes
            # Start-up, then at most one export per backoff step (1 + 2 + 4 s): never one per wake.
            assert adapter.configs.writes <= 4, (adapter.configs.writes, elapsed)
            assert state["bundle_config_hash"] != pinned  # never committed (Ping's may be adopted)
            assert not any(stack.results_for(i) for i in ids) and adapter.items_on_wrong_hash == 0


async def test_a_periodic_export_that_changes_nothing_sends_no_ipc(nats_server: NatsServer, tmp_path: Path) -> None:
    """§9.3 with a control plane at epoch 0: the periodic export whose signature equals the last
    successful one is `no_change`, with no IPC; a changed fingerprint exports and writes again."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_config_service() as service:
        service.write("org/a", "sie_id: org/a", bump=False)
        env = DEBUG_ENV | {
            "SIE_CONFIG_SERVICE_URL": service.url,
            "SIE_WORKER_CONFIG_POLL_INTERVAL_MS": "1000",
            "SIE_WORKER_CONFIG_FULL_EXPORT_INTERVAL_MS": "1000",
        }
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
            await stack.wait_for(lambda: adapter.configs.writes == 1)
            deadline = time.monotonic() + 10
            while (await live(stack))["outcomes"].get("export/full_export/no_change", 0) < 2:
                assert time.monotonic() < deadline, "no periodic export"
                await asyncio.sleep(0.1)
            assert adapter.configs.writes == 1
            state = await live(stack)
            assert (state["epoch"], state["bundle_config_hash"]) == (0, service.bundle_hash())
            service.write("org/b", "sie_id: org/b", bump=False)  # same epoch, new fingerprint
            await stack.wait_for(lambda: adapter.configs.configs == service.configs_for(), timeout=10)
            assert adapter.configs.writes == 2


async def test_a_restarted_backend_gets_its_config_back_before_pinned_work_runs(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The backend restarts with an empty registry (its Ping hash is ""): the control plane shows no
    drift, but the pinned work is refused on that backend (never executed against no config), the
    reconciler resyncs it from an export, and then the work runs."""
    sock = str(tmp_path / "restarting.sock")
    first = BackendServer(NullAdapter(dim=8, preloaded_models=[MODEL]), sock, worker_id="first")
    await first.start()
    fresh = NullAdapter(dim=8, preloaded_models=[MODEL])
    second: BackendServer | None = None
    try:
        async with running_config_service() as service:
            service.write(MODEL, f"sie_id: {MODEL}")
            env = DEBUG_ENV | {"SIE_CONFIG_SERVICE_URL": service.url, "SIE_WORKER_CONFIG_POLL_INTERVAL_MS": "60000"}
            async with running_stack(nats_server, tmp_path, external_backend=sock, env=env) as stack:
                pinned = service.bundle_hash()
                warm = await stack.publish(work_item(text="warm", bundle_config_hash=pinned))
                await stack.wait_for(lambda: len(stack.results_for(warm)) == 1)
                await first.close()
                Path(sock).unlink(missing_ok=True)
                second = BackendServer(fresh, sock, worker_id="second")
                await second.start()
                ids = [await stack.publish(work_item(text=f"after {n}", bundle_config_hash=pinned)) for n in range(5)]
                await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids), timeout=20)
                assert fresh.items_on_wrong_hash == 0
                assert fresh.configs.bundle_config_hash == pinned
                outcomes = (await live(stack))["outcomes"]
                assert outcomes["export/full_export/applied"] >= 2  # start-up, then the resync
    finally:
        if second is not None:
            await second.close()


async def test_a_transport_error_that_is_not_transient_is_an_apply_error(tmp_path: Path) -> None:
    """§9.2 step 9 retries only the transient kinds: a socket path the OS refuses is `apply_error`
    at once, not a retry loop holding the execution barrier until shutdown."""
    client = IpcClient(str(tmp_path / ("x" * 120) / "backend.sock"), request_timeout_s=2)
    state = ConfigState()
    config = LiveConfig(state, client, bundle="default", pool="default", allow_list=(), stop=asyncio.Event())
    a = "sie_id: org/a"
    outcome = await asyncio.wait_for(
        config.handle_notification(doc(model_id="org/a", model_config=a, bundle_config_hash=hash_of({"org/a": a}))), 5
    )
    assert outcome == "apply_error" and not state.barrier.writing
    await client.close()


async def test_a_parked_group_whose_model_becomes_unsupported_is_naked_before_its_next_probe(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.2 (newer than v0.7.1): the unsupported check runs right before each readiness probe, so a
    group parked while its model loads is NAKed (reason model_unsupported) once a committed config
    says the backend cannot serve that model, without waiting for the load."""
    adapter = NullAdapter(dim=8, load_delay_s=60.0)
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=DEBUG_ENV) as stack:
        waiting = await stack.publish(work_item(text="parked"))
        deadline = time.monotonic() + 10
        while MODEL not in adapter.loading_models():
            assert time.monotonic() < deadline, "the model never started loading"
            await asyncio.sleep(0.05)
        config = f"sie_id: {MODEL}\nunsupported: true"
        expected = hash_of({MODEL: config})
        assert await notify(stack, doc(model_id=MODEL, model_config=config, bundle_config_hash=expected)) == "applied"
        deadline = time.monotonic() + 15
        while (await stack.pool_consumer()).num_redelivered < 1:
            assert time.monotonic() < deadline, "the parked group was not NAKed"
            await asyncio.sleep(0.05)
        assert not stack.results_for(waiting) and adapter.items == 0
        assert await unsupported_naks(stack) >= 1
