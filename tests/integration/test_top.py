# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar top` (issue 14) against a real sidecar over a real nats-server and backend, with the
debug endpoint on and OTLP metrics off: `--once --json` counts the work done, and the live view,
run in a real terminal (tmux), shows the model and the columns and refreshes while work flows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

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
        env=_env(),
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
    async with running_stack(nats_server, tmp_path, env=ENV) as stack:
        port = stack.settings.worker_probe_port
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(40)]
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
        idle = await top_json(port)
        backend_batches = stack.adapter.batches
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
        after = (await top_json(port, "0.1"))["models"][MODEL]  # every item answered: all counted
        assert (after["items"], after["batches"]) == (len(stack.replies), stack.adapter.batches)


async def test_without_the_debug_endpoint_top_says_how_to_turn_it_on(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        code, out, err = await top(stack.settings.worker_probe_port, "--once", "--json", "--interval", "0.1")
    assert (code, out) == (1, "")
    assert "404" in err and "SIE_SIDECAR_DEBUG_ENDPOINT=1" in err


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
