# SPDX-License-Identifier: Apache-2.0
"""One native switch (issue 33): every pure-Python twin of the compiled core lives under `_twins/`,
chosen by `wire._switch`, never beside the code it serves. A twin is spotted by its name: a function
or method ending in `_py` anywhere else in the package fails here, read from the source with `ast`.

A twin the runtime also runs beside its native kernel is loaded from `_twins/` all the same
(`twin(name)`); a parity test imports the twin from `_twins/` or takes it from the switch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .imports import PACKAGE_DIR, module_name

TWINS_DIR = PACKAGE_DIR / "_twins"


def twin_names(path: Path) -> list[tuple[str, str, int]]:
    """(module, qualified name, line) of each function or method of one source file whose name ends
    in `_py`, nested ones included."""
    me = module_name(path)
    out: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if child.name.endswith("_py"):
                    out.append((me, ".".join((*scope, child.name)), child.lineno))
                visit(child, (*scope, child.name))
            elif isinstance(child, ast.ClassDef):
                visit(child, (*scope, child.name))
            else:
                visit(child, scope)

    visit(ast.parse(path.read_text(), filename=str(path)), ())
    return out


def twins_outside(paths: list[Path]) -> list[tuple[str, str, int]]:
    """`twin_names` of every file given that is not under `_twins/`."""
    return [hit for path in paths if not path.is_relative_to(TWINS_DIR) for hit in twin_names(path)]


def test_every_twin_lives_in_twins() -> None:
    found = twins_outside(sorted(PACKAGE_DIR.rglob("*.py")))
    outside = sorted(f"{module}:{line} {name}" for module, name, line in found)
    assert outside == [], "a twin (`*_py`) outside _twins/: move it there, behind wire._switch"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def thing_py(): ...\n", ["thing_py"]),
        ("async def thing_py() -> None: ...\n", ["thing_py"]),
        ("class Stage:\n    def _run_py(self) -> None: ...\n", ["Stage._run_py"]),
        ("def outer() -> None:\n    def inner_py() -> None: ...\n", ["outer.inner_py"]),
        ("if True:\n    def thing_py(): ...\n", ["thing_py"]),
        ("def happy(): ...\nthing_py = 1\n", []),
    ],
)
def test_the_rule_catches_a_twin_outside_twins(source: str, expected: list[str]) -> None:
    """A rule that cannot fail proves nothing: a probe module under pipeline/ defining a twin is
    reported (and the same module under `_twins/` is not)."""
    for relpath, outside in (("pipeline/_probe_twin.py", True), ("_twins/_probe_twin.py", False)):
        path = PACKAGE_DIR / relpath
        assert not path.exists()
        try:
            path.write_text(source)
            found = twins_outside([path])
        finally:
            path.unlink()
        module = module_name(path)
        assert [(m, name) for m, name, _ in found] == ([(module, name) for name in expected] if outside else []), found
