# SPDX-License-Identifier: Apache-2.0
"""Two house rules over the package's import graph (issue 33): no import circles but type checkers'
ones, and no module importing another's private names. Each is fed a breaking case, so it cannot
pass vacuously.

There are no exceptions: the start-up and drain code the NATS and local ingest modes once shared by
importing each other (`app` and `local/runtime`) is one `runtime/` package, and what its modules
share has public names. `KNOWN_*` below stay empty; an entry there is a debt, and the tests say so
when a listed exception disappears.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from .imports import PACKAGE_DIR, module_exists, module_name, package_edges

#: Circles still present (none).
KNOWN_CIRCLES: frozenset[frozenset[str]] = frozenset()
#: (importer, exporter, name) of private names still imported across modules (none).
KNOWN_PRIVATE: frozenset[tuple[str, str, str]] = frozenset()


def import_graph(edges: Iterable[tuple[str, str]], modules: set[str]) -> dict[str, set[str]]:
    """Module -> the package modules it imports at run time. A target that names an attribute of a
    module counts as that module; importing a package's submodule is not an import of the package."""
    graph: dict[str, set[str]] = {}
    for module, imported in edges:
        target = imported
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module and not module.startswith(target + "."):
            graph.setdefault(module, set()).add(target)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def private_imports(path: Path) -> list[tuple[str, str, str]]:
    """(importer, exporter, name) for each `_name` one module imports from another package module;
    a private submodule (`from .. import _native`) is a module, not a private name."""
    me = module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if not target.startswith("sie_sidecar"):
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not name.startswith("__") and not module_exists(f"{target}.{name}"):
                out.append((me, target, name))
    return out


def _package_modules() -> set[str]:
    return {module_name(p) for p in PACKAGE_DIR.rglob("*.py")}


def test_no_import_circles_but_type_checkers() -> None:
    edges = [(e.module, e.target) for e in package_edges() if not e.type_only and e.target.startswith("sie_sidecar")]
    found = set(circles(import_graph(edges, _package_modules())))
    assert found - KNOWN_CIRCLES == set(), "new import circles"
    assert KNOWN_CIRCLES - found == set(), "a known circle is gone: take it off KNOWN_CIRCLES"


def test_the_circle_finder_finds_a_circle_and_ignores_package_imports() -> None:
    modules = {"p", "p.a", "p.b", "p.c"}
    graph = import_graph([("p.a", "p.b"), ("p.b", "p.c.name"), ("p.c", "p.a"), ("p.a", "p")], modules)
    assert circles(graph) == [frozenset({"p.a", "p.b", "p.c"})]
    assert circles(import_graph([("p.a", "p.b"), ("p.b", "p")], modules)) == []


def test_no_module_imports_anothers_private_names() -> None:
    found = {hit for path in sorted(PACKAGE_DIR.rglob("*.py")) for hit in private_imports(path)}
    assert found - KNOWN_PRIVATE == set(), "private names imported across modules"
    assert KNOWN_PRIVATE - found == set(), "a known private import is gone: take it off KNOWN_PRIVATE"


def test_the_private_name_rule_catches_a_breaking_import() -> None:
    probe = PACKAGE_DIR / "pipeline" / "_probe_private.py"
    assert not probe.exists()
    try:
        probe.write_text("from .dispatcher import _warn\nfrom .. import _native\n")
        found = private_imports(probe)
        assert found == [("sie_sidecar.pipeline._probe_private", "sie_sidecar.pipeline.dispatcher", "_warn")]
    finally:
        probe.unlink()
