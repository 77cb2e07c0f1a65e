"""The Dockerfile against the code and the Kubernetes example: it installs a wheel, runs as a numeric
non-root user, exposes the probe port the sidecar serves and checks `/healthz`."""

from __future__ import annotations

import json

from sie_sidecar.cli import build_parser
from sie_sidecar.config import Settings

from .manifests import ROOT, container, dockerfile, final_stage, pod_spec, sidecar_settings

REQUIRED = {"SIE_NATS_URL": "nats://127.0.0.1:4222", "SIE_POOL": "p", "SIE_BUNDLE": "b", "SIE_MACHINE_PROFILE": "m"}


def instruction(keyword: str) -> list[str]:
    return [i.args for i in final_stage() if i.keyword == keyword]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for args in instruction("ENV"):
        for pair in args.split(" "):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


def test_the_final_stage_installs_a_wheel_not_the_source() -> None:
    stages = {i.args.split(" AS ")[-1] for i in dockerfile() if i.keyword == "FROM" and " AS " in i.args}
    assert {"wheels-source", "wheels-dist", "wheels"} <= stages
    final = final_stage()
    assert not [i for i in final if i.keyword in ("COPY", "ADD")]  # nothing from the source tree
    (install,) = instruction("RUN")[1:]
    assert "from=wheels" in install and "--no-index --no-deps --find-links /wheels sie-sidecar" in install


def test_it_runs_as_the_numeric_user_the_pod_expects() -> None:
    (user,) = instruction("USER")
    assert user == "${UID}:${UID}"
    uid = next(i.args for i in final_stage() if i.keyword == "ARG" and i.args.startswith("UID="))
    assert int(uid.removeprefix("UID=")) == pod_spec()["securityContext"]["runAsUser"] != 0
    assert pod_spec()["securityContext"]["runAsGroup"] == pod_spec()["securityContext"]["runAsUser"]
    (accounts,) = [args for args in instruction("RUN") if "useradd" in args]
    assert "groupadd --system --gid ${UID} sidecar" in accounts and "--uid ${UID} --gid ${UID}" in accounts


def test_it_exposes_the_probe_port_the_sidecar_serves() -> None:
    default = Settings.from_sources(REQUIRED).worker_probe_port
    assert instruction("EXPOSE") == [str(default)]
    assert image_env()["SIE_WORKER_PROBE_PORT"] == str(default)
    settings, _ = sidecar_settings()
    assert settings.worker_probe_port == default


def test_the_image_socket_path_is_the_pods() -> None:
    settings, _ = sidecar_settings()
    assert image_env()["SIE_IPC_SOCKET_PATH"] == settings.ipc_socket_paths[0]
    assert image_env()["SIE_SIDECAR_NO_EXTENSIONS"] == "0"


def test_the_healthcheck_asks_healthz_through_the_cli() -> None:
    (check,) = instruction("HEALTHCHECK")
    command = json.loads(check.partition("CMD ")[2])
    assert command == ["sie-sidecar", "probe", "healthz"]
    args = build_parser("probe").parse_args(command[1:])
    assert args.path == "healthz"


def test_the_entrypoint_runs_the_sidecar() -> None:
    assert json.loads(instruction("ENTRYPOINT")[0]) == ["sie-sidecar"]
    assert json.loads(instruction("CMD")[0]) == ["run"] == container("worker-sidecar")["args"]


def test_the_source_stage_copies_what_the_build_needs() -> None:
    copied = {
        part
        for i in dockerfile()
        if i.keyword == "COPY" and i.stage == 0
        for part in i.args.split(" ")[:-1]
        if not part.startswith("--")
    }
    assert {"Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md", "native", "cython", "python"} <= copied
    for path in copied:
        assert (ROOT / path).exists(), path
