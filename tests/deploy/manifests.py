"""Read the deployment examples the way their consumers do: YAML documents, the Dockerfile's
instructions, and a Settings built from the worker-sidecar container's environment."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sie_sidecar.config import Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
#: What a Secret or the downward API supplies at run time, for building Settings offline.
PLACEHOLDER = "from-the-cluster"


def documents(name: str) -> list[dict[str, Any]]:
    with (KUBERNETES / name).open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def all_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in documents(path.name):
            yield path.name, doc


def one(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in all_documents() if d["kind"] == kind]
    return doc


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = one("Deployment")["spec"]["template"]["spec"]
    return spec


def container(name: str) -> dict[str, Any]:
    spec = pod_spec()
    (found,) = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name]
    named: dict[str, Any] = found
    return named


def environment(c: Mapping[str, Any]) -> dict[str, str]:
    """The container's env as the process sees it; secret and field references become a placeholder."""
    return {e["name"]: e.get("value", PLACEHOLDER) for e in c.get("env", [])}


class RecordingEnviron(dict[str, str]):
    """An environment that remembers which names the settings builder asked for."""

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def sidecar_settings() -> tuple[Settings, RecordingEnviron]:
    env = RecordingEnviron(environment(container("worker-sidecar")))
    return Settings.from_sources(env), env


@dataclass(frozen=True)
class Instruction:
    stage: int  # index of the FROM it belongs to
    keyword: str
    args: str


def dockerfile() -> list[Instruction]:
    """Instructions with continuations joined and comments (parser directives too) dropped."""
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword.upper(), re.sub(r"\s+", " ", args.strip())))
    return out


def final_stage() -> list[Instruction]:
    instructions = dockerfile()
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]
