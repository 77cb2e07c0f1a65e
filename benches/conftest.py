# SPDX-License-Identifier: Apache-2.0
"""Benchmark fixtures: both implementations side by side, realistic payloads built once."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest


@pytest.fixture(params=["native", "py"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The implementation under measurement; reports group them so ratios come from one run."""
    name = "sie_sidecar.wire._native_api" if request.param == "native" else "sie_sidecar._twins.wire"
    return importlib.import_module(name)
