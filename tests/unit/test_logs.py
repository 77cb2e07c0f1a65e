# SPDX-License-Identifier: Apache-2.0
"""JSON-lines logging: line shape, extras, tracebacks, RUST_LOG-style levels, idempotence."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import logs
from sie_sidecar.logs import JsonFormatter, configure_logging, parse_log_filter

TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put the root logger back after each test."""
    root = logging.getLogger()
    level = root.level
    handlers = list(root.handlers)
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    for name in logs._configured_targets:
        logging.getLogger(name).setLevel(logging.NOTSET)
    logs._configured_targets.clear()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def configured(level: str = "info") -> io.StringIO:
    stream = io.StringIO()
    configure_logging(level, stream)
    return stream


def test_line_has_the_core_keys() -> None:
    stream = configured()
    logging.getLogger("sie_sidecar.test").info("hello %s", "world")
    [line] = lines(stream)
    assert list(line)[:4] == ["ts", "level", "logger", "msg"]
    assert line["level"] == "info"
    assert line["logger"] == "sie_sidecar.test"
    assert line["msg"] == "hello world"


def test_ts_is_rfc3339_utc_with_milliseconds() -> None:
    stream = configured()
    before = dt.datetime.now(dt.UTC)
    logging.getLogger("t").warning("x")
    after = dt.datetime.now(dt.UTC)
    [line] = lines(stream)
    assert TS_RE.fullmatch(line["ts"])
    ts = dt.datetime.fromisoformat(line["ts"])
    assert ts.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(milliseconds=1) <= ts <= after


def test_extras_are_carried() -> None:
    stream = configured()
    logging.getLogger("t").info(
        "settings", extra={"pool": "l4", "n": 3, "ratio": 0.5, "ok": True, "none": None, "tags": ["a"], "m": {"k": 1}}
    )
    [line] = lines(stream)
    assert line["pool"] == "l4"
    assert (line["n"], line["ratio"], line["ok"], line["none"]) == (3, 0.5, True, None)
    assert line["tags"] == ["a"]
    assert line["m"] == {"k": 1}


def test_tuples_become_json_arrays() -> None:
    stream = configured()
    logging.getLogger("t").info("x", extra={"sockets": ("/a", "/b")})
    assert lines(stream)[0]["sockets"] == ["/a", "/b"]


def test_unserialisable_extras_use_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing!"

    stream = configured()
    logging.getLogger("t").info("x", extra={"thing": Thing(), "raw": b"\x00\x01", "nan_set": {1}})
    [line] = lines(stream)
    assert line["thing"] == "thing!"
    assert line["raw"] == "b'\\x00\\x01'"
    assert line["nan_set"] == "{1}"


def test_extras_cannot_forge_core_keys() -> None:
    stream = configured()
    logging.getLogger("real").info("x", extra={"ts": "forged", "level": "forged", "logger": "forged", "exc": "forged"})
    [line] = lines(stream)
    assert line["logger"] == "real"
    assert line["level"] == "info"
    assert TS_RE.fullmatch(line["ts"])
    assert (line["extra_ts"], line["extra_level"], line["extra_logger"], line["extra_exc"]) == ("forged",) * 4
    assert "exc" not in line


def test_exception_traceback_in_exc() -> None:
    stream = configured()
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        logging.getLogger("t").exception("failed", extra={"batch": 7})
    [line] = lines(stream)
    assert line["level"] == "error"
    assert line["msg"] == "failed"
    assert line["batch"] == 7
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: boom" in line["exc"]


def test_no_exc_key_without_exception() -> None:
    stream = configured()
    logging.getLogger("t").error("plain")
    assert "exc" not in lines(stream)[0]


def test_stack_info() -> None:
    stream = configured()
    logging.getLogger("t").info("where", stack_info=True)
    assert lines(stream)[0]["stack"].startswith("Stack (most recent call last):")


@given(msg=st.text(max_size=40))
def test_every_record_is_exactly_one_json_line(msg: str) -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, msg, None, None)
    text = JsonFormatter().format(record)
    assert "\n" not in text
    assert json.loads(text)["msg"] == msg


def test_non_ascii_is_kept_readable() -> None:
    stream = configured()
    logging.getLogger("t").info("modèle prêt ✓")
    assert "modèle prêt ✓" in stream.getvalue()


def test_idempotent_no_duplicate_handlers() -> None:
    first = configured()
    second = configured()
    ours = [h for h in logging.getLogger().handlers if isinstance(h, logs._JsonHandler)]
    assert len(ours) == 1
    logging.getLogger("t").info("once")
    assert first.getvalue() == ""
    assert len(lines(second)) == 1


def test_other_handlers_are_left_alone() -> None:
    other = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(other)
    try:
        configured()
        configured()
        assert other in root.handlers
    finally:
        root.removeHandler(other)


def test_default_stream_is_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    logging.getLogger("t").info("to stderr")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err.splitlines()[-1])["msg"] == "to stderr"


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("trace", logging.DEBUG),
        ("debug", logging.DEBUG),
        ("info", logging.INFO),
        ("warn", logging.WARNING),
        ("warning", logging.WARNING),
        ("error", logging.ERROR),
        ("WARN", logging.WARNING),
        (" Error ", logging.ERROR),
        ("", logging.INFO),
    ],
)
def test_level_names(name: str, level: int) -> None:
    configured(name)
    assert logging.getLogger().level == level


def test_level_filters_records() -> None:
    stream = configured("warn")
    log = logging.getLogger("t")
    log.info("dropped")
    log.warning("kept")
    assert [line["msg"] for line in lines(stream)] == ["kept"]
    assert lines(stream)[0]["level"] == "warning"


def test_off_silences_everything() -> None:
    stream = configured("off")
    logging.getLogger("t").critical("nothing")
    assert stream.getvalue() == ""


def test_trace_enables_debug_records() -> None:
    stream = configured("trace")
    logging.getLogger("t").debug("fine detail")
    assert lines(stream)[0]["level"] == "debug"


def test_rust_log_target_directives() -> None:
    stream = configured("warn,sie_sidecar::bus::pull=debug")
    logging.getLogger("sie_sidecar.bus.pull").debug("pull detail")
    logging.getLogger("sie_sidecar.bus.pull.inner").debug("inherits")
    logging.getLogger("sie_sidecar.pipeline.dispatcher").info("filtered")
    assert [line["msg"] for line in lines(stream)] == ["pull detail", "inherits"]


def test_reconfigure_resets_previous_target_levels() -> None:
    configured("info,sie_sidecar.bus.pull=debug")
    assert logging.getLogger("sie_sidecar.bus.pull").level == logging.DEBUG
    configured("info")
    assert logging.getLogger("sie_sidecar.bus.pull").level == logging.NOTSET


def test_unknown_directive_is_skipped_with_a_warning() -> None:
    stream = configured("loud,info")
    assert logging.getLogger().level == logging.INFO
    [line] = lines(stream)
    assert line["level"] == "warning"
    assert line["directive"] == "loud"


def test_parse_log_filter() -> None:
    assert parse_log_filter("debug, a::b=error ,c=trace,bogus=7,x") == (
        logging.DEBUG,
        {"a.b": logging.ERROR, "c": logging.DEBUG},
        ["bogus=7", "x"],
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttled_logs_the_first_line_then_one_per_interval_with_the_repeats(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    logger = logging.getLogger("sie_sidecar.test_throttled")
    warn = logs.Throttled(logger, 10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert warn.warning("batch failed", key="m", extra={"model": "m"}) is True
        for i in range(1, 1300):  # a failing backend: one call per batch, 1,300 in 13 s
            clock.now = i / 100
            warn.warning("batch failed", key="m", extra={"model": "m"})
        assert warn.suppressed("batch failed", "m") == 299  # since the second line, at 10 s
        assert warn.warning("batch failed", key="other") is True  # another key has its own budget
    lines = [r for r in caplog.records if r.getMessage() == "batch failed"]
    assert len(lines) == 3
    assert [getattr(r, "repeats", None) for r in lines] == [None, 999, None]
    assert all(r.funcName == "test_throttled_logs_the_first_line_then_one_per_interval_with_the_repeats" for r in lines)


def test_throttled_skips_disabled_levels_and_rejects_a_negative_interval() -> None:
    logger = logging.getLogger("sie_sidecar.test_throttled_off")
    logger.setLevel(logging.ERROR)
    try:
        assert logs.Throttled(logger).warning("quiet") is False
    finally:
        logger.setLevel(logging.NOTSET)
    with pytest.raises(ValueError):
        logs.Throttled(logger, -1.0)
