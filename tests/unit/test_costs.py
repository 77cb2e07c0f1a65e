# SPDX-License-Identifier: Apache-2.0
"""The score cost proxy (scheduler-and-prep §2.2), with the spec's worked examples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.sched.costs import score_cost, side_cost


def test_spec_examples() -> None:
    assert score_cost({"text": "hello"}, [{"text": "abc"}, {"images": [{"data": b"x"}]}]) == (5 + 3) + (5 + 1024)
    assert score_cost({"images": [1, 2]}, [{"text": "0123456789"}] * 3) == 3 * (2048 + 10)


def test_zero_documents_cost_one_and_aliases_and_bin_keys_count() -> None:
    assert score_cost({"text": "long query"}, []) == 1
    assert side_cost({"content": "héllo"}) == 5  # Unicode scalar values, not bytes
    assert side_cost({b"text": "abc", b"document": {"data": b""}}) == 3 + 1024
    assert side_cost({"text": b"\xff", "content": "ignored"}) == 0  # `text` present but not a string
    assert side_cost({"audio": None, "video": {}}) == 1024  # null media do not count
    assert side_cost("not a map") == 0


@given(q=st.text(max_size=20), docs=st.lists(st.text(max_size=20), max_size=10))
def test_the_query_is_paid_once_per_document(q: str, docs: list[str]) -> None:
    cost = score_cost({"text": q}, [{"text": d} for d in docs])
    assert cost == (max(1, sum(len(q) + len(d) for d in docs)) if docs else 1)
