# SPDX-License-Identifier: Apache-2.0
"""wire-protocol §0 rule 6: a WorkItem's `options` and `output_schema` are JSON-shaped (the Rust side
decodes them as JSON values), so a bin or ext value anywhere inside them makes the WorkItem
undecodable, which intake NAKs with the base delay (sidecar-behaviour §4.1 row 3). Item payloads
(`item`, `query_item`, `score_items`) stay raw msgpack: bin and ext are theirs to carry.
Both decoders refuse with the same message: the twin (`decode_work_item_py`, `json_shape_error`) and
the native one (`json_shape_violation` in native/py/src/workitem.rs; the lazy parser leaves such an
item to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar._twins.workitem import decode_work_item as decode_work_item_py
from sie_sidecar.errors import WorkItemError
from sie_sidecar.wire.workitem import WorkItem, json_shape_error

from ..pipeline.memory import memory_pipeline
from ..pipeline.test_sequencing import _item, _msg

try:
    from sie_sidecar._native import decode_work_item as _native_decode

    def decode_native(data: bytes) -> WorkItem:
        return _native_decode(data, cls=WorkItem)  # type: ignore[no-any-return]

except ImportError:  # pragma: no cover - the native core is always built for the test suite
    decode_native = decode_work_item_py

BASE: dict[str, Any] = {
    "work_item_id": "r.0",
    "request_id": "r",
    "item_index": 0,
    "total_items": 1,
    "operation": "encode",
    "model_id": "m",
    "pool_name": "p",
    "machine_profile": "l4",
    "reply_subject": "_INBOX.gw.r",
}

#: Values that are not JSON-shaped, each at the top and nested in a map and an array.
NOT_JSON: dict[str, Any] = {
    "bin": b"\x00\x01",
    "ext": msgpack.ExtType(5, b"abc"),
    "timestamp": msgpack.Timestamp(1_700_000_000, 0),
}
#: JSON-shaped values (nested maps and arrays of str, numbers, bools and nil).
JSON: list[Any] = [
    {},
    {"lora": "a", "top_k": 3, "nested": {"list": [1, 2.5, True, None, "x"], "deep": {"a": []}}},
    {"schema": {"type": "object", "properties": {"name": {"type": "string"}}}},
]


def _packed(**fields: Any) -> bytes:
    return bytes(msgpack.packb(BASE | fields, use_bin_type=True))


def _bad_payloads() -> list[Any]:
    cases = []
    for key in ("options", "output_schema"):
        for name, value in NOT_JSON.items():
            for where, wrapped in (("in a map", {"k": value}), ("in an array", {"k": [1, {"deep": value}]})):
                cases.append(pytest.param(key, wrapped, id=f"{key}-{name}-{where}"))
            if key == "output_schema":  # `options` must be a map: a bare value is refused anyway
                cases.append(pytest.param(key, value, id=f"{key}-{name}-bare"))
    return cases


@pytest.mark.parametrize(("key", "value"), _bad_payloads())
def test_the_twin_refuses_bin_and_ext_in_options_and_output_schema(key: str, value: Any) -> None:
    with pytest.raises(WorkItemError, match=rf"^{key} must be JSON-shaped: (binary|ext) values are not allowed$"):
        decode_work_item_py(_packed(**{key: value}))


@pytest.mark.parametrize(("key", "value"), _bad_payloads())
def test_the_native_decoder_refuses_bin_and_ext_in_options_and_output_schema(key: str, value: Any) -> None:
    with pytest.raises(WorkItemError) as native:
        decode_native(_packed(**{key: value}))
    with pytest.raises(WorkItemError) as twin:
        decode_work_item_py(_packed(**{key: value}))
    assert str(native.value) == str(twin.value)


@pytest.mark.parametrize("decode", [decode_native, decode_work_item_py], ids=["native", "py"])
@pytest.mark.parametrize("value", JSON)
def test_json_shaped_options_and_schemas_decode_and_payloads_keep_their_binary(decode: Any, value: Any) -> None:
    payload = {"text": "x", "image": {"data": b"\x89PNG", "meta": msgpack.ExtType(1, b"e")}}
    item = decode(_packed(options=value, output_schema=value, item=payload, query_item=payload))
    assert (item.options, item.output_schema) == (value, value)
    assert item.item == item.query_item == payload


def test_json_shape_error_names_the_field_and_the_first_offending_kind() -> None:
    assert json_shape_error("options", {"a": [1, "x", None, {"b": 2.0}]}) is None
    assert json_shape_error("options", {"a": [b""]}) == "options must be JSON-shaped: binary values are not allowed"
    assert json_shape_error("output_schema", msgpack.ExtType(7, b"\0" * 4)) == (
        "output_schema must be JSON-shaped: ext values are not allowed"
    )


async def test_intake_naks_an_item_whose_options_carry_binary(tmp_path: Path) -> None:
    """§4.1 row 3 through the pipeline (the reference backend on its socket): the refused item is
    NAKed with the base delay and never reaches the backend; its neighbour is answered."""
    async with memory_pipeline(tmp_path, nak_delay_ms=700) as p:
        refused = _msg(_item("bin-options", options={"lora": b"\x00"}))
        schema = _msg(_item("ext-schema", output_schema={"x": msgpack.ExtType(3, b"z")}))
        fine = _msg(_item("fine", options={"lora": ""}))
        p.send([refused, schema, fine])
        await p.until_settled([refused, schema, fine])
        assert refused.final == schema.final == [("nak", 0.7)]
        assert fine.final == [("ack", None)]
        assert [r["work_item_id"] for _, r in p.sink.replies] == ["fine.0"]
        assert p.adapter.items == 1
