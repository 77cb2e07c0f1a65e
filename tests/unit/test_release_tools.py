# SPDX-License-Identifier: Apache-2.0
"""The release scripts' own logic (.ci/requirements.py, .ci/wheels.py): the dependency list has
one source, and the wheel checks catch what they exist to catch."""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

import sie_sidecar._native as native_module

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"ci_{name}", REPO / ".ci" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations through it
    spec.loader.exec_module(module)
    return module


requirements = load("requirements")
wheels = load("wheels")


def test_requirements_are_pyprojects_dependencies_and_the_dev_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = requirements.requirements(["dev"])
    assert listed == project["dependencies"] + project["optional-dependencies"]["dev"]
    assert requirements.requirements([]) == project["dependencies"]
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        requirements.requirements(["nope"])


def test_the_makefile_installs_from_pyproject_and_repeats_no_dependency() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("$(DEPS_STAMP):") :].split("\n\n", 1)[0]
    assert ".ci/requirements.py dev | $(PY) -m pip install -q -r /dev/stdin" in recipe
    names = {re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0] for req in requirements.requirements(["dev"])}
    repeated = sorted(name for name in names if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", recipe))
    assert repeated == []


@pytest.mark.parametrize(
    ("name", "arch", "minor"),
    [
        ("sie_sidecar-0.1.0-cp311-cp311-manylinux2014_aarch64.manylinux_2_17_aarch64.whl", "aarch64", "3.11"),
        ("sie_sidecar-0.1.0-cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "x86_64", "3.13"),
    ],
)
def test_wheel_names_give_their_architecture_and_python(name: str, arch: str, minor: str) -> None:
    parsed = wheels.WheelName.parse(Path(name))
    assert (parsed.version, parsed.arch.name, parsed.minor) == ("0.1.0", arch, minor)


def test_a_wheel_name_of_mixed_or_unknown_architecture_is_refused() -> None:
    name = "sie_sidecar-0.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux_2_17_aarch64.whl"
    mixed = wheels.WheelName.parse(Path(name))
    with pytest.raises(wheels.ReleaseError, match="no single known architecture"):
        _ = mixed.arch
    with pytest.raises(wheels.ReleaseError, match="five parts"):
        wheels.WheelName.parse(Path("sie_sidecar-0.1.0.whl"))


def test_the_version_has_one_source() -> None:
    cargo = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert wheels.version() == cargo
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text()


def test_glibc_versions_sort_numerically() -> None:
    assert wheels.glibc_versions({"GLIBC_2.17", "GLIBC_2.3.4", "GLIBC_2.2.5", "GCC_3.0"})[-1] == (2, 17)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="a wheel architecture only")
def test_the_elf_check_reads_the_real_extension() -> None:
    """On the development build (linked by the host's gcc, not zig): the machine matches this host
    and is reported for the other architecture; nothing outside the manylinux set is linked."""
    so = Path(native_module.__file__ or "")
    data = so.read_bytes()
    host = wheels.ARCHES[platform.machine()]
    other = next(a for a in wheels.ARCHES.values() if a != host)
    own = [p for p in wheels.check_elf(data, host, so.name) if "GLIBC" not in p]
    assert own == []
    assert any("ELF machine" in p for p in wheels.check_elf(data, other, so.name))


def test_the_missing_system_tools_are_named_in_one_line() -> None:
    host = wheels.host_arch()
    foreign = next(a for a in wheels.ARCHES.values() if a != host)
    nothing = lambda _tool: None  # noqa: E731 - a machine with none of the tools
    packages, targets = wheels.missing_system_tools(
        [host, foreign], ["3.11", "3.13"], smoke=True, which=nothing, has_rust_std=lambda _a: False
    )
    assert packages == ["debootstrap", "qemu-user-static"] and targets == [foreign.rust]
    line = wheels.missing_tools_line(packages, targets)
    assert line.count("\n") == 0
    assert "apt-get install debootstrap qemu-user-static" in line and f"rustup target add {foreign.rust}" in line
    # The host's own wheel needs none of them.
    assert wheels.missing_system_tools(
        [host], [wheels.host_python()], smoke=True, which=nothing, has_rust_std=lambda _a: False
    ) == ([], [])


def test_the_wheel_tools_are_pinned_and_the_makefile_installs_them() -> None:
    pins = [
        line.split("==")
        for line in (REPO / ".ci" / "wheel-tools.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert {name for name, _ in pins} >= {"maturin", "ziglang", "auditwheel", "cmake"}
    assert all(re.fullmatch(r"\d+(\.\d+)+", version) for _, version in pins)
    makefile = (REPO / "Makefile").read_text()
    assert "pip install -q -r .ci/wheel-tools.txt" in makefile
    assert re.search(r"^wheels: \$\(WHEEL_TOOLS_STAMP\)", makefile, re.M)
