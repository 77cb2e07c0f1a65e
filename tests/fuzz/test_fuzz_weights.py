# SPDX-License-Identifier: Apache-2.0
"""Fuzz the reference backend's weights loader (HF `safetensors` underneath): a model file of any
bytes ends in tensors or a `WeightsError` naming the file, never another exception or a crash.

Why: the library's numpy API raises bare TypeError/AttributeError/KeyError for dtypes numpy lacks;
the loader must turn every refusal into its one typed error. Bounded by the hypothesis profile.
"""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save

from sie_sidecar.backend.minilm import WeightsError, read_weights

from .strategies import mutated

pytestmark = pytest.mark.fuzz

DTYPES = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
DTYPES += ["F8_E4M3", "F8_E5M2", "F4", "Q7", ""]  # numpy cannot hold these, or no such dtype
SEED = save(
    {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.arange(3, dtype=np.int64)},
    metadata={"format": "pt"},
)
BF16_SEED = (
    struct.pack("<Q", 64)
    + json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode().ljust(64)
    + b"\x80?\x20\xc0"
)


def load(blob: bytes) -> dict[str, Any] | None:
    """The loader's answer for `blob` written to a file: tensors, or None for a WeightsError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(blob)
        try:
            return read_weights(path)
        except WeightsError as exc:
            assert str(exc).startswith(f"{path}: ")
            return None


def test_seeds_load() -> None:
    assert set(load(SEED) or {}) == {"w", "ids"}
    np.testing.assert_array_equal((load(BF16_SEED) or {})["w"], [1.0, -2.5])


@given(mutated(SEED))
def test_mutated_files_load_or_raise_weights_error(blob: bytes) -> None:
    load(blob)


@given(mutated(BF16_SEED))
def test_mutated_bf16_files_load_or_raise_weights_error(blob: bytes) -> None:
    got = load(blob)
    for arr in (got or {}).values():
        assert isinstance(arr, np.ndarray)


ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F4": 1, "Q7": 1, "": 1}
ITEMSIZE |= {"I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8}
ITEMSIZE |= {"U64": 8}


@given(
    st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3)), max_size=4),
    st.integers(-3, 3),
    st.binary(max_size=8),
)
def test_structured_headers_load_or_raise_weights_error(
    entries: list[tuple[str, list[int]]], skew: int, tail: bytes
) -> None:
    """Consistently laid-out tensors of every dtype, the last offset skewed and junk appended at times."""
    header: dict[str, Any] = {}
    end = 0
    for i, (dtype, shape) in enumerate(entries):
        size = ITEMSIZE[dtype] * int(np.prod(shape, dtype=np.int64))
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [end, end + size]}
        end += size
    if header:
        header[f"t{len(entries) - 1}"]["data_offsets"][1] += skew
    text = json.dumps(header).encode()
    got = load(struct.pack("<Q", len(text)) + text + bytes(max(0, end + skew)) + tail)
    for name, arr in (got or {}).items():
        assert list(arr.shape) == header[name]["shape"]
        if header[name]["dtype"] == "BF16":
            assert arr.dtype == np.float32
