# SPDX-License-Identifier: Apache-2.0
"""The package's import graph, read from the source with `ast` (nothing is imported)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "python" / "sie_sidecar"


@dataclass(frozen=True, slots=True)
class ImportEdge:
    """One import statement: who imports what, where, and whether only type checkers see it."""

    module: str  # importing module, e.g. "sie_sidecar.pipeline.dispatcher"
    target: str  # imported module (absolute), e.g. "sie_sidecar.bus.publisher" or "nats.aio.client"
    line: int
    type_only: bool


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def edges_of(path: Path) -> list[ImportEdge]:
    """Every import of one source file, relative ones resolved against its package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    type_only = _type_checking_lines(tree)
    out: list[ImportEdge] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [ImportEdge(me, a.name, node.lineno, node.lineno in type_only) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import sub` names a submodule: record the submodule itself when it exists.
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                is_sub = target.startswith("sie_sidecar") and module_exists(sub)
                out.append(ImportEdge(me, sub if is_sub else target, node.lineno, node.lineno in type_only))
    return out


def module_exists(module: str) -> bool:
    """Whether `module` (dotted, under sie_sidecar) is a module or package of the source tree."""
    rel = Path(*module.split(".")[1:])
    base = PACKAGE_DIR / rel
    return any(p.exists() for p in (base.with_suffix(".py"), base / "__init__.py", base / "__init__.pyi"))


def package_edges() -> list[ImportEdge]:
    """The import edges of every module of the package."""
    return [e for path in sorted(PACKAGE_DIR.rglob("*.py")) for e in edges_of(path)]


def room_of(module: str) -> str:
    """The room a module lives in: its first level under `sie_sidecar` (`bus`, `pipeline`, `app`...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""
