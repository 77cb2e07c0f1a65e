# SPDX-License-Identifier: Apache-2.0
"""docs/spec-coverage.md stays true: every test it names exists, every spec section it covers names a
test (unless out of scope), every section and TV-* vector of the spec files is in it, and its Counts
table matches its rows."""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "spec-coverage.md"
SPEC_DIR = ROOT.parent / "shared" / "spec"
SPEC_FILES = ("sidecar-behaviour.md", "wire-protocol.md", "scheduler-and-prep.md", "test-vectors.md")
STATES = ("exact", "deliberate difference", "out of scope", "partial", "absent")
#: States whose row must say why (the reason, or what is missing).
EXPLAINED = ("deliberate difference", "partial", "absent")
NO_TEST = ("none", "documented")

REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
TV_HEADING = re.compile(r"^### (TV-[A-Z]\d+)\b")
SPEC_SECTION = re.compile(r"^(?:## (?:(\d+)\.|(Appendix [A-Z])\.)|### (\d+\.\d+)) ")
DOC_TOP = re.compile(r"^## (\S+\.md) (.*)$")
DOC_KEY = re.compile(r"^(?:§(\d+(?:\.\d+)?)|(Appendix [A-Z])\.)(?: |$)")


@dataclass
class Section:
    """One `##` section of the document, with its `###` headings and every line under it."""

    heading: str
    spec_file: str | None  # the spec file it covers; None for this document's own sections
    lines: list[str] = field(default_factory=list)
    subheadings: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def out_of_scope(self) -> bool:
        return "out of scope" in self.heading


@cache
def doc_text() -> str:
    """The document, read once."""
    return DOC.read_text(encoding="utf-8")


@cache
def sections() -> tuple[Section, ...]:
    """The document split at its `##` headings."""
    found: list[Section] = []
    for line in doc_text().splitlines():
        if line.startswith("## "):
            top = DOC_TOP.match(line)
            spec_file = top.group(1) if top is not None and top.group(1) in SPEC_FILES else None
            found.append(Section(line, spec_file))
        elif found:
            found[-1].lines.append(line)
            if line.startswith("### "):
                found[-1].subheadings.append(line)
    return tuple(found)


def spec_sections() -> tuple[Section, ...]:
    """The sections that cover a spec file."""
    return tuple(s for s in sections() if s.spec_file is not None)


def rows(section: Section) -> list[list[str]]:
    """The table rows of a section, as stripped cells, without header and separator lines."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.lines
        if line.startswith("| ") and not line.startswith("| Row |") and not line.startswith("| State |")
    ]


@cache
def top_level_functions(path: Path) -> frozenset[str]:
    """Names of the module-level functions (sync or async) of a test file, read with `ast`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def references() -> list[tuple[str, str]]:
    """Every backticked `tests/<dir>/<file>.py::<function>` of the document, in order."""
    return [(m.group(1), m.group(2)) for m in REF.finditer(doc_text())]


def spec_path(name: str) -> Path:
    """A spec file; the test is skipped when the spec directory is not beside the repository."""
    if not SPEC_DIR.is_dir():
        pytest.skip(f"no spec directory at {SPEC_DIR}")
    return SPEC_DIR / name


def test_the_document_names_tests_and_covers_each_spec_file() -> None:
    assert len(references()) > 100
    assert {s.spec_file for s in spec_sections()} == set(SPEC_FILES)


def test_every_named_test_exists() -> None:
    """Each reference is a file under tests/ with a top-level function of that name."""
    missing = []
    for file, name in references():
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
        elif name not in top_level_functions(path):
            missing.append(f"{file}::{name}")
    assert missing == []


def test_every_spec_section_names_a_test() -> None:
    """A `##` spec section names at least one test unless it is marked out of scope."""
    bare = [s.heading for s in spec_sections() if not s.out_of_scope and REF.search(s.text) is None]
    assert bare == []


def test_every_row_has_a_state_a_proof_and_a_reason() -> None:
    """Four cells; a known state; tests that are references, `none` or `documented`; `exact` never
    without a test or a statement; a reason for every difference, partial or absent row."""
    wrong = []
    for section in spec_sections():
        for cells in rows(section):
            if len(cells) != 4:
                wrong.append(f"{section.heading}: {len(cells)} cells in {cells[:1]}")
                continue
            row, state, tests, notes = cells
            parts = tests.split(", ")
            if state not in STATES:
                wrong.append(f"{row}: state {state!r}")
            if tests not in NO_TEST and not all(REF.fullmatch(part) for part in parts):
                wrong.append(f"{row}: tests {tests!r}")
            if state == "exact" and tests == "none":
                wrong.append(f"{row}: exact without a test")
            if state in EXPLAINED and not notes:
                wrong.append(f"{row}: {state} without a note")
    assert wrong == []


def test_the_counts_match_the_rows() -> None:
    counted = Counter(cells[1] for section in spec_sections() for cells in rows(section))
    (summary,) = (s for s in sections() if s.heading == "## Counts")
    stated = {cells[0]: int(cells[1]) for cells in rows(summary)}
    assert stated == {**{state: counted[state] for state in STATES}, "total": sum(counted.values())}


def covered_keys() -> set[tuple[str, str]]:
    """(spec file, section key) for each `##` and `###` heading of the document (`§4`, `§4.1`, `Appendix A`)."""
    keys: set[tuple[str, str]] = set()
    for section in spec_sections():
        assert section.spec_file is not None
        top = DOC_TOP.match(section.heading)
        assert top is not None
        for rest in (top.group(2), *(h.removeprefix("### ") for h in section.subheadings)):
            key = DOC_KEY.match(rest)
            if key is not None:
                keys.add((section.spec_file, (key.group(1) and f"§{key.group(1)}") or key.group(2)))
    return keys


@pytest.mark.parametrize("name", SPEC_FILES)
def test_every_section_of_the_spec_files_is_covered(name: str) -> None:
    """Every numbered `##` / `###` heading (and appendix) of a spec file has its heading here."""
    expected: set[tuple[str, str]] = set()
    for line in spec_path(name).read_text(encoding="utf-8").splitlines():
        m = SPEC_SECTION.match(line)
        if m is not None:
            top, appendix, sub = m.groups()
            expected.add((name, f"§{top}" if top else appendix if appendix else f"§{sub}"))
    assert expected
    assert expected - covered_keys() == set()


def test_every_test_vector_is_in_the_doc() -> None:
    """Each `### TV-…` heading of test-vectors.md names a row of this document."""
    vectors = [
        m.group(1)
        for line in spec_path("test-vectors.md").read_text(encoding="utf-8").splitlines()
        if (m := TV_HEADING.match(line)) is not None
    ]
    assert len(vectors) > 50
    assert [v for v in vectors if re.search(rf"\| {re.escape(v)}\b", doc_text()) is None] == []
