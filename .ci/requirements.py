#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Print the project's requirements from pyproject.toml, one per line, for `pip install -r /dev/stdin`.

The Makefile installs the development environment from this output, so pyproject.toml is the one
place a dependency is listed (`pip install sie-sidecar[dev]` gives contributors the same set).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The runtime dependencies, then each named extra's, without repeats."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    out: list[str] = list(project["dependencies"])
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"requirements.py: no extra {extra!r} in {pyproject} (have {sorted(optional)})")
        out.extend(req for req in optional[extra] if req not in out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="optional-dependency groups to add (e.g. dev)")
    args = parser.parse_args(argv)
    sys.stdout.write("".join(f"{req}\n" for req in requirements(args.extras)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
