# SPDX-License-Identifier: Apache-2.0
"""An accelerator out-of-memory in an adapter (wire-protocol §4.6): the backend library answers the
batch with `nak_retry` and the OOM delay (`SIE_OOM_NAK_DELAY_S`, 10 s by default) for every item it
gave the adapter, instead of failing the call; the sidecar NAKs each item with that delay. The
adapter raises a torch-style `OutOfMemoryError` (the reference backend has no GPU); everything else
is real: the server on a Unix socket, the sidecar's IPC client, the pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar.backend.adapter import OOM_NAK_DELAY_MS, is_out_of_memory, oom_nak_delay_ms
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.errors import IpcServerError
from sie_sidecar.ipc.client import IpcClient

from ..pipeline.memory import memory_pipeline
from ..pipeline.test_sequencing import _item, _msg
from .test_ipc import MODEL, payload, run_batch_body, wrapped


class OutOfMemoryError(RuntimeError):
    """As `torch.cuda.OutOfMemoryError` is: a RuntimeError of that name."""


class AcceleratorOutOfMemory(OutOfMemoryError):
    """A subclass, as `torch.OutOfMemoryError` and its CUDA alias relate in newer torch."""


class ExhaustedAdapter(NullAdapter):
    """Runs out of accelerator memory on every batch of `oom_model` (`failure` says how), and
    serves every other model as the null adapter does."""

    def __init__(self, failure: BaseException, oom_model: str = MODEL, **kwargs: Any) -> None:
        super().__init__(8, **kwargs)
        self.failure = failure
        self.oom_model = oom_model
        self.failed_batches = 0

    async def run_batch(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str
    ) -> list[dict[str, Any]]:
        if model_id == self.oom_model:
            self.failed_batches += 1
            raise self.failure
        return await super().run_batch(model_id, op, items, lora_key)


def test_out_of_memory_is_recognised_by_the_torch_names_only() -> None:
    assert is_out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(AcceleratorOutOfMemory("out of memory"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))  # torch < 1.13
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(MemoryError())  # host memory: not the accelerator's
    assert not is_out_of_memory(ValueError("CUDA out of memory"))


def test_the_oom_delay_comes_from_sie_oom_nak_delay_s() -> None:
    assert oom_nak_delay_ms({}) == OOM_NAK_DELAY_MS == 10_000
    assert oom_nak_delay_ms({"SIE_OOM_NAK_DELAY_S": "2.5"}) == 2500
    for bad in ("", "0", "-1", "soon", "inf", "nan"):
        assert oom_nak_delay_ms({"SIE_OOM_NAK_DELAY_S": bad}) == OOM_NAK_DELAY_MS


@pytest.mark.parametrize(
    "failure",
    [
        OutOfMemoryError("CUDA out of memory"),
        AcceleratorOutOfMemory("out of memory"),
        RuntimeError("CUDA out of memory"),
    ],
    ids=["torch-cuda", "subclass", "torch-legacy"],
)
async def test_an_oom_batch_is_answered_nak_retry_with_the_oom_delay(sock_dir: str, failure: BaseException) -> None:
    adapter = ExhaustedAdapter(failure, preloaded_models=[MODEL, "b/model"])
    sock = f"{sock_dir}/backend.sock"
    async with BackendServer(adapter, sock, worker_id="w") as _, IpcClient(sock) as ipc:
        items = [wrapped("encode", i) for i in range(3)]
        items.append({**wrapped("encode", 3), "encode": None})  # rejected before the adapter
        result = await ipc.run_batch(run_batch_body(items))
        by_index = {o.item_index: o for o in result.outcomes}
        assert by_index[3].disposition == "publish_error_and_ack"
        for i in range(3):
            outcome = by_index[i]
            assert (outcome.work_item_id, outcome.disposition) == (f"r.{i}", "nak_retry")
            assert outcome.nak_delay_ms == 10_000 and outcome.error == f"{type(failure).__name__}: {failure}"
        # The per-op form goes through the same adapter call.
        body = msgpack.packb({"model_id": MODEL, "items": [payload("encode", 7)]})
        per_op = await ipc.process_batch("ProcessEncodeBatch", body)
        assert [(o.work_item_id, o.disposition, o.nak_delay_ms) for o in per_op.outcomes] == [
            ("r.7", "nak_retry", 10_000)
        ]
        # Another model on the same server is served; the OOM was the batch's, not the server's.
        served = await ipc.run_batch(run_batch_body([wrapped("encode", 0)], model="b/model"))
        assert served.outcomes[0].disposition == "publish_and_ack"
        assert adapter.failed_batches == 2


async def test_the_oom_delay_is_the_servers_and_other_exceptions_stay_envelope_errors(sock_dir: str) -> None:
    sock = f"{sock_dir}/backend.sock"
    oom = ExhaustedAdapter(OutOfMemoryError("CUDA out of memory"), preloaded_models=[MODEL])
    async with BackendServer(oom, sock, worker_id="w", oom_nak_delay_ms=2500) as _, IpcClient(sock) as ipc:
        result = await ipc.run_batch(run_batch_body([wrapped("encode", 0)]))
        assert (result.outcomes[0].disposition, result.outcomes[0].nak_delay_ms) == ("nak_retry", 2500)
    broken = ExhaustedAdapter(RuntimeError("shape mismatch"), preloaded_models=[MODEL])
    async with BackendServer(broken, sock, worker_id="w") as _, IpcClient(sock) as ipc:
        with pytest.raises(IpcServerError) as caught:
            await ipc.run_batch(run_batch_body([wrapped("encode", 0)]))
        assert caught.value.message == "RuntimeError: shape mismatch"


async def test_the_sidecar_naks_each_item_of_an_oom_batch_with_the_oom_delay(tmp_path: Path) -> None:
    """Through the pipeline: the items come back after 10 s (not the 700 ms base delay), with no
    reply; a warm model beside them is answered."""
    adapter = ExhaustedAdapter(
        OutOfMemoryError("CUDA out of memory"), oom_model="org/model-b", preloaded_models=["org/model-a", "org/model-b"]
    )
    async with memory_pipeline(tmp_path, adapter=adapter, nak_delay_ms=700) as p:
        exhausted = [_msg(_item(f"oom{i}", model="org/model-b")) for i in range(3)]
        fine = _msg(_item("fine"))
        p.send([*exhausted, fine])
        await p.until_settled([*exhausted, fine])
        assert all(m.final == [("nak", OOM_NAK_DELAY_MS / 1000)] for m in exhausted), [m.final for m in exhausted]
        assert fine.final == [("ack", None)]
        assert [r["work_item_id"] for _, r in p.sink.replies] == ["fine.0"]
