# SPDX-License-Identifier: Apache-2.0
"""Subject normalisation, construction and parsing: test vectors TV-S1..TV-S7 plus properties and parity."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.errors import SubjectError, WireError

# Fixtures that only return a module are safe to reuse across Hypothesis examples.
fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------------------------------- TV-S1

TV_S1 = [
    ("BAAI/bge-m3", "BAAI__bge-m3"),
    ("a.b", "a_dot_b"),
    ("a/b.c", "a__b_dot_c"),
    ("my-model", "my-model"),
    ("vidore/colqwen2.5-v0.2", "vidore__colqwen2_dot_5-v0_dot_2"),
    ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers__all-MiniLM-L6-v2"),
    ("a*b", "a_b"),
    ("a>b", "a_b"),
    ("a b", "a_b"),
]


@pytest.mark.parametrize(("value", "token"), TV_S1, ids=[v for v, _ in TV_S1])
def test_tv_s1_model_normalisation(impl: ModuleType, value: str, token: str) -> None:
    assert impl.normalize_token(value) == token


@pytest.mark.parametrize("value", ["BAAI/bge-m3", "openai/text-embedding-3-small", "x.y"])
def test_tv_s1_reverse_round_trip(impl: ModuleType, value: str) -> None:
    assert impl.denormalize_token(impl.normalize_token(value)) == value


def test_tv_s1_reverse_is_not_injective(impl: ModuleType) -> None:
    assert impl.normalize_token("org/a__b") == impl.normalize_token("org/a/b") == "org__a__b"


@pytest.mark.parametrize(
    ("token", "value"),
    [("BAAI__bge-m3", "BAAI/bge-m3"), ("a_dot_b", "a.b"), ("a__b_dot_c", "a/b.c"), ("___", "/_"), ("plain", "plain")],
)
def test_denormalize_replaces_slash_first(impl: ModuleType, token: str, value: str) -> None:
    assert impl.denormalize_token(token) == value


# ---------------------------------------------------------------------------------------------- TV-S2

TV_S2 = [
    ("worker-1", "worker-1"),
    ("Worker-1", "Worker-1"),
    ("WORKER", "WORKER"),
    (
        "sie-worker-7d9f-default-0.sie-worker.default.svc",
        "sie-worker-7d9f-default-0_dot_sie-worker_dot_default_dot_svc",
    ),
    ("my worker", "my_worker"),
    ("worker.*.foo", "worker_dot___dot_foo"),
    ("  worker-1  ", "__worker-1__"),
    ("worker--1", "worker--1"),
    ("pod-0.svc", "pod-0_dot_svc"),
]


@pytest.mark.parametrize(("value", "token"), TV_S2, ids=[repr(v) for v, _ in TV_S2])
def test_tv_s2_worker_id_normalisation(impl: ModuleType, value: str, token: str) -> None:
    assert impl.normalize_token(value) == token


# ---------------------------------------------------------------------------------------------- TV-S3

TV_S3 = ["a\tb", "a\nb", "a\rb", "a\x00b", "a\x1fb", "a\x7fb", "a\x85b", "a\x0bb", "a\x0cb"]


@pytest.mark.parametrize("value", TV_S3, ids=[repr(v) for v in TV_S3])
def test_tv_s3_control_characters_are_kept(impl: ModuleType, value: str) -> None:
    assert impl.normalize_token(value) == value


# ---------------------------------------------------------------------------------------------- TV-S4

TV_S4: list[tuple[str, tuple[str, ...], object]] = [
    (
        "pool_work_subject",
        ("default", "rtx6000", "default", "BAAI/bge-m3"),
        "sie.work.default.rtx6000.default.BAAI__bge-m3",
    ),
    ("pool_work_subject", ("eval-l4", "l4-spot", "sglang", "my-model"), "sie.work.eval-l4.l4-spot.sglang.my-model"),
    (
        "worker_direct_subject",
        ("default", "rtx6000", "sglang", "Qwen/Qwen3.6-27B", "worker-0.svc"),
        "sie.work.default.rtx6000.sglang.Qwen__Qwen3_dot_6-27B.worker-0_dot_svc",
    ),
    (
        "worker_direct_subject",
        ("default", "rtx6000", "sglang", "BAAI/bge-m3", "pod-0.svc"),
        "sie.work.default.rtx6000.sglang.BAAI__bge-m3.pod-0_dot_svc",
    ),
    (
        "worker_direct_filter",
        ("default", "rtx6000", "sglang", "pod-0.svc"),
        "sie.work.default.rtx6000.sglang.*.pod-0_dot_svc",
    ),
    ("worker_stream_name", ("pod-0.svc",), "WORK_WORKER_pod-0_dot_svc"),
    ("worker_consumer_name", ("pod-0.svc",), "gen-pod-0_dot_svc"),
    ("pool_stream_name", ("l4",), "WORK_POOL_l4"),
    ("pool_stream_subjects", ("l4",), ["sie.work.l4.*.*.*"]),
    ("health_subject", ("worker-l4-0",), "sie.health.worker-l4-0"),
    # sidecar-behaviour §1.3 rows the fixtures leave implicit.
    ("pool_durable_name", ("default", "rtx6000", "default"), "default_rtx6000_default"),
    ("pool_durable_name", ("my.pool", "l4 spot", "a/b"), "my_dot_pool_l4_spot_a__b"),
    ("pool_durable_filter", ("default", "rtx6000", "default"), "sie.work.default.rtx6000.default.*"),
    ("pool_durable_filter", ("default", "l4.x", "a/b"), "sie.work.default.l4_dot_x.a__b.*"),
    # The pool is never normalised in subjects and stream names, and the health subject keeps the id as is.
    ("pool_work_subject", ("p.q", "l4", "default", "m"), "sie.work.p.q.l4.default.m"),
    ("pool_stream_name", ("p.q",), "WORK_POOL_p.q"),
    ("pool_stream_subjects", ("p.q",), ["sie.work.p.q.*.*.*"]),
    ("health_subject", ("pod-0.svc",), "sie.health.pod-0.svc"),
    ("worker_direct_filter", ("p", "a b", "c*", "w>1"), "sie.work.p.a_b.c_.*.w_1"),
]


@pytest.mark.parametrize(("func", "args", "expected"), TV_S4, ids=[f"{f}{a}" for f, a, _ in TV_S4])
def test_tv_s4_construction(impl: ModuleType, func: str, args: tuple[str, ...], expected: object) -> None:
    assert getattr(impl, func)(*args) == expected


def test_tv_s4_dotted_model_keeps_six_tokens(impl: ModuleType) -> None:
    subject = impl.pool_work_subject("default", "l4", "default", "vidore/colqwen2.5-v0.2")
    tokens = subject.split(".")
    assert len(tokens) == 6
    assert "." not in tokens[5]
    assert impl.model_from_subject(subject) == "vidore/colqwen2.5-v0.2"


def test_tv_s4_sdk_direct_subject_has_six_dots(impl: ModuleType) -> None:
    assert impl.worker_direct_subject("default", "rtx6000", "sglang", "BAAI/bge-m3", "pod-0.svc").count(".") == 6


# ---------------------------------------------------------------------------------------------- TV-S5

TV_S5_MODEL: list[tuple[str, str | None]] = [
    ("sie.work.default.rtx6000.default.BAAI__bge-m3", "BAAI/bge-m3"),
    ("sie.work.eval-l4.l4.sglang.a_dot_b", "a.b"),
    ("sie.work.default.rtx6000.default.BAAI__bge-m3.worker-1", "BAAI/bge-m3"),
    ("", None),
    ("sie.work", None),
    ("sie.work.model", None),
    ("sie.work.default.l4.default", None),
    # No prefix check and no limit on extra tokens (sidecar-behaviour §3).
    ("x.y.z.w.v.m_dot_1.extra.more", "m.1"),
]


@pytest.mark.parametrize(("subject", "model"), TV_S5_MODEL, ids=[repr(s) for s, _ in TV_S5_MODEL])
def test_tv_s5_model_from_subject(impl: ModuleType, subject: str, model: str | None) -> None:
    assert impl.model_from_subject(subject) == model


TV_S5_DIRECT = [
    ("sie.work.default.rtx6000.default.BAAI__bge-m3", False),
    ("sie.work.default.rtx6000.default.BAAI__bge-m3.worker-1", True),
    ("sie.work.default.rtx6000.default.BAAI__bge-m3.worker-1.extra", False),
    ("other.work.default.rtx6000.default.BAAI__bge-m3.worker-1", False),
    ("sie.other.default.rtx6000.default.BAAI__bge-m3.worker-1", False),
    ("", False),
]


@pytest.mark.parametrize(("subject", "direct"), TV_S5_DIRECT, ids=[repr(s) for s, _ in TV_S5_DIRECT])
def test_tv_s5_worker_direct_detection(impl: ModuleType, subject: str, direct: bool) -> None:
    assert impl.is_worker_direct_subject(subject) is direct


@pytest.mark.parametrize(
    ("value", "token"), [(" default-pool ", "default-pool"), ("l4", "l4"), ("\tsglang\n", "sglang")]
)
def test_tv_s5_lane_token_is_trimmed(impl: ModuleType, value: str, token: str) -> None:
    assert impl.validate_lane_token(value) == token


TV_S5_BAD_LANE = ["", "   ", "\t", "foo.bar", "foo*", "foo>", "foo bar", "foo\tbar", "foo\u3000bar"]


@pytest.mark.parametrize("value", TV_S5_BAD_LANE, ids=[repr(v) for v in TV_S5_BAD_LANE])
def test_tv_s5_bad_lane_token_is_rejected(impl: ModuleType, value: str) -> None:
    with pytest.raises(SubjectError):
        impl.validate_lane_token(value)


def test_subject_error_is_a_value_error(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="empty"):
        impl.validate_lane_token("  ")


TV_PARSE: list[tuple[str, tuple[str, str, str, str, str | None] | None]] = [
    ("sie.work.default.rtx6000.default.BAAI__bge-m3", ("default", "rtx6000", "default", "BAAI/bge-m3", None)),
    (
        "sie.work.default.rtx6000.sglang.Qwen__Qwen3_dot_6-27B.worker-0_dot_svc",
        ("default", "rtx6000", "sglang", "Qwen/Qwen3.6-27B", "worker-0_dot_svc"),
    ),
    ("sie.work.default.l4.default", None),
    ("sie.work.default.rtx6000.default.m.w.extra", None),
    ("other.work.default.rtx6000.default.m", None),
    ("sie.queue.default.rtx6000.default.m", None),
    ("", None),
]


@pytest.mark.parametrize(("subject", "fields"), TV_PARSE, ids=[repr(s) for s, _ in TV_PARSE])
def test_parse_work_subject(
    impl: ModuleType, subject: str, fields: tuple[str, str, str, str, str | None] | None
) -> None:
    parsed = impl.parse_work_subject(subject)
    if fields is None:
        assert parsed is None
        return
    assert (parsed.pool, parsed.machine_profile, parsed.bundle, parsed.model, parsed.worker) == fields
    assert parsed == impl.WorkSubject(*fields)


def test_work_subject_is_frozen_hashable_and_picklable(impl: ModuleType) -> None:
    subject = impl.WorkSubject("p", "mp", "b", "m/x", "w")
    with pytest.raises(AttributeError):
        subject.pool = "other"
    assert hash(subject) == hash(("p", "mp", "b", "m/x", "w"))
    assert subject == impl.WorkSubject(pool="p", machine_profile="mp", bundle="b", model="m/x", worker="w")
    assert subject != impl.WorkSubject("p", "mp", "b", "m/x", None)
    assert subject != ("p", "mp", "b", "m/x", "w")
    assert impl.WorkSubject("p", "mp", "b", "m").worker is None
    assert repr(subject) == "WorkSubject(pool='p', machine_profile='mp', bundle='b', model='m/x', worker='w')"
    assert pickle.loads(pickle.dumps(subject)) == subject
    match subject:
        case impl.WorkSubject(pool, _, _, model, worker):
            assert (pool, model, worker) == ("p", "m/x", "w")
        case _:  # pragma: no cover
            pytest.fail("WorkSubject does not support positional patterns")


def test_native_work_subject_equals_twin(native: ModuleType, twin: ModuleType) -> None:
    fields = ("p", "mp", "b", "m", None)
    a = native.WorkSubject(*fields)
    b = twin.WorkSubject(*fields)
    assert a == b
    assert b == a
    assert (a != b) is False
    assert hash(a) == hash(b)
    assert repr(a) == repr(b)
    assert dataclasses.is_dataclass(b)


# --------------------------------------------------------------------------------- reply subjects (§3)

TV_REPLY = [
    ("", True),
    ("_INBOX.gw.req-1", True),
    ("_INBOX.", True),
    ("_INBOX", False),
    ("_INBOX_WORKER.x", False),
    (" ", False),
    (" _INBOX.x", False),
    ("_inbox.x", False),
    ("sie.work.x", False),
    # Whitespace or a control character would split the PUB line the reply is framed into.
    ("_INBOX.gw.x y", False),
    ("_INBOX.gw.x\tb", False),
    ("_INBOX.gw.x\r\nPUB sie.config.models.default 5\r\nevil!", False),
    ("_INBOX.gw.x\n", False),
    ("_INBOX.gw.\x00", False),
    ("_INBOX.gw.\x7f", False),
    ("_INBOX.gw.caf\u00e9", True),
]


@pytest.mark.parametrize(("subject", "safe"), TV_REPLY, ids=[repr(s) for s, _ in TV_REPLY])
def test_safe_reply_subject(impl: ModuleType, subject: str, safe: bool) -> None:
    assert impl.is_safe_reply_subject(subject) is safe


# ---------------------------------------------------------------------------------------------- TV-S6

TV_S6_BATCH: list[tuple[str, str, str | None]] = [
    ("batch_cancel.gw.worker-1.req-1", "worker-1", "req-1"),
    ("batch_cancel.gw.worker-1_dot_svc.req.with.dots", "worker-1.svc", "req.with.dots"),
    ("batch_cancel.gw.worker-2.req-1", "worker-1", None),
    ("batch_cancel.gw.worker-1", "worker-1", None),
    ("batch_cancel.gw.worker-1.", "worker-1", None),
    ("batch_cancel.gw", "worker-1", None),
    ("work_cancel.gw.worker-1.req-1", "worker-1", None),
    ("batch_cancel.gw.worker-1.svc.req", "worker-1.svc", None),
]


@pytest.mark.parametrize(("subject", "own", "request_id"), TV_S6_BATCH, ids=[s for s, _, _ in TV_S6_BATCH])
def test_tv_s6_batch_cancel(impl: ModuleType, subject: str, own: str, request_id: str | None) -> None:
    assert impl.parse_batch_cancel(subject, own) == request_id


TV_S6_WORK: list[tuple[str, tuple[str, str] | None]] = [
    ("work_cancel.gw.req.with.dots", ("gw", "req.with.dots")),
    ("work_cancel.gw.req-1", ("gw", "req-1")),
    ("work_cancel.gw", None),
    ("work_cancel.gw.", None),
    ("work_cancel..req", None),
    ("cancel.gw.req", None),
    ("work_cancel", None),
]


@pytest.mark.parametrize(("subject", "parsed"), TV_S6_WORK, ids=[repr(s) for s, _ in TV_S6_WORK])
def test_tv_s6_work_cancel(impl: ModuleType, subject: str, parsed: tuple[str, str] | None) -> None:
    assert impl.parse_work_cancel(subject) == parsed


TV_S6_GENERATE: list[tuple[str, tuple[str, str] | None]] = [
    ("cancel.gw.req.with.dots", ("gw", "req.with.dots")),
    ("cancel.gw.req", ("gw", "req")),
    ("cancel.gw", None),
    ("cancel.gw.", None),
    ("cancel..req", None),
    ("work_cancel.gw.req", None),
    ("batch_cancel.gw.w.req", None),
]


@pytest.mark.parametrize(("subject", "parsed"), TV_S6_GENERATE, ids=[repr(s) for s, _ in TV_S6_GENERATE])
def test_tv_s6_generate_cancel(impl: ModuleType, subject: str, parsed: tuple[str, str] | None) -> None:
    assert impl.parse_generate_cancel(subject) == parsed


# ---------------------------------------------------------------------------------------------- TV-S7

TV_S7 = [
    ("sie.work.default.rtx6000.sglang.*", "sie.work.default.rtx6000.sglang.*", True),
    ("sie.work.default.rtx6000.sglang.*", "sie.work.default.rtx6000.sglang.BAAI__bge-m3", True),
    ("sie.work.default.l4.default.*", "sie.work.default.h100.default.*", False),
    ("sie.work.default.rtx6000.default.*", "sie.work.default.rtx6000.sglang.*", False),
    ("sie.work.default.l4.default.*", "sie.work.default.l4.default.*.extra", False),
    ("sie.work.default.*", "sie.work.default.l4.default.*", False),
    ("sie.work.>", "sie.work.default.l4.default.foo", True),
    ("sie.>", "sie.work.default.l4.default.*", True),
    ("sie.work.>", "sie.work", False),
    ("sie.>", "nats.work.*.l4", False),
    ("sie.work.>", "sie.>", True),
    ("sie.>", "nats.>", False),
    ("", "sie.work.default.l4.default.*", False),
    # Beyond the fixture rows.
    ("", "", False),
    (">", "a", True),
    ("*", "a.b", False),
    ("*.>", "a", False),
    ("a.*.c", "a.b.*", True),
    ("a.b", "a.b", True),
    ("a.b", "a.c", False),
]


@pytest.mark.parametrize("swap", [False, True], ids=["ab", "ba"])
@pytest.mark.parametrize(("a", "b", "overlap"), TV_S7, ids=[f"{a!r}~{b!r}" for a, b, _ in TV_S7])
def test_tv_s7_filters_overlap(impl: ModuleType, a: str, b: str, overlap: bool, swap: bool) -> None:
    if swap:
        a, b = b, a
    assert impl.filters_overlap(a, b) is overlap


# ---------------------------------------------------------------------------------------------- properties

FORBIDDEN = (".", "*", ">", " ")
interesting = st.sampled_from(["sie", "work", "_dot_", "__", "_", ".", "/", "*", ">", " ", "\t", "a", "gw", "w-1", ""])
texty = st.one_of(st.text(max_size=40), st.lists(interesting, max_size=12).map("".join))
subjects = st.one_of(
    texty,
    st.tuples(
        st.sampled_from(["sie.work", "work_cancel", "cancel", "batch_cancel", "_INBOX", "sie", ""]),
        st.lists(st.one_of(st.sampled_from(["*", ">", "", "w-1", "gw", "a_dot_b"]), st.text(max_size=6)), max_size=8),
    ).map(lambda parts: ".".join([parts[0], *parts[1]])),
)


@fixture_ok
@given(value=texty)
def test_normalize_output_has_no_reserved_characters(impl: ModuleType, value: str) -> None:
    token = impl.normalize_token(value)
    assert not any(ch in token for ch in FORBIDDEN)


def _round_trips(value: str) -> bool:
    """Where the reverse mapping is exact: no `_` `*` `>` space, and no `.` followed by `.` or `/`.

    `.` becomes `_dot_`, whose underscores merge with a neighbouring `_`, `_dot_` or `__` into a `__`.
    """
    return not any(bad in value for bad in ("_", "*", ">", " ", "..", "./"))


@pytest.mark.parametrize(("value", "back"), [("._", "_dot/"), ("..", "_dot/dot_"), ("./", "_dot/_"), ("a_/b", "a/_b")])
def test_denormalize_is_best_effort(impl: ModuleType, value: str, back: str) -> None:
    assert impl.denormalize_token(impl.normalize_token(value)) == back


@fixture_ok
@given(value=st.one_of(st.text(max_size=40), st.text(alphabet="./ab", max_size=20)).filter(_round_trips))
def test_denormalize_inverts_normalize(impl: ModuleType, value: str) -> None:
    assert impl.denormalize_token(impl.normalize_token(value)) == value


@fixture_ok
@given(tokens=st.lists(st.text(alphabet="ab*", min_size=1, max_size=2), min_size=1, max_size=4))
def test_filter_overlaps_itself_and_is_symmetric(impl: ModuleType, tokens: list[str]) -> None:
    a = ".".join(tokens)
    assert impl.filters_overlap(a, a)
    b = ".".join([*tokens[:-1], ">"])
    assert impl.filters_overlap(a, b) == impl.filters_overlap(b, a) is True


def _outcome(func: Callable[..., Any], *args: str) -> tuple[str, object]:
    try:
        return ("ok", func(*args))
    except WireError as exc:
        return (type(exc).__name__, str(exc))


SINGLE_ARG = [
    "normalize_token",
    "denormalize_token",
    "validate_lane_token",
    "model_from_subject",
    "is_worker_direct_subject",
    "parse_work_subject",
    "is_safe_reply_subject",
    "parse_work_cancel",
    "parse_generate_cancel",
    "pool_stream_name",
    "pool_stream_subjects",
    "worker_stream_name",
    "worker_consumer_name",
    "health_subject",
]


@fixture_ok
@given(args=st.tuples(subjects, subjects, texty, texty, texty))
def test_native_parity_with_twin(native: ModuleType, twin: ModuleType, args: tuple[str, str, str, str, str]) -> None:
    a, b, c, d, e = args
    for name in SINGLE_ARG:
        assert _outcome(getattr(native, name), a) == _outcome(getattr(twin, name), a), name
    calls: list[tuple[str, tuple[str, ...]]] = [
        ("parse_batch_cancel", (a, c)),
        ("filters_overlap", (a, b)),
        ("pool_work_subject", (c, d, e, a)),
        ("worker_direct_subject", (c, d, e, a, b)),
        ("pool_durable_name", (c, d, e)),
        ("pool_durable_filter", (c, d, e)),
        ("worker_direct_filter", (c, d, e, a)),
    ]
    for name, call_args in calls:
        assert _outcome(getattr(native, name), *call_args) == _outcome(getattr(twin, name), *call_args), name
