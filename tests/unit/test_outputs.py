# SPDX-License-Identifier: Apache-2.0
"""Output framing inside `result_msgpack` (wire-protocol §11, §4.8): TV-F1..TV-F15 and properties."""

from __future__ import annotations

import math
import struct
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.errors import ShapeError, WireError

# Hypothesis with the (stateless, module-returning) `impl` fixture.
fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

F32_123 = bytes.fromhex(
    "85c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659103c40464617461c40c0000803f0000004000004040"
)
TV_F1 = F32_123
TV_F2 = bytes.fromhex(
    "85c4026e64c3c40474797065a33c6934c4046b696e64c400c40573686170659103c40464617461c40c050000001100000063000000"
)
TV_F3 = bytes.fromhex("85c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659100c40464617461c400")
TV_F4 = bytes.fromhex("81a564656e736583a464696d7303a56474797065a7666c6f61743332a676616c756573") + F32_123
TV_F5 = (
    bytes.fromhex("82a26964a5646f632d31a564656e736583a464696d7303a56474797065a7666c6f61743332a676616c756573") + F32_123
)
_SPARSE_BODY = bytes.fromhex(
    "a56474797065a7666c6f61743332a7696e646963657385c4026e64c3c40474797065a33c6934c4046b696e64c400c405736861706591"
    "03c40464617461c40c03000000070000002a000000a676616c75657385c4026e64c3c40474797065a33c6634c4046b696e64c400c405"
    "73686170659103c40464617461c40c0000003f0000c03f00002040"
)
TV_F6 = bytes.fromhex("81a673706172736584a464696d73c0") + _SPARSE_BODY
TV_F7 = bytes.fromhex("81a673706172736584a464696d73cd773a") + _SPARSE_BODY
TV_F8 = bytes.fromhex(
    "81a673706172736584a464696d73cd03e8a56474797065a7666c6f61743332a7696e646963657385c4026e64c3c40474797065a33c6934"
    "c4046b696e64c400c40573686170659100c40464617461c400a676616c75657385c4026e64c3c40474797065a33c6634c4046b696e64c4"
    "00c40573686170659100c40464617461c400"
)
TV_F9 = bytes.fromhex(
    "81ab6d756c7469766563746f7284aa746f6b656e5f64696d7304aa6e756d5f746f6b656e7303a56474797065a7666c6f61743332a67661"
    "6c75657385c4026e64c3c40474797065a33c6634c4046b696e64c400c4057368617065920304c40464617461c430000000000000803f00"
    "00004000004040000080400000a0400000c0400000e04000000041000010410000204100003041"
)
TV_F10 = bytes.fromhex(
    "81ab6d756c7469766563746f7284aa746f6b656e5f64696d7302aa6e756d5f746f6b656e7302a56474797065a7666c6f61743136a67661"
    "6c75657385c4026e64c3c40474797065a33c6632c4046b696e64c400c4057368617065920202c40464617461c408003c00c000430000"
)
TV_F11A = bytes.fromhex(
    "82a26964a6646f632d3432ab6d756c7469766563746f7284aa746f6b656e5f64696d7301aa6e756d5f746f6b656e7301a56474797065a7"
    "666c6f61743136a676616c75657385c4026e64c3c40474797065a33c6632c4046b696e64c400c4057368617065920101c40464617461c4"
    "02003c"
)
TV_F11B = bytes.fromhex(
    "81ab6d756c7469766563746f7284aa746f6b656e5f64696d7302aa6e756d5f746f6b656e7301a56474797065a7666c6f61743136a67661"
    "6c75657385c4026e64c3c40474797065a33c6632c4046b696e64c400c4057368617065920102c40464617461c40400c00043"
)
TV_F12 = bytes.fromhex(
    "9283a76974656d5f6964a161a573636f7265cb3fecccccc0000000a472616e6b0083a76974656d5f6964a162a573636f7265cb3fe00000"
    "00000000a472616e6b01"
)
TV_F13 = bytes.fromhex(
    "9383a76974656d5f6964a178a573636f7265cb3fe0000000000000a472616e6b0083a76974656d5f6964a179a573636f7265cb3fe00000"
    "00000000a472616e6b0183a76974656d5f6964a17aa573636f7265cb3fe0000000000000a472616e6b02"
)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def keys_in_order(data: bytes) -> list[Any]:
    return [k for k, _ in msgpack.unpackb(data, raw=False, object_pairs_hook=list)]


def sentinel_array(node: dict[Any, Any]) -> npt.NDArray[Any]:
    """Decode a msgpack-numpy sentinel the way the SDK does."""
    assert list(node) == [b"nd", b"type", b"kind", b"shape", b"data"]
    assert node[b"nd"] is True
    assert node[b"kind"] == b""
    assert isinstance(node[b"type"], str)
    return np.frombuffer(node[b"data"], dtype=np.dtype(node[b"type"])).reshape(node[b"shape"])


# --- TV-F1..TV-F3: sentinels ---------------------------------------------------------------------


def test_tv_f1_f32_sentinel(impl: ModuleType) -> None:
    out = impl.nd_sentinel(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    assert out == TV_F1
    assert len(out) == 53


def test_tv_f2_i32_sentinel(impl: ModuleType) -> None:
    out = impl.nd_sentinel(np.array([5, 17, 99], dtype=np.int32))
    assert out == TV_F2
    assert len(out) == 53


def test_tv_f3_empty_f32_sentinel(impl: ModuleType) -> None:
    out = impl.nd_sentinel(np.array([], dtype=np.float32))
    assert out == TV_F3
    assert len(out) == 41
    assert out[0] == 0x85
    assert out.endswith(b"\xc4\x00")


def test_sentinel_2d_shape_and_f16_type(impl: ModuleType) -> None:
    arr = np.arange(6, dtype=np.float16).reshape(2, 3)
    node = unpack(impl.nd_sentinel(arr))
    assert node[b"type"] == "<f2"
    assert node[b"shape"] == [2, 3]
    np.testing.assert_array_equal(sentinel_array(node), arr)


def test_sentinel_uint8_descriptor(impl: ModuleType) -> None:
    node = unpack(impl.nd_sentinel(np.array([1, 2, 255], dtype=np.uint8)))
    assert node[b"type"] == "|u1"
    assert node[b"data"] == b"\x01\x02\xff"


def test_sentinel_shape_uses_shortest_uint(impl: ModuleType) -> None:
    out = impl.nd_sentinel(np.zeros(300, dtype=np.int8))
    assert b"\xc4\x05shape\x91\xcd\x01\x2c" in out


def test_sentinel_non_contiguous_input(impl: ModuleType) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    node = unpack(impl.nd_sentinel(arr))
    np.testing.assert_array_equal(sentinel_array(node), arr)


def test_twin_sentinel_big_endian_written_little_endian(twin: ModuleType) -> None:
    out = twin.nd_sentinel(np.array([1.0, 2.0, 3.0], dtype=">f4"))
    assert out == TV_F1


def test_twin_sentinel_rejects_object_dtype(twin: ModuleType) -> None:
    with pytest.raises(ShapeError):
        twin.nd_sentinel(np.array(["a", None], dtype=object))


# --- TV-F4, TV-F5: dense -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 2.0, 3.0],
        [1, 2, 3],
        np.array([1.0, 2.0, 3.0], dtype=np.float32),
        np.array([1.0, 2.0, 3.0], dtype=np.float64),
        np.array([1.0, 2.0, 3.0], dtype=np.float32).data,
    ],
    ids=["list", "int-list", "f32", "f64", "memoryview-f"],
)
def test_tv_f4_dense(impl: ModuleType, values: Any) -> None:
    assert impl.frame_dense(values, dims=3) == TV_F4
    assert impl.frame_dense(values) == TV_F4
    assert len(TV_F4) == 88


def test_tv_f5_dense_with_item_id(impl: ModuleType) -> None:
    out = impl.frame_dense(np.array([1.0, 2.0, 3.0], dtype=np.float32), dims=3, item_id="doc-1")
    assert out == TV_F5
    assert len(out) == 97
    assert keys_in_order(out) == ["id", "dense"]


def test_dense_empty_item_id_is_echoed(impl: ModuleType) -> None:
    out = impl.frame_dense([1.0], item_id="")
    assert keys_in_order(out) == ["id", "dense"]
    assert unpack(out)["id"] == ""


def test_dense_dims_mismatch(impl: ModuleType) -> None:
    with pytest.raises(ShapeError, match="dense dims mismatch"):
        impl.frame_dense([1.0, 2.0, 3.0], dims=4)


def test_dense_dims_mismatch_never_truncates(impl: ModuleType) -> None:
    with pytest.raises(ShapeError, match="dense dims mismatch"):
        impl.frame_dense([1.0, 2.0, 3.0], dims=2)


def test_dense_shape_error_code(impl: ModuleType) -> None:
    with pytest.raises(ShapeError) as info:
        impl.frame_dense([1.0], dims=2)
    assert info.value.code == "raw_output_shape_error"


def test_dense_normalize(impl: ModuleType) -> None:
    arr = sentinel_array(unpack(impl.frame_dense([3.0, 4.0], normalize=True))["dense"]["values"])
    assert arr.dtype == np.float32
    np.testing.assert_allclose(arr, [0.6, 0.8], rtol=1e-6)


def test_dense_normalize_zero_norm_guard(impl: ModuleType) -> None:
    dense = unpack(impl.frame_dense([0.0, 0.0, 0.0], dims=3, normalize=True))["dense"]
    assert dense["dims"] == 3
    arr = sentinel_array(dense["values"])
    assert not np.isnan(arr).any()
    np.testing.assert_array_equal(arr, [0.0, 0.0, 0.0])


def test_dense_normalize_empty(impl: ModuleType) -> None:
    dense = unpack(impl.frame_dense([], normalize=True))["dense"]
    assert dense["dims"] == 0
    assert sentinel_array(dense["values"]).size == 0


def test_dense_normalize_unit_vector_is_unchanged(impl: ModuleType) -> None:
    assert impl.frame_dense([1.0, 0.0, 0.0], normalize=True) == impl.frame_dense([1.0, 0.0, 0.0])


def test_twin_dense_raw_bytes_are_little_endian_f32(twin: ModuleType) -> None:
    assert twin.frame_dense(struct.pack("<3f", 1.0, 2.0, 3.0)) == TV_F4


def test_twin_dense_raw_bytes_ragged(twin: ModuleType) -> None:
    with pytest.raises(ShapeError):
        twin.frame_dense(b"\x00\x00\x80")


def test_twin_dense_rejects_non_numbers(twin: ModuleType) -> None:
    with pytest.raises(ShapeError):
        twin.frame_dense(["a", "b"])


# --- TV-F6..TV-F8: sparse ------------------------------------------------------------------------


def test_tv_f6_sparse_dims_nil(impl: ModuleType) -> None:
    out = impl.frame_sparse(np.array([3, 7, 42], dtype=np.int32), np.array([0.5, 1.5, 2.5], dtype=np.float32))
    assert out == TV_F6


def test_tv_f6_sparse_from_lists(impl: ModuleType) -> None:
    assert impl.frame_sparse([3, 7, 42], [0.5, 1.5, 2.5], dims=None) == TV_F6


def test_tv_f7_sparse_dims_30522(impl: ModuleType) -> None:
    out = impl.frame_sparse([3, 7, 42], [0.5, 1.5, 2.5], dims=30522)
    assert out == TV_F7
    assert b"\xa4dims\xcd\x77\x3a" in out


def test_tv_f8_empty_sparse(impl: ModuleType) -> None:
    assert impl.frame_sparse([], [], dims=1000) == TV_F8
    assert impl.frame_sparse(np.array([], dtype=np.int32), np.array([], dtype=np.float32), dims=1000) == TV_F8


def test_sparse_with_item_id(impl: ModuleType) -> None:
    out = impl.frame_sparse([3, 7, 42], [0.5, 1.5, 2.5], item_id="doc-1")
    assert out == b"\x82\xa2id\xa5doc-1" + TV_F6[1:]


@pytest.mark.parametrize(("n_idx", "n_val"), [(3, 2), (2, 3), (0, 1), (1, 0)])
def test_sparse_length_mismatch(impl: ModuleType, n_idx: int, n_val: int) -> None:
    with pytest.raises(ShapeError):
        impl.frame_sparse(list(range(n_idx)), [1.0] * n_val)


def test_sparse_negative_indices_are_int32(impl: ModuleType) -> None:
    node = unpack(impl.frame_sparse([-1, 2**31 - 1, -(2**31)], [1.0, 2.0, 3.0]))["sparse"]["indices"]
    assert sentinel_array(node).tolist() == [-1, 2**31 - 1, -(2**31)]


def test_twin_sparse_index_outside_int32(twin: ModuleType) -> None:
    with pytest.raises(ShapeError):
        twin.frame_sparse([2**31], [1.0])


def test_twin_sparse_float_indices_rejected(twin: ModuleType) -> None:
    with pytest.raises(ShapeError):
        twin.frame_sparse([1.5], [1.0])


# --- TV-F9..TV-F11: multivector ------------------------------------------------------------------


def test_tv_f9_multivector_f32(impl: ModuleType) -> None:
    assert impl.frame_multivector(np.arange(12, dtype=np.float32), 3, 4) == TV_F9
    assert impl.frame_multivector([float(i) for i in range(12)], 3, 4, dtype="float32") == TV_F9


def test_tv_f9_multivector_2d_input(impl: ModuleType) -> None:
    assert impl.frame_multivector(np.arange(12, dtype=np.float32).reshape(3, 4), 3, 4) == TV_F9


def test_tv_f10_multivector_f16_from_f32(impl: ModuleType) -> None:
    out = impl.frame_multivector([1.0, -2.0, 3.5, 0.0], 2, 2, dtype="float16")
    assert out == TV_F10
    assert len(out) == 109


def test_tv_f10_multivector_f16_preencoded(impl: ModuleType) -> None:
    out = impl.frame_multivector(None, 2, 2, dtype="float16", values_f16=bytes.fromhex("003c00c000430000"))
    assert out == TV_F10


def test_tv_f10_both_paths_identical(impl: ModuleType) -> None:
    a = impl.frame_multivector([1.0, -2.0, 3.5, 0.0], 2, 2, dtype="float16")
    b = impl.frame_multivector([], 2, 2, dtype="float16", values_f16=bytes.fromhex("003c00c000430000"))
    assert a == b


def test_tv_f11a_item_id_echo_f16(impl: ModuleType) -> None:
    out = impl.frame_multivector(None, 1, 1, dtype="float16", item_id="doc-42", values_f16=bytes.fromhex("003c"))
    assert out == TV_F11A
    assert len(out) == 113
    assert keys_in_order(out) == ["id", "multivector"]


def test_tv_f11b_batched_f16_slice(impl: ModuleType) -> None:
    buffer = struct.pack("<4H", 0x3C00, 0xC000, 0x4300, 0x0000)
    view = memoryview(buffer)[2:6]  # elements 1..3
    out = impl.frame_multivector(None, 1, 2, dtype="float16", values_f16=view)
    assert out == TV_F11B
    assert len(out) == 105
    assert impl.frame_multivector(None, 1, 2, dtype="float16", values_f16=bytes(view)) == TV_F11B


def test_multivector_bad_dtype(impl: ModuleType) -> None:
    with pytest.raises(ShapeError):
        impl.frame_multivector([1.0], 1, 1, dtype="int8")


def test_multivector_values_f16_requires_float16(impl: ModuleType) -> None:
    with pytest.raises(ShapeError):
        impl.frame_multivector(None, 1, 1, dtype="float32", values_f16=b"\x00\x3c")


@pytest.mark.parametrize("nbytes", [0, 1, 2, 6, 10])
def test_multivector_values_f16_wrong_length(impl: ModuleType, nbytes: int) -> None:
    # 2 x 2 halves need exactly 8 bytes.
    with pytest.raises(ShapeError):
        impl.frame_multivector(None, 2, 2, dtype="float16", values_f16=b"\x00" * nbytes)


@pytest.mark.parametrize("count", [0, 11, 13])
def test_multivector_f32_size_mismatch(impl: ModuleType, count: int) -> None:
    with pytest.raises(ShapeError):
        impl.frame_multivector(np.zeros(count, dtype=np.float32), 3, 4)


def test_multivector_f16_size_mismatch(impl: ModuleType) -> None:
    with pytest.raises(ShapeError):
        impl.frame_multivector([1.0, 2.0, 3.0], 2, 2, dtype="float16")


def test_multivector_empty(impl: ModuleType) -> None:
    node = unpack(impl.frame_multivector([], 0, 4))["multivector"]
    assert node["token_dims"] == 4
    assert node["num_tokens"] == 0
    assert sentinel_array(node["values"]).shape == (0, 4)


def test_multivector_key_order(impl: ModuleType) -> None:
    out = impl.frame_multivector(np.zeros(6, dtype=np.float32), 2, 3)
    inner = msgpack.unpackb(out, raw=False, object_pairs_hook=list)[0][1]
    assert [k for k, _ in inner] == ["token_dims", "num_tokens", "dtype", "values"]


# --- TV-F12..TV-F14: score -----------------------------------------------------------------------


def test_tv_f12_score(impl: ModuleType) -> None:
    out = impl.frame_score(np.array([0.9, 0.5], dtype=np.float32), ["a", "b"])
    assert out == TV_F12
    assert len(out) == 65


def test_tv_f12_score_reversed_input_same_bytes(impl: ModuleType) -> None:
    assert impl.frame_score([0.5, 0.9], ["b", "a"]) == TV_F12


def test_tv_f12_score_is_f32_widened(impl: ModuleType) -> None:
    out = impl.frame_score([0.9], ["a"])
    assert b"\xcb\x3f\xec\xcc\xcc\xc0\x00\x00\x00" in out
    assert b"\xcb\x3f\xec\xcc\xcc\xcc\xcc\xcc\xcd" not in out


def test_tv_f13_score_ties_keep_input_order(impl: ModuleType) -> None:
    assert impl.frame_score([0.5, 0.5, 0.5], ["x", "y", "z"]) == TV_F13


def test_tv_f14_empty_score(impl: ModuleType) -> None:
    assert impl.frame_score([], []) == b"\x90"
    assert impl.frame_score(np.array([], dtype=np.float32), ()) == b"\x90"


@pytest.mark.parametrize(("n_scores", "n_ids"), [(2, 1), (1, 2), (0, 1), (1, 0)])
def test_score_length_mismatch(impl: ModuleType, n_scores: int, n_ids: int) -> None:
    with pytest.raises(ShapeError):
        impl.frame_score([0.5] * n_scores, [f"item-{i}" for i in range(n_ids)])


def test_score_nan_does_not_fail(impl: ModuleType) -> None:
    ids = ["a", "b", "c", "d"]
    decoded = unpack(impl.frame_score([0.1, math.nan, 0.9, 0.5], ids))
    assert sorted(e["item_id"] for e in decoded) == ids
    assert [e["rank"] for e in decoded] == [0, 1, 2, 3]
    assert sum(math.isnan(e["score"]) for e in decoded) == 1


def test_score_all_nan_keeps_input_order(impl: ModuleType) -> None:
    decoded = unpack(impl.frame_score([math.nan, math.nan, math.nan], ["x", "y", "z"]))
    assert [e["item_id"] for e in decoded] == ["x", "y", "z"]


def test_score_large_array_header(impl: ModuleType) -> None:
    n = 20
    out = impl.frame_score(np.arange(n, dtype=np.float32), [f"item-{i}" for i in range(n)])
    assert out[:3] == b"\xdc\x00\x14"
    decoded = unpack(out)
    assert [e["item_id"] for e in decoded] == [f"item-{i}" for i in reversed(range(n))]


# --- extract (§11.4) -----------------------------------------------------------------------------


def test_extract_id_appended_last(impl: ModuleType) -> None:
    result = {"entities": [{"text": "Ada", "label": "person", "score": 0.5}], "data": {"k": b"\x00"}}
    out = impl.frame_extract(result, "item-3")
    assert keys_in_order(out) == ["entities", "data", "id"]
    assert unpack(out) == {**result, "id": "item-3"}
    assert out == msgpack.packb({**result, "id": "item-3"}, use_bin_type=True)


def test_extract_existing_id_keeps_position(impl: ModuleType) -> None:
    result = {"classifications": [], "id": "backend-id", "objects": []}
    out = impl.frame_extract(result, "doc-1")
    assert keys_in_order(out) == ["classifications", "id", "objects"]
    assert unpack(out)["id"] == "doc-1"


def test_extract_does_not_mutate_input(impl: ModuleType) -> None:
    result: dict[str, Any] = {"data": {}}
    impl.frame_extract(result, "x")
    assert result == {"data": {}}


def test_extract_empty_map(impl: ModuleType) -> None:
    assert impl.frame_extract({}, "item-0") == b"\x81\xa2id\xa6item-0"


def test_extract_floats_are_f64(impl: ModuleType) -> None:
    out = impl.frame_extract({"score": 0.5}, "a")
    assert b"\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00" in out


# --- TV-F15: f32 → f16 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bits"),
    [(1.0, 0x3C00), (-2.0, 0xC000), (1.0 + 2.0**-11, 0x3C00), (1.0 + 3 * 2.0**-11, 0x3C02)],
    ids=["one", "minus-two", "tie-down-to-even", "tie-up-to-even"],
)
def test_tv_f15_rounding(impl: ModuleType, value: float, bits: int) -> None:
    assert np.float32(value) == value  # the halfway inputs are exact float32 values
    assert impl.f32_to_f16(np.array([value], dtype=np.float32)) == struct.pack("<H", bits)


def test_tv_f15_table_at_once(impl: ModuleType) -> None:
    values = [1.0, -2.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11]
    assert impl.f32_to_f16(values) == bytes.fromhex("003c00c0003c023c")


def test_f32_to_f16_empty(impl: ModuleType) -> None:
    assert impl.f32_to_f16([]) == b""


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (65504.0, 0x7BFF),  # largest half
        (65520.0, 0x7C00),  # rounds to +inf
        (math.inf, 0x7C00),
        (-math.inf, 0xFC00),
        (2.0**-24, 0x0001),  # smallest subnormal half
        (2.0**-25, 0x0000),  # tie to even: zero
        (3 * 2.0**-25, 0x0002),  # tie to even: 2
        (-0.0, 0x8000),
        (2.0**-14, 0x0400),  # smallest normal half
    ],
)
def test_f32_to_f16_edges(impl: ModuleType, value: float, bits: int) -> None:
    assert impl.f32_to_f16(np.array([value], dtype=np.float32)) == struct.pack("<H", bits)


def test_f32_to_f16_nan_stays_nan(impl: ModuleType) -> None:
    out = np.frombuffer(impl.f32_to_f16(np.array([math.nan, -math.nan], dtype=np.float32)), dtype="<u2")
    assert all((int(b) & 0x7C00) == 0x7C00 and (int(b) & 0x03FF) != 0 for b in out)
    assert int(out[1]) & 0x8000


# --- properties ----------------------------------------------------------------------------------

f32_values = st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=64)


def f32_bits(values: list[float]) -> npt.NDArray[np.uint32]:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


@fixture_ok
@given(values=f32_values, item_id=st.none() | st.text(max_size=40))
def test_dense_round_trip(impl: ModuleType, values: list[float], item_id: str | None) -> None:
    out = impl.frame_dense(np.asarray(values, dtype=np.float32), item_id=item_id)
    decoded = unpack(out)
    if item_id is not None:
        assert keys_in_order(out)[0] == "id"
        assert decoded["id"] == item_id
    assert decoded["dense"]["dims"] == len(values)
    assert decoded["dense"]["dtype"] == "float32"
    arr = sentinel_array(decoded["dense"]["values"])
    assert arr.dtype == np.float32
    np.testing.assert_array_equal(arr.view(np.uint32), f32_bits(values))


@fixture_ok
@given(values=st.lists(st.floats(width=32, min_value=-1e6, max_value=1e6), min_size=1, max_size=64))
def test_dense_normalize_is_unit_length(impl: ModuleType, values: list[float]) -> None:
    arr = sentinel_array(unpack(impl.frame_dense(values, normalize=True))["dense"]["values"])
    norm = float(np.linalg.norm(np.asarray(values, dtype=np.float64)))
    if norm == 0.0:
        np.testing.assert_array_equal(arr, np.asarray(values, dtype=np.float32))
    elif np.isfinite(np.float32(norm)) and norm > 1e-18:
        assert abs(float(np.linalg.norm(arr.astype(np.float64))) - 1.0) < 1e-5


@fixture_ok
@given(
    pairs=st.lists(
        st.tuples(st.integers(-(2**31), 2**31 - 1), st.floats(width=32, allow_nan=False)),
        max_size=64,
    ),
    dims=st.none() | st.integers(0, 2**32 - 1),
)
def test_sparse_round_trip(impl: ModuleType, pairs: list[tuple[int, float]], dims: int | None) -> None:
    indices = np.asarray([p[0] for p in pairs], dtype=np.int32)
    values = np.asarray([p[1] for p in pairs], dtype=np.float32)
    decoded = unpack(impl.frame_sparse(indices, values, dims=dims))["sparse"]
    assert decoded["dims"] == dims
    assert decoded["dtype"] == "float32"
    np.testing.assert_array_equal(sentinel_array(decoded["indices"]), indices)
    np.testing.assert_array_equal(sentinel_array(decoded["values"]).view(np.uint32), values.view(np.uint32))


@fixture_ok
@given(
    rows=st.integers(0, 8),
    cols=st.integers(0, 8),
    dtype=st.sampled_from(["float32", "float16"]),
    data=st.data(),
)
def test_multivector_round_trip(impl: ModuleType, rows: int, cols: int, dtype: str, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(width=32, allow_nan=False), min_size=rows * cols, max_size=rows * cols))
    arr32 = np.asarray(values, dtype=np.float32)
    decoded = unpack(impl.frame_multivector(arr32, rows, cols, dtype=dtype))["multivector"]
    assert (decoded["token_dims"], decoded["num_tokens"], decoded["dtype"]) == (cols, rows, dtype)
    arr = sentinel_array(decoded["values"])
    assert arr.shape == (rows, cols)
    with np.errstate(over="ignore"):
        expected = arr32.astype(np.float16) if dtype == "float16" else arr32
    assert arr.dtype == expected.dtype
    assert arr.tobytes() == expected.tobytes()
    if dtype == "float16":
        pre = impl.frame_multivector(None, rows, cols, dtype="float16", values_f16=expected.tobytes())
        if rows * cols:
            assert pre == impl.frame_multivector(arr32, rows, cols, dtype="float16")


@fixture_ok
@given(scores=st.lists(st.floats(width=32, allow_nan=False), max_size=40))
def test_score_round_trip(impl: ModuleType, scores: list[float]) -> None:
    ids = [f"item-{i}" for i in range(len(scores))]
    decoded = unpack(impl.frame_score(np.asarray(scores, dtype=np.float32), ids))
    widened = [float(np.float32(s)) for s in scores]
    order = sorted(range(len(scores)), key=widened.__getitem__, reverse=True)
    assert [e["item_id"] for e in decoded] == [ids[i] for i in order]
    assert [e["rank"] for e in decoded] == list(range(len(scores)))
    got = [struct.pack(">d", e["score"]) for e in decoded]
    assert got == [struct.pack(">d", widened[i]) for i in order]


def check_f16_against_numpy(impl: ModuleType, bits: list[int]) -> None:
    """f32_to_f16 equals numpy's cast bit for bit; NaNs only need to stay NaNs of the same sign."""
    arr = np.asarray(bits, dtype=np.uint32).view(np.float32)
    got = np.frombuffer(impl.f32_to_f16(arr), dtype="<u2")
    with np.errstate(over="ignore", invalid="ignore"):
        want = arr.astype(np.float16).view(np.uint16)
    assert got.shape == want.shape
    for g, w, x in zip(got.tolist(), want.tolist(), arr.tolist(), strict=True):
        if math.isnan(x):
            # NaN payload handling may differ (quiet bit); both must be a NaN of the same sign.
            assert g & 0x7C00 == 0x7C00 and g & 0x03FF != 0
            assert g & 0x8000 == w & 0x8000
        else:
            assert g == w, f"{x!r}: {g:#06x} != {w:#06x}"


@fixture_ok
@given(bits=st.lists(st.integers(0, 2**32 - 1), max_size=256))
def test_f32_to_f16_matches_numpy_bits(impl: ModuleType, bits: list[int]) -> None:
    check_f16_against_numpy(impl, bits)


@fixture_ok
@given(
    bits=st.lists(
        st.one_of(
            st.integers(0, 0x00FF_FFFF),  # f32 subnormals and tiny normals (all flush to half zero/subnormal)
            st.integers(0x3300_0000, 0x3880_0000),  # around the half subnormal range
            st.integers(0x4770_0000, 0x4780_0000),  # around the half overflow threshold
            st.integers(0x7F80_0000, 0x7FFF_FFFF),  # inf and NaN patterns
        ).flatmap(lambda b: st.sampled_from([b, b | 0x8000_0000])),
        max_size=64,
    )
)
def test_f32_to_f16_edge_bits_match_numpy(impl: ModuleType, bits: list[int]) -> None:
    check_f16_against_numpy(impl, bits)


def test_errors_are_wire_errors() -> None:
    assert issubclass(ShapeError, WireError)
