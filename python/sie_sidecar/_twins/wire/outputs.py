# SPDX-License-Identifier: Apache-2.0
"""Output framing inside `result_msgpack` (wire-protocol §11, §4.8): the pure-Python twin.

The bytes are assembled by hand rather than through `msgpack.packb` because the msgpack-numpy
sentinel mixes bin keys with str values, and because the array data should be copied exactly once,
straight from the numpy buffer into the output bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ShapeError
from ...wire.extract import frame_extract

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")

_U32_MAX = 0xFFFF_FFFF
_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1

# Dtype kinds a raw-byte sentinel can describe: bool, signed, unsigned, float.
_SENTINEL_KINDS = frozenset("biuf")


# --- msgpack primitives (shortest encodings, as every v0.7.1 producer writes them) ---------------


def pack_uint(value: int) -> bytes:
    """Shortest unsigned encoding; OverflowError outside u64 (what a native u64 argument raises)."""
    if value < 0 or value > _U64_MAX:
        raise OverflowError(f"{value} is not a u64")
    if value < 0x80:
        return bytes((value,))
    if value <= 0xFF:
        return b"\xcc" + _U8.pack(value)
    if value <= 0xFFFF:
        return b"\xcd" + _U16.pack(value)
    if value <= _U32_MAX:
        return b"\xce" + _U32.pack(value)
    return b"\xcf" + _U64.pack(value)


def _str_header(size: int) -> bytes:
    if size < 32:
        return bytes((0xA0 | size,))
    if size <= 0xFF:
        return b"\xd9" + _U8.pack(size)
    if size <= 0xFFFF:
        return b"\xda" + _U16.pack(size)
    return b"\xdb" + _U32.pack(size)


def pack_str(value: str) -> bytes:
    data = value.encode("utf-8")
    return _str_header(len(data)) + data


def bin_header(size: int) -> bytes:
    if size <= 0xFF:
        return b"\xc4" + _U8.pack(size)
    if size <= 0xFFFF:
        return b"\xc5" + _U16.pack(size)
    return b"\xc6" + _U32.pack(size)


def bin_header_len(size: int) -> int:
    """Width of the bin header for `size` bytes (2, 3 or 5), without building it."""
    if size <= 0xFF:
        return 2
    if size <= 0xFFFF:
        return 3
    return 5


def uint_len(value: int) -> int:
    """Width of the shortest unsigned encoding of `value`."""
    if value < 0x80:
        return 1
    if value <= 0xFF:
        return 2
    if value <= 0xFFFF:
        return 3
    if value <= _U32_MAX:
        return 5
    return 9


def _array_header(size: int) -> bytes:
    if size < 16:
        return bytes((0x90 | size,))
    if size <= 0xFFFF:
        return b"\xdc" + _U16.pack(size)
    return b"\xdd" + _U32.pack(size)


def map_header(size: int) -> bytes:
    if size < 16:
        return bytes((0x80 | size,))
    if size <= 0xFFFF:
        return b"\xde" + _U16.pack(size)
    return b"\xdf" + _U32.pack(size)


def pack_f64(value: float) -> bytes:
    return b"\xcb" + _F64.pack(value)


# Constant pieces, built once.
_NIL = b"\xc0"
_K_ID = pack_str("id")
_K_DIMS = pack_str("dims")
_K_DTYPE = pack_str("dtype")
_K_VALUES = pack_str("values")
_K_INDICES = pack_str("indices")
_K_TOKEN_DIMS = pack_str("token_dims")
_K_NUM_TOKENS = pack_str("num_tokens")
_K_DENSE = pack_str("dense")
_K_SPARSE = pack_str("sparse")
_K_MULTIVECTOR = pack_str("multivector")
_K_ITEM_ID = pack_str("item_id")
_K_SCORE = pack_str("score")
_K_RANK = pack_str("rank")
_V_FLOAT32 = pack_str("float32")
_V_FLOAT16 = pack_str("float16")
# Sentinel prefix up to (and including) the `type` key: {b"nd": True, b"type": ...
_ND_HEAD = b"\x85" + bin_header(2) + b"nd" + b"\xc3" + bin_header(4) + b"type"
# ... b"kind": b"", b"shape": ...
_ND_KIND_SHAPE = bin_header(4) + b"kind" + bin_header(0) + bin_header(5) + b"shape"
# ... b"data": <bin>
_ND_DATA = bin_header(4) + b"data"


# --- array coercion ------------------------------------------------------------------------------


def _raw_buffer(values: Any) -> memoryview | None:
    """A memoryview when `values` is an untyped byte buffer (bytes, bytearray, 'B' views), else None.

    Untyped bytes are read as little-endian elements; typed buffers (numpy arrays, 'f' views) keep
    their own element type and are converted by value.
    """
    if isinstance(values, bytes | bytearray):
        return memoryview(values)
    if isinstance(values, memoryview) and values.format in ("B", "b", "c"):
        return values
    return None


def _as_float32(values: Any, what: str) -> npt.NDArray[np.float32]:
    """Coerce a list, typed buffer or raw little-endian bytes into a flat C-order float32 array."""
    if values is None:
        return np.empty(0, dtype="<f4")
    raw = _raw_buffer(values)
    try:
        if raw is not None:
            if raw.nbytes % 4:
                raise ShapeError(f"{what}: {raw.nbytes} bytes is not a whole number of float32 values")
            return np.frombuffer(raw, dtype="<f4")
        arr = np.asarray(values)
        if arr.dtype.kind not in "biuf":
            raise ShapeError(f"{what}: expected numbers, got dtype {arr.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):  # doubles beyond float32 become ±inf, as in a cast
            return np.ascontiguousarray(arr, dtype="<f4").reshape(-1)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ShapeError(f"{what}: {exc}") from exc


def _as_int32(values: Any, what: str) -> npt.NDArray[np.int32]:
    """Coerce integers into a flat C-order int32 array; anything outside int32 is a shape error."""
    raw = _raw_buffer(values)
    try:
        if raw is not None:
            if raw.nbytes % 4:
                raise ShapeError(f"{what}: {raw.nbytes} bytes is not a whole number of int32 values")
            return np.frombuffer(raw, dtype="<i4")
        arr = np.asarray(values).reshape(-1)
        if arr.size == 0:
            return np.empty(0, dtype="<i4")
        if arr.dtype.kind not in "biu":
            raise ShapeError(f"{what}: expected integers, got dtype {arr.dtype}")
        if arr.dtype.kind != "b" and (int(arr.min()) < _I32_MIN or int(arr.max()) > _I32_MAX):
            raise ShapeError(f"{what}: value outside int32")
        return np.ascontiguousarray(arr, dtype="<i4")
    except (TypeError, ValueError, OverflowError) as exc:
        raise ShapeError(f"{what}: {exc}") from exc


def _byte_view(values: Any, what: str) -> memoryview:
    """A flat byte view of any C-contiguous buffer."""
    try:
        return memoryview(values).cast("B")
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{what}: not a contiguous buffer ({exc})") from exc


def _check_count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ShapeError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


# --- sentinel ------------------------------------------------------------------------------------


def _sentinel_parts(arr: npt.NDArray[Any], shape: tuple[int, ...]) -> list[bytes | memoryview]:
    """msgpack-numpy ndarray map pieces for a little-endian C-contiguous array.

    The data is a view, so joining the pieces is the one and only copy of the array bytes.
    """
    parts: list[bytes | memoryview] = [_ND_HEAD, pack_str(arr.dtype.str), _ND_KIND_SHAPE, _array_header(len(shape))]
    parts.extend(pack_uint(dim) for dim in shape)
    parts.append(_ND_DATA)
    parts.append(bin_header(arr.nbytes))
    if arr.nbytes:
        parts.append(arr.data.cast("B"))
    return parts


def nd_sentinel(array: npt.ArrayLike) -> bytes:
    """Encode an ndarray the way msgpack-numpy does (TV-F1..TV-F3), always little-endian."""
    try:
        arr = np.asarray(array)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"nd_sentinel: {exc}") from exc
    if arr.dtype.kind not in _SENTINEL_KINDS:
        raise ShapeError(f"nd_sentinel: dtype {arr.dtype} has no raw-byte sentinel")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)
    if arr.ndim == 0:
        # A 0-d array still encodes as an ndarray (shape []), one element of data.
        return b"".join(_sentinel_parts(arr.reshape(1), ()))
    return b"".join(_sentinel_parts(arr, tuple(int(d) for d in arr.shape)))


# --- encode results (§11.2) ----------------------------------------------------------------------


def _outer(item_id: str | None, key: bytes) -> list[bytes | memoryview]:
    """Head of `{id?, <output>: ...}`: the caller id, when echoed, is the first of two keys (TV-F5)."""
    if item_id is None:
        return [b"\x81", key]
    if not isinstance(item_id, str):
        raise ShapeError("item_id must be a str")
    return [b"\x82", _K_ID, pack_str(item_id), key]


def _l2_normalize(arr: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """L2-normalise: sum of squares in float64, norm rounded to float32, per-element f32 division.

    float64 accumulation keeps tiny and huge vectors normalisable; a zero, NaN or infinite norm
    leaves the values untouched rather than producing NaNs or zeros. Same rule as the native core.
    """
    if arr.size == 0:
        return arr
    wide = arr.astype(np.float64)
    with np.errstate(all="ignore"):  # IEEE semantics: overflow gives inf, never a warning
        norm = np.float32(np.sqrt(np.dot(wide, wide)))
        if not (norm > 0 and np.isfinite(norm)):
            return arr
        normalized: npt.NDArray[np.float32] = np.divide(arr, norm, dtype=np.float32)
    return normalized


def frame_dense(values: Any, *, dims: int | None = None, item_id: str | None = None, normalize: bool = False) -> bytes:
    """Sidecar-framed float32 dense output, byte-identical to the backend's framing (TV-F4, TV-F5)."""
    arr = _as_float32(values, "dense values")
    if dims is None:
        dims = arr.size
    elif isinstance(dims, bool) or not isinstance(dims, int | np.integer) or dims != arr.size:
        raise ShapeError(f"dense dims mismatch: dims={dims!r}, values={arr.size}")
    if normalize:
        arr = _l2_normalize(arr)
    parts = _outer(item_id, _K_DENSE)
    parts += (b"\x83", _K_DIMS, pack_uint(int(dims)), _K_DTYPE, _V_FLOAT32, _K_VALUES)
    parts += _sentinel_parts(arr, (arr.size,))
    return b"".join(parts)


def frame_dense_batch(
    matrix: Any, *, item_ids: Sequence[str | None] | None = None, normalize: bool = False
) -> list[bytes]:
    """Dense results for every row of a 2-D float32 matrix (one call per batch)."""
    arr = np.asarray(matrix, dtype=np.float32)
    if arr.ndim != 2:
        raise ShapeError("frame_dense_batch needs a 2-D array")
    if item_ids is not None and len(item_ids) != arr.shape[0]:
        raise ShapeError(f"{len(item_ids)} item ids for {arr.shape[0]} rows")
    ids: Sequence[str | None] = item_ids if item_ids is not None else [None] * arr.shape[0]
    return [frame_dense(row, item_id=item_id, normalize=normalize) for row, item_id in zip(arr, ids, strict=True)]


def frame_sparse(indices: Any, values: Any, *, dims: int | None = None, item_id: str | None = None) -> bytes:
    """Sidecar-framed int32/float32 sparse output; an unknown vocabulary size is nil (TV-F6..TV-F8)."""
    idx = _as_int32(indices, "sparse indices")
    vals = _as_float32(values, "sparse values")
    if idx.size != vals.size:
        raise ShapeError(f"sparse length mismatch: {idx.size} indices, {vals.size} values")
    dims_bytes = _NIL if dims is None else pack_uint(_check_count(dims, "sparse dims"))
    parts = _outer(item_id, _K_SPARSE)
    parts += (b"\x84", _K_DIMS, dims_bytes, _K_DTYPE, _V_FLOAT32, _K_INDICES)
    parts += _sentinel_parts(idx, (idx.size,))
    parts.append(_K_VALUES)
    parts += _sentinel_parts(vals, (vals.size,))
    return b"".join(parts)


def frame_multivector(
    values: Any,
    num_tokens: int,
    token_dims: int,
    *,
    dtype: str = "float32",
    item_id: str | None = None,
    values_f16: Any = None,
) -> bytes:
    """Sidecar-framed float32/float16 multivector (TV-F9..TV-F11).

    Pre-rounded halves (`values_f16`, non-empty) win over `values`; an empty `values_f16` counts as
    absent, as the RawOutput default does (wire-protocol §4.8).
    """
    if dtype not in ("float32", "float16"):
        raise ShapeError(f"multivector dtype must be float32 or float16, got {dtype!r}")
    rows = _check_count(num_tokens, "num_tokens")
    cols = _check_count(token_dims, "token_dims")
    count = rows * cols
    arr: npt.NDArray[Any]
    raw = _byte_view(values_f16, "values_f16") if values_f16 is not None else None
    if raw is not None and raw.nbytes > 0:
        if dtype != "float16":
            raise ShapeError(f"values_f16 requires dtype float16, got {dtype!r}")
        if raw.nbytes != count * 2:
            raise ShapeError(f"multivector values_f16 has {raw.nbytes} bytes, expected {count * 2}")
        arr = np.frombuffer(raw, dtype="<f2")
    else:
        f32 = _as_float32(values, "multivector values")
        if f32.size != count:
            raise ShapeError(f"multivector size mismatch: {f32.size} values for {rows} x {cols}")
        if dtype == "float16":
            with np.errstate(over="ignore", invalid="ignore"):
                arr = f32.astype("<f2")
        else:
            arr = f32
    parts = _outer(item_id, _K_MULTIVECTOR)
    parts += (b"\x84", _K_TOKEN_DIMS, pack_uint(cols), _K_NUM_TOKENS, pack_uint(rows), _K_DTYPE)
    parts += (_V_FLOAT16 if dtype == "float16" else _V_FLOAT32, _K_VALUES)
    parts += _sentinel_parts(arr, (rows, cols))
    return b"".join(parts)


def f32_to_f16(values: Any) -> bytes:
    """Little-endian IEEE halves, round to nearest, ties to even (TV-F15); numpy's cast does RNE."""
    arr = _as_float32(values, "f32_to_f16 values")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to ±inf is the IEEE result, not an error
        return arr.astype("<f2").tobytes()


# --- score results (§11.3) -----------------------------------------------------------------------


def frame_score(scores: Any, item_ids: Sequence[str]) -> bytes:
    """Top-level array sorted by score descending, stable; scores are f32 widened to f64 (TV-F12..14).

    Python's stable sort with `reverse=True` is the reference ordering; a NaN never compares
    greater or smaller, so it does not fail the sort.
    """
    arr = _as_float32(scores, "scores")
    ids = list(item_ids)
    if arr.size != len(ids):
        raise ShapeError(f"score length mismatch: {arr.size} scores, {len(ids)} item ids")
    for item in ids:
        if not isinstance(item, str):
            raise ShapeError("score item ids must be str")
    widened: list[float] = arr.astype(np.float64).tolist()
    order = sorted(range(len(ids)), key=widened.__getitem__, reverse=True)
    parts: list[bytes] = [_array_header(len(order))]
    for rank, i in enumerate(order):
        parts.append(b"\x83" + _K_ITEM_ID + pack_str(ids[i]) + _K_SCORE + pack_f64(widened[i]) + _K_RANK)
        parts.append(pack_uint(rank))
    return b"".join(parts)


__all__ = [
    "f32_to_f16",
    "frame_dense",
    "frame_extract",
    "frame_multivector",
    "frame_score",
    "frame_sparse",
    "nd_sentinel",
]
