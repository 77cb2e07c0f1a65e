# SPDX-License-Identifier: Apache-2.0
"""`PullConsumer._take`: a pull batch takes the oldest buffered deliveries, in order, and leaves the
rest buffered in order (the partial take calls `deque.popleft` from C, docs/benchmarks.md issue 32)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.bus.pull import PullConsumer


@given(buffered=st.lists(st.integers(), max_size=200), n=st.integers(-3, 260))
def test_a_take_is_the_oldest_n_in_order_and_the_rest_stay(buffered: list[int], n: int) -> None:
    consumer: Any = SimpleNamespace(_buffer=deque(buffered))
    taken: list[Any] = PullConsumer._take(consumer, n)
    cut = max(0, min(n, len(buffered)))
    assert taken == buffered[:cut]
    assert list(consumer._buffer) == buffered[cut:]
