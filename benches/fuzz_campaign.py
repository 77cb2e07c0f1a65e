# SPDX-License-Identifier: Apache-2.0
"""A coverage-guided fuzz campaign over every parser reachable from outside the pod (issue 15).

Each target is one libFuzzer run under atheris (Google's coverage-guided fuzzer for CPython): the
pure-Python twins and the Python parsers are instrumented, so coverage of their branches guides the
mutations; the Rust core runs the same inputs beside its twin (not instrumented: its own fuzz loop
is `cargo test fuzz_`, `make fuzz`). Every input must end in a value or a typed error of
`sie_sidecar.errors`, the same kind (value or error) from the native parser and its twin, with no
hang (`-timeout`) and bounded memory (`-rss_limit_mb`). A failing input is written under
`--artifacts` (libFuzzer's crash file); `tests/fuzz/test_fuzz_regressions.py` replays every file
kept in `tests/fuzz/regressions/<target>/` on each `make test`.

Run: `python benches/fuzz_campaign.py --runs 1000000 [--targets ...] [--jobs 2]` (needs
`pip install atheris`; `make fuzz-campaign` does both). Prints the inputs each target ran and the
total; `--json` writes them.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGRESSIONS = ROOT / "tests" / "fuzz" / "regressions"


MAX_DIVERGENCES = 20


class Divergence(AssertionError):
    """The native parser and its twin disagree on whether an input is valid (strict mode only)."""


@dataclass
class _Divergences:
    """The artifact prefix divergences are written under (set by `run_one`), and how many were."""

    prefix: str | None = None
    kept: int = 0
    #: Raise `Divergence` instead (the regression replay: a kept input must agree once it is fixed).
    strict: bool = False


_DIVERGENCES = _Divergences()


def _kind(call: Callable[[], Any]) -> str:
    """ "ok", or the typed error's family; anything else (a crash) propagates."""
    from sie_sidecar import errors

    try:
        call()
    except errors.WireError:
        return "wire-error"
    except (errors.WorkItemError, errors.SubjectError, errors.LocalFrameError):
        return "typed-error"
    return "ok"


def _same(native: Callable[[], Any], twin: Callable[[], Any], what: str, data: bytes) -> None:
    """Both typed (or a crash propagates); a disagreement on valid / invalid is kept as a finding
    (not a crash: the native parser is the one production runs, and the campaign goes on)."""
    a, b = _kind(native), _kind(twin)
    kept = _DIVERGENCES
    if a != b and kept.strict:
        raise Divergence(f"{what}: native {a}, twin {b}")
    if a != b and kept.prefix is not None and kept.kept < MAX_DIVERGENCES:
        kept.kept += 1
        digest = hashlib.sha256(data).hexdigest()[:16]
        Path(f"{kept.prefix}divergence-{what}-native_{a}-twin_{b}-{digest}").write_bytes(data)


# --- targets: each takes the raw input --------------------------------------------------------------------


def _impls() -> tuple[Any, Any]:
    from sie_sidecar.wire import _switch

    return _switch.native_wire(), _switch.twin("wire")


def target_envelopes(data: bytes) -> None:
    """An IPC response body: envelope, batch outcome, any body, and an envelope's own body."""
    for impl in _impls():
        for decode in (impl.decode_response, impl.decode_batch_outcome, impl.decode_body):
            _kind(functools.partial(decode, data))

        def body(impl: Any = impl) -> None:
            env = impl.decode_response(data)
            if isinstance(env, impl.ResponseEnvelope):
                impl.decode_batch_outcome(impl.response_body(env, env.request_id))

        _kind(body)
    native, twin = _impls()
    _same(lambda: native.decode_response(data), lambda: twin.decode_response(data), "decode_response", data)
    _same(
        lambda: native.decode_batch_outcome(data),
        lambda: twin.decode_batch_outcome(data),
        "decode_batch_outcome",
        data,
    )


def _stream(impl: Any, data: bytes) -> None:
    """The receive path of one connection: split (in two pieces), decode, reassemble chunks."""
    from sie_sidecar import errors

    cut = data[0] % (len(data) + 1) if data else 0
    limits = impl.ChunkLimits(legacy_ceiling=4, max_chunk_payload=64, max_chunk_frame=4096, max_total=256, max_chunks=8)
    budget = impl.ResponseBudget()
    splitter = impl.FrameSplitter(max_body=4096)
    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=limits)
    try:
        for piece in (data[1 : cut + 1], data[cut + 1 :]):
            for frame_body in splitter.feed(piece):
                try:
                    done = asm.feed(impl.decode_response(frame_body))
                    if done is not None:
                        with done:
                            impl.decode_body(impl.response_body(done.decode(), "r1"))
                except errors.WireError:
                    asm.abort()
                    asm = impl.IpcChunkAssembler("r1", budget=budget, limits=limits)
    finally:
        asm.abort()
    if budget.reserved != 0:
        raise AssertionError(f"response budget left reserved: {budget.reserved}")


def target_ipc_stream(data: bytes) -> None:
    native, twin = _impls()
    _same(lambda: _stream(native, data), lambda: _stream(twin, data), "ipc_stream", data)


def target_result_chunks(data: bytes) -> None:
    """NATS result chunks (a peer's chunked reply), the pieces split on 0xFF 0xFE."""
    pieces = data.split(b"\xff\xfe")

    def feed(impl: Any) -> None:
        assembler = impl.ResultChunkAssembler(max_total=4096)
        for piece in pieces:
            _kind(functools.partial(assembler.feed, piece))

    for impl in _impls():
        feed(impl)
    native, twin = _impls()
    _same(
        lambda: native.ResultChunkAssembler(max_total=4096).feed(data),
        lambda: twin.ResultChunkAssembler(max_total=4096).feed(data),
        "result_chunk",
        data,
    )


def target_work_item(data: bytes) -> None:
    """A JetStream WorkItem payload: the native decoder against its twin."""
    from sie_sidecar._native import decode_work_item
    from sie_sidecar._twins.workitem import decode_work_item as decode_work_item_py
    from sie_sidecar.wire.workitem import WorkItem

    _same(lambda: decode_work_item(data, WorkItem), lambda: decode_work_item_py(data), "decode_work_item", data)


def target_inbound(data: bytes) -> None:
    """The NATS protocol stream the direct-delivery scanner reads (MSG frames)."""
    from nats.aio.msg import Msg

    from sie_sidecar._native.wire import scan_direct_msgs
    from sie_sidecar._twins.inbound import scan_direct_msgs as scan_direct_msgs_py

    def scan(scanner: Any) -> Any:
        got: list[Msg] = []
        result = scanner(bytearray(data), {1: got.extend, 7: got.extend}, None, Msg)
        return result[:4], [(m.subject, m.reply, m.data) for m in got]

    if scan(scan_direct_msgs) != scan(scan_direct_msgs_py):
        raise AssertionError("scan_direct_msgs: native and twin read different messages")  # a crash: both Python


def target_subjects(data: bytes) -> None:
    """Every subject and token function on text (the input split on NUL into five strings)."""
    a, b, c, d, e = (data.decode("utf-8", "surrogateescape").split("\x00") + [""] * 5)[:5]
    for impl in _impls():
        for name, args in (
            ("normalize_token", (a,)),
            ("denormalize_token", (a,)),
            ("validate_lane_token", (a,)),
            ("model_from_subject", (a,)),
            ("parse_work_subject", (a,)),
            ("parse_work_cancel", (a,)),
            ("parse_generate_cancel", (a,)),
            ("parse_batch_cancel", (a, b)),
            ("filters_overlap", (a, b)),
            ("pool_work_subject", (a, b, c, d)),
            ("worker_direct_subject", (a, b, c, d, e)),
            ("pool_durable_name", (a, b, c)),
        ):
            _kind(functools.partial(getattr(impl, name), *args))
    native, twin = _impls()
    _same(lambda: native.parse_work_subject(a), lambda: twin.parse_work_subject(a), "parse_work_subject", data)


def target_local_frames(data: bytes) -> None:
    """Local-ingest frames (a client on the local socket)."""
    from sie_sidecar.local import frames

    _kind(lambda: frames.declared_length(data[:4]))
    _kind(lambda: frames.decode_request(data))
    _kind(lambda: frames.decode_response(data))


def target_probe_request(data: bytes) -> None:
    """An HTTP request head on the probe port."""
    from sie_sidecar import probes
    from sie_sidecar.pipeline.readiness import Readiness

    parsed = probes.parse_request_head(data)
    if isinstance(parsed, probes.Request):
        probes.answer(Readiness(), parsed)


def target_store_replies(data: bytes) -> None:
    """Object-store answers: an OSS error body and an STS AssumeRoleWithOIDC reply."""
    from sie_sidecar.payloads.oss import provider_code
    from sie_sidecar.payloads.oss_credentials import _parse_sts_reply

    provider_code(data)
    for status in (200, 400):
        try:
            _parse_sts_reply(status, data)
        except Exception as exc:  # its errors are typed by the module: StsError only
            if type(exc).__name__ != "StsError":
                raise


TARGETS: dict[str, Callable[[bytes], None]] = {
    "envelopes": target_envelopes,
    "ipc_stream": target_ipc_stream,
    "result_chunks": target_result_chunks,
    "work_item": target_work_item,
    "inbound": target_inbound,
    "subjects": target_subjects,
    "local_frames": target_local_frames,
    "probe_request": target_probe_request,
    "store_replies": target_store_replies,
}


def seeds(target: str) -> list[bytes]:
    """Valid inputs to start from (the fuzzer mutates these first)."""
    import msgpack

    from sie_sidecar.tools.loadgen import LoadConfig, build_work_item

    work_item = build_work_item(
        LoadConfig(nats_url="nats://unused"), request_id="r", item_index=0, total_items=1, text_index=0, timestamp=1.7e9
    )  # a gateway's WorkItem, as the load generator writes it
    envelope = {"version": 1, "request_id": "r1", "ok": True, "body": {"outcomes": []}, "error": None}
    out = {
        "envelopes": [msgpack.packb(envelope), msgpack.packb({"outcomes": [{"work_item_id": "r.0"}]})],
        "ipc_stream": [b"\x05" + len(b := msgpack.packb(envelope)).to_bytes(4, "big") + b],
        "result_chunks": [b"\x80"],
        "work_item": [msgpack.packb(work_item)],
        "inbound": [b"MSG _INBOX.x 1 $JS.ACK.s.c.1.2.3.4.5 5\r\nhello\r\nPING\r\n"],
        "subjects": [b"sie.work.p.l.b.org__m\x00r\x00a\x00b\x00c"],
        "local_frames": [msgpack.packb({"id": 1, "op": "submit", "body": {}})],
        "probe_request": [b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"],
        "store_replies": [b"<Error><Code>AccessDenied</Code></Error>", b'{"Credentials": {}}'],
    }
    return [bytes(s) for s in out.get(target, [b""])]


# --- one target in this process (under atheris) --------------------------------------------------------------


#: The Python parsers and twins, imported under atheris' instrumentation (the targets import them again, lazily).
INSTRUMENTED = (
    "sie_sidecar._twins.wire",
    "sie_sidecar.bus.inbound",
    "sie_sidecar.local.frames",
    "sie_sidecar.payloads.oss",
    "sie_sidecar.payloads.oss_credentials",
    "sie_sidecar.probes",
    "sie_sidecar.wire.workitem",
)


def run_one(target: str, libfuzzer_args: list[str]) -> None:
    atheris: Any = importlib.import_module("atheris")  # not a dependency: `make fuzz-campaign` installs it
    prefix = next((a.split("=", 1)[1] for a in libfuzzer_args if a.startswith("-artifact_prefix=")), None)
    _DIVERGENCES.prefix = prefix

    with atheris.instrument_imports(include=["sie_sidecar"]):  # their branches guide the mutations
        for module in INSTRUMENTED:
            importlib.import_module(module)
    fn = TARGETS[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], fn)
    atheris.Fuzz()


# --- the campaign: every target in its own process --------------------------------------------------------


def campaign(args: argparse.Namespace) -> dict[str, Any]:
    artifacts = Path(args.artifacts)
    artifacts.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sie-fuzz-"))

    def one(target: str) -> dict[str, Any]:
        corpus = work / target
        corpus.mkdir()
        for i, seed in enumerate(seeds(target)):
            (corpus / f"seed-{i}").write_bytes(seed)
        prefix = artifacts / f"{target}-"
        cmd = [
            sys.executable,
            __file__,
            "--one",
            target,
            "--",
            f"-runs={args.runs}",
            f"-max_len={args.max_len}",
            f"-timeout={args.timeout_s}",
            f"-rss_limit_mb={args.rss_limit_mb}",
            f"-artifact_prefix={prefix}",
            "-print_final_stats=1",
            str(corpus),
        ]
        started, started_wall = time.monotonic(), time.time()
        proc = subprocess.run(
            cmd, check=False, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0"}
        )
        wall = time.monotonic() - started
        log = proc.stdout + proc.stderr
        (work / f"{target}.log").write_text(log)
        runs = [int(m) for m in re.findall(r"stat::number_of_executed_units:\s*(\d+)", log)]
        diverged = sorted(p.name for p in artifacts.glob(f"{target}-divergence-*") if p.stat().st_mtime >= started_wall)
        found = sorted(p.name for p in artifacts.glob(f"{target}-*") if "-divergence-" not in p.name)
        return {
            "target": target,
            "inputs": runs[-1] if runs else 0,
            "exit": proc.returncode,
            "wall_s": round(wall, 1),
            "findings": found,
            "divergences": diverged,
            "peak_rss_mb": int(m[-1]) if (m := re.findall(r"stat::peak_rss_mb:\s*(\d+)", log)) else None,
            "log": str(work / f"{target}.log"),
        }

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, args.targets))
    total = sum(r["inputs"] for r in results)
    print(f"{'target':<15} {'inputs':>12} {'s':>7} {'inputs/s':>9} {'peak RSS MB':>11}  result")
    for r in results:
        rate = r["inputs"] / r["wall_s"] if r["wall_s"] else 0
        verdict = "ok" if r["exit"] == 0 and not r["findings"] else f"FOUND {r['findings']} (exit {r['exit']})"
        if r["divergences"]:
            verdict += f"; {len(r['divergences'])} native/twin divergences kept"
        rss = r["peak_rss_mb"]
        print(f"{r['target']:<15} {r['inputs']:>12,} {r['wall_s']:>7.1f} {rate:>9,.0f} {rss!s:>11}  {verdict}")
    print(f"total: {total:,} inputs over {len(results)} targets; logs in {work}")
    return {"total_inputs": total, "targets": results}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:
        run_one(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs per target (default 1,000,000)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="targets fuzzed at once")
    parser.add_argument("--max-len", type=int, default=4096, help="longest input (bytes)")
    parser.add_argument("--timeout-s", type=int, default=5, help="an input running longer is a hang")
    parser.add_argument("--rss-limit-mb", type=int, default=1024, help="a target growing past this fails")
    parser.add_argument("--artifacts", default=str(ROOT / ".benchmarks" / "fuzz-findings"))
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    result = campaign(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if all(r["exit"] == 0 and not r["findings"] for r in result["targets"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
