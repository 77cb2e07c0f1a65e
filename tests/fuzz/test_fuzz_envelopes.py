# SPDX-License-Identifier: Apache-2.0
"""Fuzz the envelope and BatchOutcome decoders: only `WireError` subclasses may escape."""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar import errors

from .strategies import mutated

pytestmark = pytest.mark.fuzz
FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

TV_O1 = bytes.fromhex(
    "89ac776f726b5f6974656d5f6964a3722e30aa726571756573745f6964a172aa6974656d5f696e64657800ab646973706f736974696f6eb57075626c6973685f6572726f725f616e645f61636bac6e616b5f64656c61795f6d73c0ae726573756c745f6d73677061636bc0a56572726f72a4626f6f6daa6572726f725f636f6465af696e666572656e63655f6572726f72ac696e666572656e63655f6d73c0"
)
TV_I1_BODY = bytes.fromhex(
    "85a776657273696f6e01aa726571756573745f6964a7722d736d616c6ca26f6bc3a4626f647981a576616c756593010203a56572726f72c0"
)
TV_I6_BODY = bytes.fromhex(
    "88a776657273696f6e01aa726571756573745f6964a27231af7472616e736665725f646967657374c420c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225ab6368756e6b5f696e64657800ab6368756e6b5f636f756e7402ab746f74616c5f62797465731ca77061796c6f6164c40a616e2065786163742073a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"
)
FULL_OUTCOME = bytes(
    msgpack.packb(
        {
            "outcomes": [
                {
                    "work_item_id": "r.0",
                    "request_id": "r",
                    "item_index": 0,
                    "disposition": "nak_retry",
                    "nak_delay_ms": 10,
                    "result_msgpack": b"\x80",
                    "error": None,
                    "error_code": None,
                    "inference_ms": 1.5,
                    "tokenization_ms": None,
                    "postprocessing_ms": 2,
                    "raw_output": {"dense": {"values": [1.0], "dim": 1}},
                    "units": {"input_tokens": 1, "pages": None, "images": None, "audio_ms": 3, "pairs": None},
                    "retry_after_s": 1,
                }
            ],
            "batched_f16_multivectors": [
                {
                    "values_f16": b"\x00\x3c\x01\x80",
                    "items": [
                        {"work_item_id": "r.0", "byte_offset": 0, "byte_len": 4, "num_tokens": 1, "token_dims": 2}
                    ],
                }
            ],
        },
        use_bin_type=True,
    )
)
BATCH_TV_O1 = b"\x81\xa8outcomes\x91" + TV_O1


def decoders(impl: ModuleType) -> list[Any]:
    return [impl.decode_response, impl.decode_batch_outcome, impl.decode_body]


def only_wire_errors(impl: ModuleType, raw: bytes) -> None:
    for decode in decoders(impl):
        with contextlib.suppress(errors.WireError):
            decode(raw)
    try:
        env = impl.decode_response(raw)
        if isinstance(env, impl.ResponseEnvelope):
            impl.decode_batch_outcome(impl.response_body(env, env.request_id))
    except errors.WireError:
        pass


KEYS = [
    "outcomes",
    "batched_f16_multivectors",
    "work_item_id",
    "request_id",
    "item_index",
    "disposition",
    "nak_delay_ms",
    "result_msgpack",
    "error",
    "error_code",
    "inference_ms",
    "units",
    "raw_output",
    "retry_after_s",
    "values_f16",
    "items",
    "byte_offset",
    "version",
    "ok",
    "body",
    "kind",
    "payload",
    "transfer_digest",
    "chunk_index",
]
_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | st.sampled_from(["publish_and_ack", "nak_retry", "ipc_response_chunk_v1"])
)
_values = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(KEYS) | st.text(max_size=4) | st.integers(-(2**63), 2**63 - 1), inner, max_size=6
        )
    ),
    max_leaves=12,
)


@FIXTURE
@given(raw=st.binary(max_size=300))
def test_fuzz_decoders_random_bytes(impl: ModuleType, raw: bytes) -> None:
    only_wire_errors(impl, raw)


@FIXTURE
@given(raw=st.sampled_from([TV_O1, BATCH_TV_O1, FULL_OUTCOME, TV_I1_BODY, TV_I6_BODY]).flatmap(mutated))
def test_fuzz_decoders_mutated(impl: ModuleType, raw: bytes) -> None:
    only_wire_errors(impl, raw)


@FIXTURE
@given(value=_values)
def test_fuzz_decoders_structured(impl: ModuleType, value: Any) -> None:
    only_wire_errors(impl, bytes(msgpack.packb(value, use_bin_type=True)))


@FIXTURE
@given(outcome=st.dictionaries(st.sampled_from(KEYS), _values, max_size=10))
def test_fuzz_item_outcome_fields(impl: ModuleType, outcome: dict[str, Any]) -> None:
    base = {"work_item_id": "r.0", "request_id": "r", "item_index": 0, "disposition": "publish_and_ack"}
    raw = bytes(msgpack.packb({"outcomes": [base | outcome], "batched_f16_multivectors": [outcome]}, use_bin_type=True))
    with contextlib.suppress(errors.DecodeError):
        impl.decode_batch_outcome(raw)
