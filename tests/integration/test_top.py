# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar top` (issues 14 and 32) against a real sidecar over a real nats-server and backend,
with OTLP metrics off: `--once --json` counts the work done; with the defaults (no setting at all) it
shows the version, the NATS server and its reconnects, the consumer lag, the latency and the
failures; and the live view, run in a real terminal (tmux), shows the model and the columns and
refreshes while work flows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import sie_sidecar
from sie_sidecar.tools.top import COLUMNS

from .conftest import NatsServer
from .stack import MODEL, Stack, running_stack, work_item

pytestmark = pytest.mark.timeout(120)

#: The debug endpoint alone (no SIE_METRICS_ENABLED): `top` must not need an OTLP exporter. The
#: allowlist puts the model in the §13 catalog, so its points carry its name rather than `other`.
ENV = {"SIE_SIDECAR_DEBUG_ENDPOINT": "1", "SIE_METRIC_MODEL_ALLOWLIST": MODEL}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}


async def top(port: int, *extra: str) -> tuple[int, str, str]:
    """`python -m sie_sidecar top` as a subprocess; the sidecar shares this event loop, so it is
    awaited, never waited for."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sie_sidecar",
        "top",
        "--probe-port",
        str(port),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**_env(), "COLUMNS": "250"},  # the text view is cut to the terminal's width, 80 without one
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def top_json(port: int, interval: str = "0.5") -> dict[str, Any]:
    code, out, err = await top(port, "--once", "--json", "--interval", interval)
    assert code == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc


@contextlib.asynccontextmanager
async def flowing(stack: Stack) -> AsyncIterator[list[str]]:
    """Work published continuously (about 100 items/s) until the block ends, then answered."""
    sent: list[str] = []
    stop = asyncio.Event()

    async def publish() -> None:
        while not stop.is_set():
            sent.append(await stack.publish(work_item(text=f"t{len(sent)}")))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(publish())
    try:
        yield sent
    finally:
        stop.set()
        await task
    await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in sent), timeout=30)


async def test_once_json_counts_the_work_done(nats_server: NatsServer, tmp_path: Path) -> None:
    """Counts run from the first read of the state (recording starts there, telemetry/switch.py)."""
    async with running_stack(nats_server, tmp_path, env=ENV) as stack:
        port = stack.settings.worker_probe_port
        before = await stack.publish(work_item(text="before anyone watched"))
        await stack.wait_for(lambda: len(stack.results_for(before)) == 1)
        await top_json(port, "0.1")  # the first read turns recording on
        batches_before = stack.adapter.batches
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(40)]
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
        idle = await top_json(port)
        backend_batches = stack.adapter.batches - batches_before
        assert idle["worker_id"] == stack.settings.worker_id and idle["telemetry"] is True
        model = idle["models"][MODEL]
        assert (model["items"], model["batches"]) == (40, backend_batches)
        assert (idle["totals"]["items"], idle["totals"]["batches"]) == (40, backend_batches)
        assert model["items_per_s"] == 0 and model["mean_batch_size"] is None  # nothing in the interval
        assert model["queue_depth"] == 0 and idle["naks"]["count"] == 0
        async with flowing(stack):
            busy = await top_json(port)
        model = busy["models"][MODEL]
        assert model["items_per_s"] > 0 and model["batches_per_s"] > 0 and model["mean_batch_size"] >= 1
        assert model["items"] > 40 and model["cost_fill"] > 0
        ipc = busy["ipc"]  # recorded with metrics off: the debug endpoint turns the IPC timing on
        assert ipc["requests_per_s"] > 0 and 0 < ipc["p50_ms"] <= ipc["p99_ms"]
        after = (await top_json(port, "0.1"))["models"][MODEL]  # every item since the first read counted
        assert (after["items"], after["batches"]) == (len(stack.replies) - 1, stack.adapter.batches - batches_before)


async def test_with_the_debug_endpoint_off_top_says_how_to_turn_it_on(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path, env={"SIE_SIDECAR_DEBUG_ENDPOINT": "off"}) as stack:
        code, out, err = await top(stack.settings.worker_probe_port, "--once", "--json", "--interval", "0.1")
    assert (code, out) == (1, "")
    assert "404" in err and "SIE_SIDECAR_DEBUG_ENDPOINT=off; unset it" in err


async def test_with_the_defaults_top_shows_the_operator_view(nats_server: NatsServer, tmp_path: Path) -> None:
    """No SIE_SIDECAR_DEBUG_ENDPOINT at all: `top` works, and shows the version, ready, the NATS
    server with 0 reconnects, the pool's lag (0 once all is answered) with its age, the latency of
    the interval's work and no failures; after a nats-server restart, 1 reconnect."""
    env = {"SIE_METRIC_MODEL_ALLOWLIST": MODEL, "SIE_STREAM_STORAGE": "file"}
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        port = stack.settings.worker_probe_port
        async with flowing(stack):
            busy = await top_json(port)
        assert busy["version"] == sie_sidecar.__version__ and busy["ready"] is True
        assert busy["not_ready_reason"] is None
        assert busy["nats"] | {"last_error": None} == {
            "server": nats_server.url,
            "connected": True,
            "reconnects": 0,
            "failures": 0,
            "last_error": None,
            "disconnected_s": None,
        }
        latency = busy["latency"]
        assert latency["item_age_p50_le_s"] is not None and latency["batch_total_p50_ms"] > 0
        assert latency["batch_total_p50_ms"] <= latency["batch_total_p99_ms"]
        assert set(busy["lag"]) == {"pool", "worker"}
        await stack.settled_pool()
        calm = await top_json(port)
        assert calm["lag"]["pool"]["num_pending"] == (await stack.pool_consumer()).num_pending == 0
        assert calm["lag"]["pool"]["age_s"] is not None and calm["lag"]["pool"]["error"] is None
        assert calm["failures"] == {
            "naks": {},
            "nats_errors": {},
            "ipc": {},
            "publish": {},
            "payload": {},
            "deadline_dropped": 0,
        }

        await nats_server.restart()
        await stack.wait_for(lambda: stack.nc.is_connected, timeout=20)
        for _ in range(100):
            code, out, err = await top(port, "--once", "--interval", "0.1")
            assert code == 0, err
            if f"NATS {nats_server.url}  connected  reconnects 1" in out:
                break
        lines = out.splitlines()
        assert f"version {sie_sidecar.__version__}" in lines[0] and "  ready  " in lines[0]
        assert lines[1].startswith(f"NATS {nats_server.url}  connected  reconnects 1  last error: ")
        # An ACK in flight when the server went down stays pending there until ack_wait: count-agnostic.
        assert re.match(r"lag \(JetStream num_pending\)  pool \d+ \(\d+ un-ACKed, [\d.]+ s ago\)", lines[2]), lines[2]
        assert any(line.startswith("item age at dispatch p50 ") for line in lines)
        assert any(line.startswith("failures since start: ") for line in lines)


class Tmux:
    """A private tmux server (its own socket name) holding one session; killed at the end."""

    def __init__(self) -> None:
        self.server = f"sie-top-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.session = "top"

    async def __call__(self, *args: str, check: bool = True) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "tmux",
            "-L",
            self.server,
            "-f",
            "/dev/null",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=_env(),
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode is not None
        if check:
            assert proc.returncode == 0, out.decode()
        return proc.returncode, out.decode()

    async def screen(self) -> str:
        return (await self("capture-pane", "-p", "-t", self.session))[1]

    async def screen_until(self, predicate: Callable[[str], bool], timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = await self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never matched; last capture:\n{screen}")
            await asyncio.sleep(0.1)


def total_items(screen: str) -> int | None:
    """The ITEMS column (the last) of the TOTAL row, when the table is on the screen."""
    row = next((line for line in screen.splitlines() if line.startswith("TOTAL ")), None)
    return None if row is None else int(row.split()[-1].replace(",", ""))


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
async def test_the_live_view_in_a_real_terminal(nats_server: NatsServer, tmp_path: Path) -> None:
    tmux = Tmux()
    async with running_stack(nats_server, tmp_path, env=ENV) as stack:
        port = stack.settings.worker_probe_port
        command = f"{sys.executable} -m sie_sidecar top --probe-port {port}"
        try:
            await tmux("new-session", "-d", "-s", tmux.session, "-x", "160", "-y", "40", command)
            async with flowing(stack):
                first = await tmux.screen_until(lambda s: total_items(s) is not None and MODEL in s)
                header = next(line for line in first.splitlines() if line.startswith("MODEL"))
                assert all(column in header for column in COLUMNS), header
                assert stack.settings.worker_id in first and "IPC round trip" in first
                seen = total_items(first)
                # A refresh: the count moves on while work flows (each redraw reads the sidecar again).
                later = await tmux.screen_until(lambda s: (total_items(s) or 0) > (seen or 0))
                model_row = next(line for line in later.splitlines() if line.startswith(MODEL))
                assert float(model_row.split()[1].replace(",", "")) > 0  # items/s of the model
            await tmux("send-keys", "-t", tmux.session, "q")
            deadline = time.monotonic() + 10
            while (await tmux("has-session", "-t", tmux.session, check=False))[0] == 0:
                assert time.monotonic() < deadline, "q did not quit the view"
                await asyncio.sleep(0.1)
        finally:
            await tmux("kill-server", check=False)
