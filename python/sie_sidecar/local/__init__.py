# SPDX-License-Identifier: Apache-2.0
"""Brokerless local ingest (sidecar-behaviour §11): the `SIE_SIDECAR_INGEST=local` listener, and the
asyncio client colocated callers, tests, the load generator and the demo use."""

from __future__ import annotations

from .client import Client, work_items

__all__ = ["Client", "work_items"]
