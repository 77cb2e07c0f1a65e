# SPDX-License-Identifier: Apache-2.0
"""The telemetry registry's histogram (`_native.Histogram`, sie-core `histogram`) and a lane's
per-batch set of them (`BatchInstruments`), compiled unless this process runs the twins
(`_twins.histogram`): one switch for them, as for the wire core."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._switch import load

if TYPE_CHECKING:
    from .._native import BatchInstruments, Histogram
else:
    _impl = load("histogram")
    Histogram = _impl.Histogram
    BatchInstruments = _impl.BatchInstruments

__all__ = ["BatchInstruments", "Histogram"]
