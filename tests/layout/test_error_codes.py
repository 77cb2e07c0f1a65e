# SPDX-License-Identifier: Apache-2.0
"""Every WorkResult error code is named once, in `errors.py`: no module spells one as a literal."""

from __future__ import annotations

import ast

from sie_sidecar import errors

from .imports import PACKAGE_DIR

CODES = {
    value
    for name, value in vars(errors).items()
    if name.isupper() and isinstance(value, str) and not name.startswith("_")
}


def literal_codes() -> list[str]:
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path == PACKAGE_DIR / "errors.py":
            continue
        tree = ast.parse(path.read_text())
        exported = {  # `__all__` holds names, and a constant may share its name with a code's value
            id(node)
            for stmt in ast.walk(tree)
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
            for node in ast.walk(stmt.value)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in CODES and id(node) not in exported:
                found.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} {node.value!r}")
    return found


def test_the_codes_are_known() -> None:
    assert {"bad_operation", "MODEL_LOAD_FAILED", "payload_error", "PAYLOAD_TOO_LARGE", "invalid_request"} <= CODES


def test_no_error_code_is_spelled_outside_errors_py() -> None:
    assert literal_codes() == []


#: Rooms with exceptions of their own: the library backends embed, and the user-facing tools.
OWN_EXCEPTIONS = {"backend", "tools"}


def exceptions_outside_errors_py() -> list[str]:
    """Public exception classes the runtime defines anywhere but errors.py (private ones, `_Name`,
    are a module's own control flow and stay where they are)."""
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if path == PACKAGE_DIR / "errors.py" or rel.parts[0] in OWN_EXCEPTIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(b) for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Timeout")) for b in bases):
                    found.append(f"{rel}:{node.lineno} {node.name}")
    return found


def test_every_exception_of_the_runtime_lives_in_errors_py() -> None:
    assert exceptions_outside_errors_py() == []
