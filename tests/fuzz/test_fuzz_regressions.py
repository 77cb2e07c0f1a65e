# SPDX-License-Identifier: Apache-2.0
"""Every input the fuzz campaign (`benches/fuzz_campaign.py`, `make fuzz-campaign`) kept, replayed
through its target: no crash, and native and twin agree on valid / invalid (strict mode). Files live
in `tests/fuzz/regressions/<target>/`; a crash or divergence the campaign writes under
`.benchmarks/fuzz-findings/` is copied there once fixed.

The first 29 came from the first campaigns (2026-12-03): IPC response envelopes and BatchOutcomes
that the native decoders and the twins judged differently (a top-level key that is not a string:
refused natively, skipped by the twin; a key or an unread value that is not UTF-8: skipped natively,
refused by the twin's msgpack). The `work_item` ones (2026-12-03) are WorkItems the native decoder
and `decode_work_item_py` judged differently: a known key given twice, its first value of the wrong
type (the native decoder checks every occurrence; the twin's dict kept the last), an ext key of a
negative type code (skipped undecoded natively, refused by the twin's msgpack), and a value nested
129 deep (the native reader's limit is 128)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benches import fuzz_campaign

REGRESSIONS = Path(__file__).parent / "regressions"
CASES = sorted(p for p in REGRESSIONS.glob("*/*") if p.is_file())


def test_every_kept_input_names_a_target() -> None:
    assert CASES, "no regression inputs"
    assert {p.parent.name for p in CASES} <= set(fuzz_campaign.TARGETS)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name[:48]}")
def test_kept_input_replays_clean(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz_campaign._DIVERGENCES, "strict", True)
    fuzz_campaign.TARGETS[case.parent.name](case.read_bytes())
