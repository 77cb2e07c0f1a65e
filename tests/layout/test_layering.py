# SPDX-License-Identifier: Apache-2.0
"""The house rules of docs/architecture.md ("Rooms"), checked over the package's import graph.

Each rule names the rooms it binds and what they may not import; a new import that breaks one fails
here with the file and line, so the layout cannot erode one convenient import at a time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .imports import PACKAGE_DIR, ImportEdge, edges_of, package_edges, room_of

#: Rooms that may talk to NATS. Everything else reaches the broker through a `Source` and a reply sink.
NATS_ROOMS = {"bus", "tools"}
#: The runtime: everything but the user-facing tools and the command-line entry points.
NOT_RUNTIME = {"tools", "cli", "__main__"}
#: What may import `runtime/` (start-up, drain, both ingest modes): itself and the entry points.
STARTS_THE_RUNTIME = {"runtime", "cli", "__main__"}
TRANSPORTS = ("nats", "aiohttp", "socket", "obstore")
#: The facades over the compiled core: the only modules that import `_native` (type stubs included).
NATIVE_FACADES = ("sie_sidecar.wire", "sie_sidecar.sched", "sie_sidecar.prep.audio")
#: What the twins may import of the package: one another, errors, wire/'s value modules (not the wire
#: facade, the switch that loads the twins or the compiled core's namespace) and the controller's constants.
TWIN_IMPORTS = ("sie_sidecar._twins", "sie_sidecar.errors", "sie_sidecar.wire", "sie_sidecar.sched.controller_params")
NOT_FOR_TWINS = ("sie_sidecar.wire._switch", "sie_sidecar.wire._native_api")


def _is(target: str, *prefixes: str) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def violations(edges: list[ImportEdge]) -> list[str]:
    """Every broken rule, one line each (`module:line imports target: rule`)."""
    out: list[str] = []
    for e in edges:
        room = room_of(e.module)

        def bad(rule: str, edge: ImportEdge = e) -> None:
            out.append(f"{edge.module}:{edge.line} imports {edge.target}: {rule}")

        if _is(e.target, "nats") and room not in NATS_ROOMS:
            bad("nats is imported only under bus/ and tools/")
        if _is(e.target, "sie_sidecar._twins") and room != "_twins" and e.module != "sie_sidecar.wire._switch":
            bad("_twins is imported only by wire._switch (and by tests)")
        if _is(e.target, "sie_sidecar._native") and room != "_native" and not _is(e.module, *NATIVE_FACADES):
            bad("_native is imported only by the facades (wire/, sched/, prep/audio.py)")
        if room == "_twins" and (
            _is(e.target, *TRANSPORTS)
            or (_is(e.target, "sie_sidecar") and not _is(e.target, *TWIN_IMPORTS))
            # The facade only from the package's __init__, to load it before any twin of it
            # (tests/unit/test_native.py, test_any_twin_module_imports_first).
            or (e.target == "sie_sidecar.wire" and e.module != "sie_sidecar._twins")
            or _is(e.target, *NOT_FOR_TWINS)
        ):
            bad("_twins/ imports only errors, wire/ value modules, sched.controller_params and other twins")
        if room == "pipeline" and (
            _is(e.target, *TRANSPORTS) or _is(e.target, "sie_sidecar.bus", "sie_sidecar.ipc.client")
        ):
            bad("pipeline/ imports no transport (it gets a Source, a backend client and a reply sink)")
        if room == "sched" and _is(e.target, "sie_sidecar.bus", "sie_sidecar.pipeline", "sie_sidecar.ipc.client"):
            bad("sched/ does not call up into the pipeline or out to a transport")
        below_wire = {"wire", "errors", "_native", "_twins"}  # _twins: only the switch, by the rule above
        if room == "wire" and _is(e.target, "sie_sidecar") and room_of(e.target) not in below_wire:
            bad("wire/ is the bottom layer: it imports only errors and the extension")
        if room == "backend" and _is(e.target, *(f"sie_sidecar.{r}" for r in ("bus", "pipeline", "sched", "runtime"))):
            bad("backend/ is a library backends embed: it does not depend on the sidecar's runtime")
        if room == "control" and _is(e.target, "sie_sidecar.bus", "sie_sidecar.ipc", "sie_sidecar.runtime"):
            bad("control/ polls HTTP services and records into pipeline state: no NATS, no backend")
        if room == "local" and _is(
            e.target, *(f"sie_sidecar.{r}" for r in ("bus", "ipc", "control", "runtime", "probes"))
        ):
            bad("local/ is the socket and its binding to the pipeline: runtime/ wires the process")
        if _is(e.target, "sie_sidecar.runtime") and room not in STARTS_THE_RUNTIME:
            bad("only cli (and __main__) start the runtime: nothing else imports runtime/")
        if (
            room == "otel"
            and _is(e.target, "sie_sidecar")
            and room_of(e.target) not in {"otel", "telemetry", "logs", "errors", "wire"}
        ):
            bad(
                "otel/ reads telemetry snapshots: it imports nothing else of the package (but its errors"
                " and the wire facade's compiled encoder)"
            )
        if room == "telemetry" and _is(e.target, "sie_sidecar") and room_of(e.target) not in {"telemetry", "wire"}:
            bad("telemetry imports nothing of the package but the wire facade: every room may record into it")
        if room not in NOT_RUNTIME and _is(e.target, "sie_sidecar.tools"):
            bad("the runtime does not import tools/")
    return out


def test_the_package_keeps_its_layering() -> None:
    assert violations(package_edges()) == []


@pytest.mark.parametrize(
    ("relpath", "source", "rule"),
    [
        ("pipeline/_probe.py", "import nats\n", "nats is imported only"),
        ("pipeline/_probe.py", "from ..bus.pull import PullConsumer\n", "pipeline/ imports no transport"),
        ("sched/_probe.py", "from ..pipeline import dispatcher\n", "sched/ does not call up"),
        ("prep/_probe.py", "from .._twins.wire import envelopes\n", "_twins is imported only"),
        ("runtime/_probe.py", "from ..tools import demo\n", "the runtime does not import tools/"),
        ("wire/_probe.py", "from ..sched import scheduler\n", "wire/ is the bottom layer"),
        ("backend/_probe.py", "from ..sched.scheduler import ModelScheduler\n", "backend/ is a library"),
        ("control/_probe.py", "from ..bus.pull import PullConsumer\n", "control/ polls HTTP services"),
        ("local/_probe.py", "from ..ipc.client import IpcClient\n", "local/ is the socket"),
        ("local/_probe.py", "from ..runtime.drain import end_tasks\n", "local/ is the socket"),
        ("backend/_probe.py", "from ..runtime import run\n", "backend/ is a library"),
        ("control/_probe.py", "from ..runtime.drain import TASK_JOIN_S\n", "control/ polls HTTP services"),
        ("pipeline/_probe.py", "from ..runtime.gc import PeriodicCollection\n", "only cli (and __main__) start"),
        ("tools/_probe.py", "from ..runtime import run\n", "only cli (and __main__) start"),
        ("otel/_probe.py", "from ..pipeline import dispatcher\n", "otel/ reads telemetry snapshots"),
        ("pipeline/_probe.py", "if TYPE_CHECKING:\n    from nats.aio.msg import Msg\n", "nats is imported only"),
        ("pipeline/_probe.py", "from .._native import intake_batch\n", "_native is imported only by the facades"),
        ("tools/_probe.py", "from .. import _native\n", "_native is imported only by the facades"),
        ("prep/_probe.py", "if TYPE_CHECKING:\n    from .._native import Batcher\n", "_native is imported only"),
        ("_twins/_probe.py", "from ..pipeline.delivery import Delivery\n", "_twins/ imports only"),
        ("_twins/_probe.py", "import nats\n", "_twins/ imports only"),
        ("_twins/_probe.py", "from ..wire import USING_NATIVE\n", "_twins/ imports only"),
    ],
)
def test_each_rule_catches_a_breaking_import(relpath: str, source: str, rule: str) -> None:
    """A rule that cannot fail proves nothing: each one is fed an import that breaks it."""
    path = PACKAGE_DIR / relpath
    assert not path.exists()
    try:
        path.write_text(source)
        found = violations(edges_of(path))
    finally:
        path.unlink()
    assert any(rule in v for v in found), found


def test_telemetry_may_import_nothing_of_the_package() -> None:
    edge = ImportEdge("sie_sidecar.telemetry", "sie_sidecar.sched.scheduler", 1, False)
    assert any("telemetry imports nothing" in v for v in violations([edge]))


def test_every_module_lives_in_a_room() -> None:
    """No module grows back at the top level beside the entry points, config, errors, logs and probes."""
    top = sorted(p.stem for p in PACKAGE_DIR.glob("*.py"))
    assert top == ["__init__", "__main__", "cli", "errors", "logs", "probes"]


def test_the_graph_is_read_from_real_files() -> None:
    """The reader resolves relative imports: the dispatcher's scheduler import is seen as such."""
    edges = edges_of(Path(PACKAGE_DIR / "pipeline" / "dispatcher.py"))
    assert any(e.target.startswith("sie_sidecar.sched.scheduler") for e in edges)
