# SPDX-License-Identifier: Apache-2.0
"""Properties only the compiled core can promise: zero-copy views, lifetimes, the switch."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sie_sidecar import errors


def test_splitter_bodies_are_read_only_views(native: ModuleType) -> None:
    (body,) = native.FrameSplitter().feed(native.encode_frame(b"hello"))
    assert isinstance(body, memoryview)
    assert body.readonly
    with pytest.raises(TypeError):
        body[0] = 0


def test_bodies_of_one_read_share_one_block(native: ModuleType) -> None:
    data = native.encode_frame(b"aaaa") + native.encode_frame(b"bbbb")
    first, second = native.FrameSplitter().feed(data)
    # One copy of the read, two views into it: the second body sits 4 + 4 bytes after the first.
    first_at = np.frombuffer(first, np.uint8).__array_interface__["data"][0]
    second_at = np.frombuffer(second, np.uint8).__array_interface__["data"][0]
    assert second_at == first_at + 8
    assert (bytes(first), bytes(second)) == (b"aaaa", b"bbbb")


def test_views_outlive_the_splitter_and_the_input(native: ModuleType) -> None:
    data = bytearray(native.encode_frame(b"x" * 1000))
    splitter = native.FrameSplitter()
    (body,) = splitter.feed(data)
    del splitter
    data[:] = b"\0" * len(data)  # the caller reuses its read buffer
    gc.collect()
    assert bytes(body) == b"x" * 1000


def test_large_frame_across_reads_is_assembled_once(native: ModuleType) -> None:
    payload = os.urandom(1 << 20)
    frame = native.encode_frame(payload)
    splitter = native.FrameSplitter()
    got = []
    for i in range(0, len(frame), 65536):
        got += splitter.feed(memoryview(frame)[i : i + 65536])
    assert [bytes(b) for b in got] == [payload]
    assert splitter.buffered == 0


def test_envelope_body_is_a_view_into_the_frame(native: ModuleType) -> None:
    body = msgpack.packb({"outcomes": []})
    frame = msgpack.packb({"version": 1, "request_id": "w-1", "ok": True, "body": None, "error": None})
    frame = frame.replace(b"\xa4body\xc0", b"\xa4body" + body)
    env = native.decode_response(frame)
    assert isinstance(env.body, memoryview)
    assert env.body.obj is frame  # no copy of the body
    assert bytes(native.response_body(env, "w-1")) == body


def test_assembled_response_is_a_buffer(native: ModuleType) -> None:
    import hashlib

    whole = msgpack.packb({"version": 1, "request_id": "r1", "ok": True, "body": {"v": 1}, "error": None})
    limits = native.ChunkLimits(legacy_ceiling=4, max_chunk_payload=16)
    asm = native.IpcChunkAssembler("r1", budget=native.ResponseBudget(), limits=limits)
    digest = hashlib.sha256(whole).digest()
    pieces = [whole[i : i + 16] for i in range(0, len(whole), 16)]
    done = None
    for i, piece in enumerate(pieces):
        frame = msgpack.packb(
            {
                "version": 1,
                "request_id": "r1",
                "transfer_digest": digest,
                "chunk_index": i,
                "chunk_count": len(pieces),
                "total_bytes": len(whole),
                "payload": piece,
                "kind": "ipc_response_chunk_v1",
            }
        )
        done = asm.feed(native.decode_response(frame))
    assert done is not None
    with done:
        assert memoryview(done).tobytes() == whole
        assert done.decode().ok
        assert done.reservation == 2 * len(whole) + 4096
    assert done.reservation == 0


def test_typed_inputs_accept_lists_and_strided_arrays(native: ModuleType, twin: ModuleType) -> None:
    strided = np.arange(12, dtype=np.float32)[::2]
    assert native.frame_dense(strided) == twin.frame_dense(strided)
    assert native.frame_dense([1.0, 2.0]) == twin.frame_dense([1.0, 2.0])
    assert native.frame_dense(np.array([1, 2], dtype=np.float64)) == twin.frame_dense([1.0, 2.0])


@given(
    hnp.arrays(
        np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=8), elements=st.floats(-1e3, 1e3, width=32)
    ),
    st.booleans(),
)
def test_dense_batch_parity(matrix: np.ndarray, normalize: bool) -> None:
    from sie_sidecar._twins import wire as _wire_py
    from sie_sidecar.wire import _native_api as _wire_native

    ids = [f"doc-{i}" if i % 2 else None for i in range(matrix.shape[0])]
    batch = _wire_native.frame_dense_batch(matrix, item_ids=ids, normalize=normalize)
    got = [bytes(item) for item in batch]
    want = _wire_py.frame_dense_batch(matrix, item_ids=ids, normalize=normalize)
    assert len(got) == len(want) == matrix.shape[0]
    assert batch.to_list() == got
    assert bytes(batch.buffer) == b"".join(got)
    assert batch.offsets == [sum(map(len, got[:i])) for i in range(len(got) + 1)]
    for g, w in zip(got, want, strict=True):
        if normalize:
            gd, wd = msgpack.unpackb(g), msgpack.unpackb(w)
            gv = np.frombuffer(gd["dense"]["values"][b"data"], np.float32)
            wv = np.frombuffer(wd["dense"]["values"][b"data"], np.float32)
            np.testing.assert_allclose(gv, wv, rtol=1e-6, atol=1e-6)
        else:
            assert g == w


def test_dense_batch_rejects_bad_shapes(impl: ModuleType) -> None:
    with pytest.raises(errors.ShapeError):
        impl.frame_dense_batch(np.zeros(3, dtype=np.float32))
    with pytest.raises(errors.ShapeError):
        impl.frame_dense_batch(np.zeros((2, 3), dtype=np.float32), item_ids=["a"])


def test_dense_batch_zero_width_rows(impl: ModuleType) -> None:
    out = impl.frame_dense_batch(np.zeros((2, 0), dtype=np.float32))
    assert [bytes(item) for item in out] == [impl.frame_dense([])] * 2


def test_framed_batch_items_are_views_of_one_buffer(native: ModuleType) -> None:
    batch = native.frame_dense_batch(np.ones((3, 4), dtype=np.float32))
    assert len(batch) == 3
    assert bytes(batch[-1]) == bytes(batch[2]) == native.frame_dense(np.ones(4, dtype=np.float32))
    with pytest.raises(IndexError):
        batch[3]
    first_at = np.frombuffer(batch[0], np.uint8).__array_interface__["data"][0]
    second_at = np.frombuffer(batch[1], np.uint8).__array_interface__["data"][0]
    assert second_at - first_at == batch.offsets[1]


def _python_under_switch(code: str, switch: str) -> str:
    """What `code` prints in a fresh interpreter with `SIE_SIDECAR_NO_EXTENSIONS=switch`."""
    env = {**os.environ, "SIE_SIDECAR_NO_EXTENSIONS": switch}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(("env", "expected"), [("1", "python"), ("", "native"), ("0", "native")])
def test_environment_switch_selects_the_implementation(env: str, expected: str) -> None:
    out = _python_under_switch("from sie_sidecar import wire; print(wire.IMPLEMENTATION)", env)
    assert out.strip() == expected


#: Imports every twin module first, each in a fresh package state (pure Python under the twin switch),
#: and prints the ones that fail to import.
_EACH_TWIN_FIRST = """
import importlib, pathlib, sys
import sie_sidecar._twins as twins
root = pathlib.Path(twins.__path__[0])
names = sorted(
    "sie_sidecar._twins." + ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    for p in root.rglob("*.py")
)
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "sie_sidecar" or m.startswith("sie_sidecar.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
print(len(names))
print("\\n".join(failed))
"""


@pytest.mark.parametrize("env", ["1", ""], ids=["twins", "native"])
def test_any_twin_module_imports_first(env: str) -> None:
    """A twin imported before anything else (a test, the replay tool) loads under either switch: the
    twin wire's modules import `sie_sidecar.wire`'s constants, whose package chooses the twin wire
    at import, so `_twins` loads the wire facade before any twin of it starts."""
    count, _, failed = _python_under_switch(_EACH_TWIN_FIRST, env).partition("\n")
    assert int(count) >= 20  # every twin module was tried
    assert failed.strip() == ""


def test_cython_module_is_registered_under_its_qualified_name() -> None:
    import sie_sidecar._native.wire as cy
    from sie_sidecar import _native

    assert cy is _native.wire
    assert cy.__name__ == "sie_sidecar._native.wire"
    assert sys.modules["sie_sidecar._native.wire"] is cy


def test_reassembly_buffer_is_recycled_once_nothing_views_it(native: ModuleType) -> None:
    limits = native.ChunkLimits(legacy_ceiling=8, max_chunk_payload=1 << 20, max_total=1 << 24)
    budget = native.ResponseBudget()
    payload = os.urandom(3 << 20)  # large enough for the overlapped copy path
    frames = native.encode_response_frames(payload, "r1", limits=limits)

    def transfer() -> Any:
        asm = native.IpcChunkAssembler("r1", budget=budget, limits=limits)
        done = None
        for frame in frames:
            done = asm.feed(native.decode_response(frame))
        assert done is not None
        return done

    assert budget.spare_buffer == 0
    done = transfer()
    view = memoryview(done)
    del done
    gc.collect()
    assert budget.spare_buffer == 0  # a live view still holds the bytes
    assert view.tobytes() == payload
    view.release()
    del view
    gc.collect()
    assert budget.spare_buffer >= len(payload)
    second = transfer()
    assert bytes(second) == payload  # the reused buffer holds exactly the new transfer
    assert budget.spare_buffer == 0  # taken by the transfer in flight
    del second
    gc.collect()
    assert budget.reserved == 0


def test_both_implementations_export_the_same_api(native: ModuleType, twin: ModuleType) -> None:
    assert native.__all__ == twin.__all__
    for name in twin.__all__:
        assert hasattr(native, name), name
        assert hasattr(twin, name), name
        assert callable(getattr(native, name)) == callable(getattr(twin, name)), name
