#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Build, check and smoke-test the release wheels: manylinux x86_64 and aarch64, per CPython minor.

    python .ci/wheels.py roots           # Debian root filesystems: target headers and interpreters
    python .ci/wheels.py build           # every wheel of the matrix and the sdist, into dist/
    python .ci/wheels.py check           # manylinux tag, ELF machine, linked libraries, glibc symbols
    python .ci/wheels.py smoke           # each wheel installed alone, then --version, tour and vectors

Why Debian roots: the wheels are per CPython minor (the Cython part uses the full C API), so each
build needs that version's headers for its architecture, and each smoke test needs that
interpreter. Debian ships both (3.11 in bookworm, 3.13 in trixie) for both architectures through
the package registry these machines reach; `debootstrap --foreign` unpacks them without running
anything, and `qemu-<arch>-static -L <root>` runs the root's interpreter (aarch64 emulated, x86_64
as a user-mode process with the root's own glibc). The host's own CPython gets a real clean venv.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = REPO / "target" / "roots"
DIST = REPO / "dist"
MIRROR = "http://deb.debian.org/debian"

#: CPython minor -> the Debian suite that ships it (headers and interpreter).
PYTHONS: dict[str, str] = {"3.11": "bookworm", "3.13": "trixie"}


@dataclass(frozen=True)
class Arch:
    """One wheel architecture and its names in the tools that meet it."""

    name: str  # the wheel tag's: x86_64, aarch64
    debian: str  # amd64, arm64
    rust: str  # the Rust target triple
    multiarch: str  # Debian's include/lib triple
    elf_machine: str  # pyelftools' e_machine name

    @property
    def qemu(self) -> str:
        return f"qemu-{self.name}-static"


ARCHES: dict[str, Arch] = {
    "x86_64": Arch("x86_64", "amd64", "x86_64-unknown-linux-gnu", "x86_64-linux-gnu", "EM_X86_64"),
    "aarch64": Arch("aarch64", "arm64", "aarch64-unknown-linux-gnu", "aarch64-linux-gnu", "EM_AARCH64"),
}

#: manylinux2014 = glibc 2.17; what a wheel of ours may link beyond itself (PEP 599's list, minus
#: the X11/GL libraries no sidecar needs).
MANYLINUX_TAG = "manylinux_2_17"
MAX_GLIBC = (2, 17)
ALLOWED_NEEDED = frozenset(
    {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1", "libutil.so.1"}
)
ALLOWED_NEEDED_PREFIXES = ("ld-linux",)

#: The byte-exact wire vectors and the native/twin parity tests: what must hold on every wheel.
SMOKE_TESTS = (
    "tests/unit/test_framing.py",
    "tests/unit/test_envelopes.py",
    "tests/unit/test_workitem.py",
    "tests/unit/test_ipc_chunks.py",
    "tests/unit/test_results.py",
    "tests/unit/test_outputs.py",
    "tests/unit/test_response_frames.py",
    "tests/unit/test_subjects.py",
    "tests/unit/test_native.py",
    "tests/unit/test_local_wire.py",
    "tests/unit/test_generation_wire.py",
)
TEST_TOOLS = ("pytest>=8", "pytest-asyncio>=0.23", "pytest-timeout>=2.3", "hypothesis>=6.100")


class ReleaseError(RuntimeError):
    """A wheel failed a check, or a tool the step needs is missing (the message says which)."""


def host_arch() -> Arch:
    return ARCHES[platform.machine()]


def host_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def version() -> str:
    """The project version: the workspace's Cargo.toml is its one source (maturin reads it)."""
    import tomllib

    return str(tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"])


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=cwd)


def need(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ReleaseError(f"{tool} not found: {hint}")
    return path


def missing_system_tools(
    arches: list[Arch],
    pythons: list[str],
    *,
    smoke: bool,
    which: Callable[[str], str | None] = shutil.which,
    has_rust_std: Callable[[Arch], bool] | None = None,
) -> tuple[list[str], list[str]]:
    """(Debian packages, Rust targets) the steps for `arches` x `pythons` need and this machine lacks:
    debootstrap for any wheel that is not the host's own, qemu-user-static to smoke-test one, and
    the Rust standard library of a foreign architecture."""
    packages: list[str] = []
    if any(not (a == host_arch() and py == host_python()) for a in arches for py in pythons):
        if which("debootstrap") is None:
            packages.append("debootstrap")
        if smoke and any(which(a.qemu) is None for a in arches):
            packages.append("qemu-user-static")
    has_std = has_rust_std if has_rust_std is not None else _has_rust_std
    targets = [a.rust for a in arches if a != host_arch() and not has_std(a)]
    return packages, targets


def _has_rust_std(arch: Arch) -> bool:
    try:
        rust_for(arch)
    except ReleaseError:
        return False
    return True


def ensure_system_tools(arches: list[Arch], pythons: list[str], *, smoke: bool) -> None:
    """Install what `missing_system_tools` names when running as root (apt-get, rustup); otherwise
    stop with one line that names all of it."""
    packages, targets = missing_system_tools(arches, pythons, smoke=smoke)
    if not packages and not targets:
        return
    if os.geteuid() == 0 and (not packages or shutil.which("apt-get")) and (not targets or shutil.which("rustup")):
        if packages:
            run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages])
        if targets:
            run(["rustup", "target", "add", *targets])
        return
    raise ReleaseError(missing_tools_line(packages, targets))


def missing_tools_line(packages: list[str], targets: list[str]) -> str:
    """The one line that names every missing tool and how to get it."""
    wanted = []
    if packages:
        wanted.append(f"apt-get install {' '.join(packages)}")
    if targets:
        wanted.append(f"rustup target add {' '.join(targets)}")
    return f"missing build tools (make wheels installs them when run as root): {'; '.join(wanted)}"


# -- roots ---------------------------------------------------------------------------------------


def root_dir(py: str, arch: Arch) -> Path:
    return ROOTS / f"{PYTHONS[py]}-{arch.debian}"


def make_root(py: str, arch: Arch) -> Path:
    """Unpack (never run) a minimal Debian with python3.X and its headers: `debootstrap --foreign`
    extracts only the base set, so the included packages are unpacked here with dpkg-deb."""
    root = root_dir(py, arch)
    if (root / "usr" / "bin" / f"python{py}").exists() and (root / "usr" / "include" / f"python{py}").exists():
        return root
    need("debootstrap", "apt-get install debootstrap (as root)")
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    include = f"python{py},libpython{py}-dev"
    args = ["--foreign", f"--arch={arch.debian}", "--variant=minbase", f"--include={include}"]
    run(["debootstrap", *args, PYTHONS[py], str(root), MIRROR])
    for deb in sorted((root / "var" / "cache" / "apt" / "archives").glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def root_python(py: str, arch: Arch) -> list[str]:
    """The argv prefix that runs the root's interpreter on this host."""
    root = root_dir(py, arch)
    qemu = need(arch.qemu, "apt-get install qemu-user-static")
    return [qemu, "-L", str(root), str(root / "usr" / "bin" / f"python{py}")]


# -- build ---------------------------------------------------------------------------------------


def rust_for(arch: Arch) -> dict[str, str]:
    """Environment that gives cargo a standard library for `arch`: rustup's when installed, else
    Debian's rustc-web with libstd-rust-web-dev:<arch> (rustup cannot download off the registries)."""
    if arch == host_arch():
        return {}
    rustup = shutil.which("rustup")
    if rustup:
        listed = subprocess.run([rustup, "target", "list", "--installed"], check=False, capture_output=True, text=True)
        installed = listed.stdout
        if arch.rust in installed.split():
            return {}
    if Path(f"/usr/lib/rustlib/{arch.rust}/lib").is_dir() and Path("/usr/bin/rustc").exists():
        return {"RUSTC": "/usr/bin/rustc"}
    raise ReleaseError(
        f"no Rust standard library for {arch.rust}: `rustup target add {arch.rust}`, or on Debian "
        f"`dpkg --add-architecture {arch.debian} && apt-get install rustc-web libstd-rust-web-dev:{arch.debian}`"
    )


def interpreter_shim(py: str, arch: Arch, workdir: Path) -> Path:
    """A `pythonX.Y` executable for maturin and PyO3 to ask about the target interpreter (only for
    a same-architecture build of another minor: a cross build uses maturin's bundled sysconfig)."""
    shim = workdir / f"python{py}"
    shim.write_text("#!/bin/sh\nexec " + " ".join(root_python(py, arch)) + ' "$@"\n')
    shim.chmod(0o755)
    return shim


def pyo3_config(py: str, workdir: Path) -> Path:
    """PyO3's description of a CPython extension-module target of minor `py` (no interpreter run)."""
    path = workdir / f"pyo3-{py}.cfg"
    path.write_text(
        f"implementation=CPython\nversion={py}\nshared=true\nabi3=false\npointer_width=64\n"
        "suppress_build_script_link_lines=false\nbuild_flags=\n"
    )
    return path


def python_headers(root: Path, py: str, arch: Arch, workdir: Path) -> list[Path]:
    """The target CPython's headers, and only those, staged out of the Debian root: its
    `python3.X/` and the multiarch `pyconfig.h` Debian's wrapper includes. The root's own
    `/usr/include` must not be on the path: its glibc headers would shadow zig's glibc 2.17 ones
    (`stdio.h: use of undeclared identifier 'L_tmpnam'`)."""
    include = root / "usr" / "include"
    stage = workdir / f"include-{py}-{arch.name}"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(include / f"python{py}", stage / f"python{py}")
    multiarch = include / arch.multiarch / f"python{py}"
    if multiarch.is_dir():
        shutil.copytree(multiarch, stage / arch.multiarch / f"python{py}")
    return [stage / f"python{py}", stage]


def build_wheel(py: str, arch: Arch, out: Path, workdir: Path) -> None:
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin}{os.pathsep}{env['PATH']}"
    env["SIE_BUILD_PYTHON"] = sys.executable  # the host interpreter, with Cython, runs cythonize
    env["CARGO_TARGET_DIR"] = str(REPO / "target" / f"wheel-{arch.name}")
    cmd = [str(venv_bin / "maturin"), "build", "--release", "--locked", "--zig", "--compatibility", "manylinux2014"]
    cmd += ["-o", str(out)]
    if arch == host_arch() and py == host_python():
        cmd += ["-i", sys.executable]
    else:
        root = make_root(py, arch)
        env["SIE_PYTHON_INCLUDE"] = os.pathsep.join(str(p) for p in python_headers(root, py, arch, workdir))
        env.update(rust_for(arch))
        if arch == host_arch():
            # maturin asks the shim; PyO3's build scripts would run the root's interpreter natively
            # (against the host's older glibc), so they get the target as a config file instead.
            cmd += ["-i", str(interpreter_shim(py, arch, workdir))]
            env["PYO3_CONFIG_FILE"] = str(pyo3_config(py, workdir))
        else:
            cmd += ["--target", arch.rust, "-i", f"python{py}"]
    run(cmd, env=env, cwd=REPO)


def build(arches: list[Arch], pythons: list[str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sie-wheels-") as tmp:
        for arch in arches:
            for py in pythons:
                build_wheel(py, arch, out, Path(tmp))
    run([str(Path(sys.executable).parent / "maturin"), "sdist", "-o", str(out)], cwd=REPO)


# -- check ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name this script checks (PEP 427)."""

    version: str
    python: str  # cp311
    platforms: tuple[str, ...]

    @classmethod
    def parse(cls, path: Path) -> WheelName:
        parts = path.name.removesuffix(".whl").split("-")
        if len(parts) != 5:
            raise ReleaseError(f"{path.name}: not a wheel name of five parts")
        return cls(parts[1], parts[2], tuple(parts[4].split(".")))

    @property
    def arch(self) -> Arch:
        for arch in ARCHES.values():
            if all(tag.endswith(f"_{arch.name}") for tag in self.platforms):
                return arch
        raise ReleaseError(f"platform tags {self.platforms} name no single known architecture")

    @property
    def minor(self) -> str:
        return f"{self.python[2]}.{self.python[3:]}"


def glibc_versions(symbol_versions: set[str]) -> list[tuple[int, ...]]:
    return sorted(
        tuple(int(x) for x in v.removeprefix("GLIBC_").split(".")) for v in symbol_versions if v.startswith("GLIBC_")
    )


def check_elf(data: bytes, arch: Arch, label: str) -> list[str]:
    """The extension's own ELF facts: machine, DT_NEEDED, the newest glibc symbol version."""
    import io

    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    elf = ELFFile(io.BytesIO(data))
    problems: list[str] = []
    if elf["e_machine"] != arch.elf_machine:
        problems.append(f"{label}: ELF machine {elf['e_machine']}, the tag says {arch.elf_machine}")
    needed: set[str] = set()
    versions: set[str] = set()
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            needed |= {str(getattr(tag, "needed", "")) for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
        if isinstance(section, GNUVerNeedSection):
            for _, auxiliaries in section.iter_versions():
                versions |= {aux.name for aux in auxiliaries}
    extra = sorted(n for n in needed if n not in ALLOWED_NEEDED and not n.startswith(ALLOWED_NEEDED_PREFIXES))
    if extra:
        problems.append(f"{label}: links {extra}, outside the manylinux set")
    newest = glibc_versions(versions)[-1:] or [(0,)]
    if newest[0] > MAX_GLIBC:
        problems.append(f"{label}: needs GLIBC_{'.'.join(map(str, newest[0]))} > 2.17")
    return problems


def check_wheel(path: Path) -> list[str]:
    name = WheelName.parse(path)
    arch = name.arch
    problems: list[str] = []
    if name.version != version():
        problems.append(f"{path.name}: version {name.version}, Cargo.toml says {version()}")
    if f"{MANYLINUX_TAG}_{arch.name}" not in name.platforms:
        problems.append(f"{path.name}: no {MANYLINUX_TAG}_{arch.name} tag")
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "auditwheel"), "show", str(path)],
        check=False,
        capture_output=True,
        text=True,
    )
    text = " ".join(shown.stdout.split())
    if shown.returncode != 0 or f'"{MANYLINUX_TAG}_{arch.name}"' not in text:
        problems.append(f"{path.name}: auditwheel show does not confirm {MANYLINUX_TAG}_{arch.name}: {text}")
    if "external shared libraries are required" in text:
        problems.append(f"{path.name}: auditwheel show finds external shared libraries: {text}")
    with zipfile.ZipFile(path) as wheel:
        objects = [n for n in wheel.namelist() if n.endswith(".so")]
        if len(objects) != 1 or f".cpython-{name.python[2:]}-{arch.multiarch}" not in objects[0]:
            problems.append(f"{path.name}: extension modules {objects}, expected one for {name.python}/{arch.name}")
        for member in objects:
            problems += check_elf(wheel.read(member), arch, f"{path.name}:{member}")
    return problems


def check(out: Path) -> None:
    wheels = sorted(out.glob("*.whl"))
    if not wheels:
        raise ReleaseError(f"no wheels in {out}: run `python .ci/wheels.py build` first")
    problems = [p for wheel in wheels for p in check_wheel(wheel)]
    for wheel in wheels:
        print(f"checked {wheel.name}")
    if not list(out.glob(f"sie_sidecar-{version()}.tar.gz")):
        problems.append(f"no sdist sie_sidecar-{version()}.tar.gz in {out}")
    if problems:
        raise ReleaseError("\n".join(problems))


# -- smoke ---------------------------------------------------------------------------------------


#: Tests that start `sys.executable` as a child: under `qemu -L` without a binfmt registration the
#: child would run natively (the root's glibc is not the host's), so an emulated run leaves them out.
SPAWNING_TESTS = ("tests/unit/test_native.py::test_environment_switch_selects_the_implementation",)


def smoke_commands(python: list[str], *, emulated: bool = False) -> list[list[str]]:
    """What each wheel must survive after `expect_version`: the tour (native against twin, byte for
    byte) and the wire vectors with a short hypothesis profile."""
    deselect = [f"--deselect={test}" for test in SPAWNING_TESTS] if emulated else []
    return [
        [*python, "-m", "sie_sidecar", "tour", "--items", "64", "--chunked-mib", "4"],
        [*python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=900", *deselect, *SMOKE_TESTS],
    ]


def smoke_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HYPOTHESIS_PROFILE="smoke", PYTHONDONTWRITEBYTECODE="1", SIE_SIDECAR_NO_EXTENSIONS="0")
    env.pop("PYTHONPATH", None)
    return env


def expect_version(python: list[str], env: dict[str, str]) -> None:
    cmd = [*python, "-m", "sie_sidecar", "--version"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if out.stdout.strip() != f"sie-sidecar {version()}":
        raise ReleaseError(f"--version printed {out.stdout.strip()!r} (stderr {out.stderr.strip()!r})")


#: Dependencies published as an sdist only (pure Python): a cross-target install takes binaries only,
#: so they are built into wheels here first (nkeys, which nats-py's creds and NKey logins need).
SDIST_ONLY = ("nkeys",)


def pure_python_wheels(workdir: Path) -> Path:
    """A wheelhouse with `SDIST_ONLY` built as (platform-independent) wheels, once per run."""
    wheelhouse = workdir / "wheelhouse"
    if not wheelhouse.is_dir():
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheelhouse), *SDIST_ONLY])
    return wheelhouse


def smoke_wheel(path: Path, workdir: Path) -> None:
    name = WheelName.parse(path)
    arch, py = name.arch, name.minor
    env = smoke_env()
    if arch == host_arch() and py == host_python():
        venv = workdir / f"venv-{py}-{arch.name}"
        base = getattr(sys, "_base_executable", sys.executable)
        run([base, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        run([*pip, str(path), *TEST_TOOLS])
        python = [str(venv / "bin" / "python")]
        run([str(venv / "bin" / "sie-sidecar"), "--version"], env=env)
    else:
        make_root(py, arch)
        site = workdir / f"site-{py}-{arch.name}"
        tags = [f"--platform=manylinux_2_{minor}_{arch.name}" for minor in range(17, 37)]
        wheelhouse = pure_python_wheels(workdir)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(site), "--only-binary=:all:"]
        pip += ["--find-links", str(wheelhouse)]
        run([*pip, "--implementation=cp", f"--python-version={py}", *tags, str(path), *TEST_TOOLS])
        env["PYTHONPATH"] = str(site)
        python = root_python(py, arch)
    expect_version(python, env)
    for cmd in smoke_commands(python, emulated=len(python) > 1):
        run(cmd, env=env, cwd=REPO)
    print(f"smoke passed: {path.name}", flush=True)


def smoke(out: Path, only: str | None) -> None:
    wheels = [w for w in sorted(out.glob("*.whl")) if only is None or only in w.name]
    if not wheels:
        raise ReleaseError(f"no wheels matching {only!r} in {out}")
    with tempfile.TemporaryDirectory(prefix="sie-smoke-") as tmp:
        for wheel in wheels:
            smoke_wheel(wheel, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("roots", "build", "check", "smoke"))
    parser.add_argument("--arch", nargs="+", choices=sorted(ARCHES), default=sorted(ARCHES))
    parser.add_argument("--python", nargs="+", choices=sorted(PYTHONS), default=sorted(PYTHONS))
    parser.add_argument("--out", type=Path, default=DIST, help="wheel directory (default dist/)")
    parser.add_argument("--only", help="smoke: only wheels whose file name contains this")
    args = parser.parse_args(argv)
    arches = [ARCHES[a] for a in args.arch]
    try:
        if args.step in ("roots", "build", "smoke"):
            ensure_system_tools(arches, args.python, smoke=args.step == "smoke")
        if args.step == "roots":
            for arch in arches:
                for py in args.python:
                    if not (arch == host_arch() and py == host_python()):
                        print(make_root(py, arch))
        elif args.step == "build":
            build(arches, args.python, args.out)
        elif args.step == "check":
            check(args.out)
        else:
            smoke(args.out, args.only)
    except (ReleaseError, subprocess.CalledProcessError) as exc:
        print(f"wheels.py {args.step}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
