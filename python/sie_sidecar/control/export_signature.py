# SPDX-License-Identifier: Apache-2.0
"""The export signature (sidecar-behaviour §9.3): a digest of what one export would write to the
backend, so a periodic export that would change nothing sends no IPC (`no_change`).

v0.7.1 uses BLAKE3; this project hashes with hashlib only, so it is SHA-256 over the same
length-prefixed fields: the bundle, the control-plane hash ("" when none), the entry count as a
little-endian u64, then each entry's model id and config sorted by (model_id, model_config), every
string prefixed by its UTF-8 byte length as a little-endian u64; the bundle's adapter modules (newer
than v0.7.1) follow the same way, after a presence byte. The signature is local: it is compared only
with this process's last successful export and never leaves the process, so the different hash
function is invisible to every peer.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def _field(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def export_signature(
    bundle: str, bundle_hash: str, entries: Sequence[tuple[str, str]], adapters: Sequence[str] | None = None
) -> str:
    """Lowercase hex SHA-256 of the export's fields (entries are `(model_id, model_config)`)."""
    parts = [_field(bundle), _field(bundle_hash), struct.pack("<Q", len(entries))]
    for model_id, config in sorted(entries):
        parts += (_field(model_id), _field(config))
    if adapters is None:
        parts.append(b"\x00")
    else:
        parts += (b"\x01", struct.pack("<Q", len(adapters)), *(_field(a) for a in adapters))
    return hashlib.sha256(b"".join(parts)).hexdigest()


__all__ = ["export_signature"]
