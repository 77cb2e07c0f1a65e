# SPDX-License-Identifier: Apache-2.0
"""The telemetry registry's histogram, compiled (`_native.Histogram`, sie-core `histogram`) unless
this process runs the twins (`_twins.histogram`): one switch for it, as for the wire core."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._switch import load

if TYPE_CHECKING:
    from .._native import Histogram
else:
    Histogram = load("histogram").Histogram

__all__ = ["Histogram"]
