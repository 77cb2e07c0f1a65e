# SPDX-License-Identifier: Apache-2.0
"""A minimal, defensive reader of the safetensors format, in numpy only.

The layout is an 8-byte little-endian header length N, N bytes of JSON (`{name: {dtype, shape,
data_offsets}, "__metadata__": {str: str}}`) and then the raw little-endian tensor bytes; offsets
count from the end of the header. Everything an attacker controls (the length, the JSON, the
offsets, shapes and dtypes) is checked before a single tensor is exposed, and a bad file raises
`SafetensorsError` naming the problem. Tensors are read-only zero-copy views over one buffer (an
`np.memmap` of the file, or the caller's bytes); only BF16 is copied, widened to float32, because
numpy has no bfloat16.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_HEADER_SIZE", "SafetensorsError", "SafetensorsFile", "TensorInfo", "load", "load_file"]

# The reference implementation refuses headers above 100 MB; a real header is a few KiB.
MAX_HEADER_SIZE = 100_000_000
_PREFIX = 8
_METADATA_KEY = "__metadata__"

# Safetensors dtype tag → little-endian numpy dtype. BF16 is stored as raw u16 and widened later.
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}


class SafetensorsError(ValueError):
    """The bytes are not a well-formed safetensors file (or use a dtype this reader lacks)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One header entry after validation; `start`/`end` are absolute offsets into the buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a repeated key would let two readers see two different files."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(f"duplicate key {key!r} in header")
        out[key] = value
    return out


def _header_length(prefix: bytes, total: int) -> int:
    if len(prefix) < _PREFIX:
        raise SafetensorsError(f"file too short for the 8-byte header length ({total} bytes)")
    n = int.from_bytes(prefix[:_PREFIX], "little")
    if n < 2:
        raise SafetensorsError(f"header length {n} is too small for a JSON object")
    if n > MAX_HEADER_SIZE:
        raise SafetensorsError(f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit")
    if n > total - _PREFIX:
        raise SafetensorsError(f"header length {n} runs past the end of the file ({total} bytes)")
    return n


def _parse_header(raw: bytes, data_start: int, total: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Validate the JSON header; offsets must tile the data section exactly, as the spec requires."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(f"header is not UTF-8: {exc}") from None
    if not text.startswith("{"):
        raise SafetensorsError("header does not start with '{'")
    try:
        header = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        raise SafetensorsError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")

    metadata: dict[str, str] = {}
    raw_meta = header.pop(_METADATA_KEY, None)
    if raw_meta is not None:
        if not isinstance(raw_meta, dict) or not all(isinstance(v, str) for v in raw_meta.values()):
            raise SafetensorsError("__metadata__ must map strings to strings")
        metadata = dict(raw_meta)

    data_len = total - data_start
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        infos[name] = _tensor_info(name, entry, data_start, data_len)

    # The entries must cover [0, data_len) without gaps or overlaps (zero-sized ones may sit anywhere).
    cursor = 0
    for info in sorted(infos.values(), key=lambda i: (i.start, i.end)):
        rel_start, rel_end = info.start - data_start, info.end - data_start
        if rel_start == rel_end and rel_start <= cursor:
            continue
        if rel_start != cursor:
            kind = "overlaps" if rel_start < cursor else "leaves a gap before"
            raise SafetensorsError(f"tensor {info.name!r} {kind} offset {cursor} of the data section")
        cursor = rel_end
    if cursor != data_len:
        raise SafetensorsError(f"tensors cover {cursor} of the {data_len} data bytes")
    return infos, metadata


def _tensor_info(name: str, entry: Any, data_start: int, data_len: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise SafetensorsError(f"tensor {name!r}: entry is not an object")
    missing = {"dtype", "shape", "data_offsets"} - entry.keys()
    if missing:
        raise SafetensorsError(f"tensor {name!r}: missing {', '.join(sorted(missing))}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise SafetensorsError(f"tensor {name!r}: unsupported dtype {dtype!r}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise SafetensorsError(f"tensor {name!r}: shape must be a list of non-negative integers")
    offsets = entry["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
        raise SafetensorsError(f"tensor {name!r}: data_offsets must be two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise SafetensorsError(f"tensor {name!r}: data_offsets [{begin}, {end}] are reversed")
    if end > data_len:
        raise SafetensorsError(f"tensor {name!r}: data_offsets end {end} is past the {data_len}-byte data section")
    nbytes = math.prod(shape) * _DTYPES[dtype].itemsize  # Python ints: no overflow
    if nbytes != end - begin:
        raise SafetensorsError(
            f"tensor {name!r}: shape {shape} of {dtype} needs {nbytes} bytes, offsets give {end - begin}"
        )
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


class SafetensorsFile(Mapping[str, npt.NDArray[Any]]):
    """A validated safetensors buffer; indexing returns read-only views (BF16: a float32 copy)."""

    def __init__(self, source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> None:
        buf: npt.NDArray[np.uint8]
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
            buf = np.frombuffer(data, dtype=np.uint8)
            total = len(data)
            n = _header_length(data[:_PREFIX], total)
            raw = data[_PREFIX : _PREFIX + n]
        else:
            path = Path(source)
            try:
                with path.open("rb") as fh:
                    total = os.fstat(fh.fileno()).st_size
                    n = _header_length(fh.read(_PREFIX), total)
                    raw = fh.read(n)
            except OSError as exc:
                raise SafetensorsError(f"cannot read {path}: {exc}") from exc
            if len(raw) != n:
                raise SafetensorsError(f"{path} shrank while being read")
            # One read-only map of the whole file; every tensor is a slice of it.
            buf = np.memmap(path, dtype=np.uint8, mode="r")
            if buf.size != total:
                raise SafetensorsError(f"{path} changed size while being read")
        self._buf = buf
        self._infos, self.metadata = _parse_header(raw, _PREFIX + n, total)

    def info(self, name: str) -> TensorInfo:
        """The validated header entry for `name` (KeyError if absent)."""
        return self._infos[name]

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        info = self._infos[name]
        raw = self._buf[info.start : info.end]
        arr = raw.view(_DTYPES[info.dtype]).reshape(info.shape)
        if info.dtype == "BF16":
            # bfloat16 is the top half of a float32: shift into place (a copy, float32 result).
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(arr)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)


def load_file(path: str | os.PathLike[str]) -> dict[str, npt.NDArray[Any]]:
    """Every tensor of a file, as views over one read-only memory map."""
    st = SafetensorsFile(path)
    return {name: st[name] for name in st}


def load(data: bytes | bytearray | memoryview) -> dict[str, npt.NDArray[Any]]:
    """Every tensor of an in-memory safetensors blob, as views over (a bytes copy of) it."""
    st = SafetensorsFile(data)
    return {name: st[name] for name in st}
