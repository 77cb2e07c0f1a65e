"""Fixtures the unit tests of the probes share: a readiness and a probe server on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.probes import ProbeServer, start_probes


@pytest.fixture
def readiness() -> Readiness:
    return Readiness()


@pytest.fixture
async def server(readiness: Readiness) -> AsyncIterator[ProbeServer]:
    started = await start_probes(readiness, 0, host="127.0.0.1")
    assert started is not None
    try:
        yield started
    finally:
        await started.cleanup()
