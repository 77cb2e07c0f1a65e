# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: every wire test runs against both implementations."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A wheel's smoke test runs the wire vectors under emulation (.ci/wheels.py smoke): a few examples each.
settings.register_profile("smoke", max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
settings.register_profile("fuzz", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

IMPLEMENTATIONS = ("native", "py")


def load_impl(name: str) -> ModuleType:
    """Import one implementation by its short name."""
    return importlib.import_module("sie_sidecar.wire._native_api" if name == "native" else "sie_sidecar._twins.wire")


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The implementation under test (native core or pure-Python twin)."""
    return load_impl(str(request.param))


@pytest.fixture
def native() -> ModuleType:
    return load_impl("native")


@pytest.fixture
def twin() -> ModuleType:
    return load_impl("py")
