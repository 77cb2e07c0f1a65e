# SPDX-License-Identifier: Apache-2.0
"""The config gate (sidecar-behaviour §5.5): an item carrying a bundle-config hash runs only while that
hash is the worker's current one. Checked at intake and again right before execution; the live
config of a later issue moves `current` under the execution barrier."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..wire.workitem import WorkItem


class ConfigState:
    """The worker's advertised bundle-config hash; `None` until one is known (then every hash passes)."""

    def __init__(self, initial: str = "") -> None:
        self.current: str | None = initial or None

    def accepts(self, item_hash: str) -> bool:
        """An empty (legacy) hash always passes; otherwise it must equal the current one."""
        return not item_hash or self.current is None or item_hash == self.current

    def accepts_all(self, items: Iterable[WorkItem | None]) -> bool:
        """`accepts` for every item; one attribute read per item only while a hash is current."""
        current = self.current
        if current is None:
            return True
        return all(item is None or not item.bundle_config_hash or item.bundle_config_hash == current for item in items)

    def adopt(self, backend_hash: str) -> None:
        """Take the backend's hash when the worker has none yet (first ready Ping)."""
        if self.current is None and backend_hash:
            self.current = backend_hash


__all__ = ["ConfigState"]
