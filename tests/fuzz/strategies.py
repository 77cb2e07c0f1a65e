# SPDX-License-Identifier: Apache-2.0
"""Hypothesis strategies shared by the fuzz targets."""

from __future__ import annotations

from hypothesis import strategies as st

# msgpack markers that change how what follows is read: fix-, 8/16/32-bit and container headers,
# nil, bools, the reserved 0xc1, bin and ext headers.
INTERESTING_BYTES = [0x00, 0x7F, 0x80, 0x90, 0xC0, 0xC1, 0xC2, 0xC4, 0xCA, 0xCC, 0xD0, 0xDC, 0xDE, 0xFF]


@st.composite
def mutated(draw: st.DrawFn, source: bytes) -> bytes:
    """A valid byte string with a few random flips, insertions, deletions or a truncation."""
    data = bytearray(source)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from(INTERESTING_BYTES))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=6))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 6))]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


#: The smallest WorkItem both decoders accept: every required key, short values.
MINIMAL_WORK_ITEM: dict[str, object] = {
    "work_item_id": "r.0",
    "request_id": "r",
    "item_index": 0,
    "total_items": 1,
    "operation": "encode",
    "model_id": "m",
    "pool_name": "p",
    "machine_profile": "c",
    "reply_subject": "_INBOX.x",
}
