# SPDX-License-Identifier: Apache-2.0
"""WorkItems as the v0.7.1 gateway writes them (wire-protocol §7.2), for the benches that must measure the
gateway's work rather than a lighter one (issue 30).

What makes them the gateway's and not the load generator's:
- every "always" row of §7.2 present, in the gateway's order, most of them nil;
- `item` is `{"id": ..., "text": ...}` (the SDK's item with its id) and `engine` is `"pytorch"`;
- a UUID-shaped `request_id`, one request per item, so one reply subject `_INBOX.<router>.<request_id>`
  per request;
- texts of 32-256 random printable bytes (seeded), not a handful of repeating sentences, so nothing
  downstream can lean on repeated strs.
"""

from __future__ import annotations

import random
import string
import time
import uuid
from typing import Any

#: What one text is drawn from: printable ASCII without the characters that need escaping in logs.
_ALPHABET = string.ascii_letters + string.digits + " .,;:-_!?'()"


def gateway_texts(count: int = 1024, *, min_bytes: int = 32, max_bytes: int = 256, seed: int = 0) -> tuple[str, ...]:
    """`count` texts whose lengths are uniform in [min_bytes, max_bytes], of seeded random printable bytes."""
    if count < 1 or not 1 <= min_bytes <= max_bytes:
        raise ValueError("gateway texts need count >= 1 and 1 <= min_bytes <= max_bytes")
    rng = random.Random(seed)
    return tuple("".join(rng.choices(_ALPHABET, k=rng.randint(min_bytes, max_bytes))) for _ in range(count))


def gateway_request_id(prefix: int, index: int) -> str:
    """A UUID-shaped request id (the gateway writes UUIDv7 strings), unique per (prefix, index)."""
    return str(uuid.UUID(int=(prefix << 64) | index))


def gateway_work_item(
    *,
    request_id: str,
    text: str,
    model: str,
    pool: str,
    machine_profile: str,
    router_id: str,
    timestamp: float,
    item_id: str | None = None,
) -> dict[str, Any]:
    """One encode WorkItem of a one-item request, every v0.7.1 "always" row in the gateway's order (§7.2)."""
    return {
        "work_item_id": f"{request_id}.0",
        "request_id": request_id,
        "item_index": 0,
        "total_items": 1,
        "operation": "encode",
        "model_id": model,
        "profile_id": "default",
        "engine": "pytorch",
        "pool_name": pool,
        "machine_profile": machine_profile,
        "item": {"id": item_id if item_id is not None else request_id, "text": text},
        "payload_ref": None,
        "output_types": ["dense"],
        "instruction": None,
        "is_query": False,
        "options": None,
        "query_item": None,
        "query_payload_ref": None,
        "score_items": None,
        "labels": None,
        "output_schema": None,
        "bundle_config_hash": "",
        "router_id": router_id,
        "reply_subject": f"_INBOX.{router_id}.{request_id}",
        "timestamp": float(timestamp),
        "accepts_result_chunks": True,
    }


def bench_payload(model: str, tag: int, index: int, text: str) -> bytes:
    """One gateway WorkItem's msgpack for the in-process benches: pool `default`, profile `cpu`, router
    `gw`, request id `gateway_request_id(tag, index)`."""
    import msgpack

    item = gateway_work_item(
        request_id=gateway_request_id(tag, index),
        text=text,
        model=model,
        pool="default",
        machine_profile="cpu",
        router_id="gw",
        timestamp=time.time(),
    )
    return bytes(msgpack.packb(item, use_bin_type=True))
