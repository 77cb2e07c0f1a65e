# SPDX-License-Identifier: Apache-2.0
"""A local-ingest request body and the item rules of sidecar-behaviour §11.

Every body field is defaulted on decode and unknown fields are ignored; a field of the wrong type is
a `ValueError`. `check_items` applies the item rules to a `publish_work` or
`publish_generate_stream` body in one native call (the twin without the extension) and gives back
each slot's bytes with its reply subject bound.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..errors import InvalidTransportBinding
from ..wire._switch import load
from .digest import DIGEST_SIZE, payload_digest

#: `publish_work` waits at most this long; 0 means this default (§11).
MAX_TIMEOUT_MS: Final = 300_000
_STR_FIELDS: Final = ("lane", "endpoint", "model", "engine", "admission_pool", "bundle_config_hash", "request_id")
_BIN_FIELDS: Final = ("params", "items", "dispatch_context", "payload_digest")
_TRACE_MAX: Final = 512


@dataclass(frozen=True, slots=True)
class Body:
    """The fields of a `publish_work` / `publish_generate_stream` body (§11)."""

    lane: str = ""
    endpoint: str = ""
    model: str = ""
    engine: str = ""
    admission_pool: str = ""
    bundle_config_hash: str = ""
    request_id: str = ""
    params: bytes = b""
    items: bytes = b""
    dispatch_context: bytes = b""
    payload_digest: bytes = b""
    timeout_ms: int = 0
    traceparent: str | None = None
    tracestate: str | None = None

    @classmethod
    def decode(cls, raw: dict[Any, Any]) -> Body:
        values: dict[str, Any] = {}
        for keys, kind, what in ((_STR_FIELDS, str, "a string"), (_BIN_FIELDS, bytes, "binary")):
            for key in keys:
                value = raw.get(key)
                if value is None:
                    continue
                if not isinstance(value, kind):
                    raise ValueError(f"body field {key} must be {what}")
                values[key] = value
        timeout = raw.get("timeout_ms")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int) or not -(2**63) <= timeout < 2**63:
                raise ValueError("body field timeout_ms must be an i64")
            values["timeout_ms"] = timeout
        for key in ("traceparent", "tracestate"):  # ignored when too long or not strings
            value = raw.get(key)
            if isinstance(value, str) and len(value.encode()) <= _TRACE_MAX:
                values[key] = value
        return cls(**values)

    @property
    def lane_pool(self) -> str:
        """The queue pool of the lane (`<pool>|<machine-profile>|<bundle>`), trimmed and lowercase."""
        return self.lane.split("|", 1)[0].strip().lower()

    def check_binding(self) -> None:
        """The dispatch context must be non-empty and the digest must bind the body (TV-L3)."""
        if not self.dispatch_context:
            raise InvalidTransportBinding("dispatch_context is empty")
        if len(self.payload_digest) != DIGEST_SIZE:
            raise InvalidTransportBinding(f"payload_digest must be {DIGEST_SIZE} bytes")
        expected = payload_digest(
            dispatch_context=self.dispatch_context,
            lane=self.lane,
            endpoint=self.endpoint,
            model=self.model,
            engine=self.engine,
            admission_pool=self.admission_pool,
            bundle_config_hash=self.bundle_config_hash,
            request_id=self.request_id,
            params=self.params,
            items=self.items,
            timeout_ms=self.timeout_ms,
        )
        if not hmac.compare_digest(expected, self.payload_digest):
            raise InvalidTransportBinding("payload_digest does not match the request")

    def publish_timeout_ms(self) -> int:
        """`publish_work`'s wait: 0..300000 ms, 0 meaning 300000 (§11)."""
        if not 0 <= self.timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"timeout_ms must be 0..{MAX_TIMEOUT_MS}, got {self.timeout_ms}")
        return self.timeout_ms or MAX_TIMEOUT_MS


Checker = Callable[..., tuple[list[bytes], list[int], list[bool]]]


#: The item rules in the native core (`_native.check_local_items`), or its twin (`_twins.local_items`).
_check_local_items: Checker = load("local_items").check_local_items


@dataclass(frozen=True, slots=True)
class Slots:
    """The checked items of one request, column-wise (no object per item): each item's msgpack bytes
    with its reply subject bound, its `item_index`, and whether its admission pool agrees with the
    body's and the lane's."""

    datas: list[bytes]
    indexes: list[int]
    admitted: list[bool]

    def __len__(self) -> int:
        return len(self.datas)


def check_items(body: Body, reply_prefix: str, *, numbered: bool = True, checker: Checker | None = None) -> Slots:
    """The §11 item rules in one native call per request (`ValueError` names the rule and the slot);
    each item's `reply_subject` becomes `{reply_prefix}{slot}` (`reply_prefix` alone if not
    `numbered`). Nothing is decoded into Python values per field: intake decodes the items later,
    exactly as it decodes NATS deliveries. `checker`: the native core or its twin explicitly (the
    parity tests); by default the one `SIE_SIDECAR_NO_EXTENSIONS` selects."""
    datas, indexes, admitted = (checker or _check_local_items)(
        body.items,
        request_id=body.request_id,
        endpoint=body.endpoint,
        model=body.model,
        engine=body.engine,
        bundle_config_hash=body.bundle_config_hash,
        admission_pool=body.admission_pool.strip().lower(),
        lane_pool=body.lane_pool,
        reply_prefix=reply_prefix,
        numbered=numbered,
    )
    return Slots(datas, indexes, admitted)


__all__ = ["MAX_TIMEOUT_MS", "Body", "Checker", "Slots", "check_items"]
