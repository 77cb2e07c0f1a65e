# SPDX-License-Identifier: Apache-2.0
"""JSON-lines logs on stderr, one object per record, so log shippers need no parsing rules.

Hand-written (about 20 lines a library such as python-json-logger would replace) because the
`RUST_LOG`-style filter the spec names has no Python library, and the two belong together.

Each line carries `ts` (RFC 3339 UTC, milliseconds), `level` (lower-case Python level name), `logger`,
`msg`, then every `extra=` attribute (JSON values as they are, anything else as `str()`), then `exc`
with the formatted traceback and `stack` with the stack when present. An extra whose name is one of
those keys is written as `extra_<name>` so it can never forge a field.

The level accepts `RUST_LOG`-style filters as well as plain names, so one variable configures the
sidecar the way it configured the Rust original: `info`, `warn`, `trace` (= debug), `off`, or a comma
list mixing a global level with `target=level` directives (`info,sie_sidecar::pull=debug`; `::`
becomes `.` in the Python logger name). Unknown directives are skipped with a warning.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any, TextIO

_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": logging.CRITICAL + 10,
}
_RESERVED_KEYS = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__.keys() | {"message", "asctime", "taskName"}
)

# Loggers whose level a previous configure_logging call set, so a new call can reset them.
_configured_targets: set[str] = set()
#: Distinct (message, key) pairs one `Throttled` remembers before it starts afresh.
_THROTTLE_KEYS = 1024


def parse_log_filter(spec: str) -> tuple[int, dict[str, int], list[str]]:
    """Split a RUST_LOG-style filter into (root level, per-logger levels, unknown directives)."""
    root = logging.INFO
    targets: dict[str, int] = {}
    unknown: list[str] = []
    for raw in spec.split(","):
        directive = raw.strip()
        if not directive:
            continue
        target, sep, name = directive.rpartition("=")
        level = _LEVELS.get(name.strip().lower())
        if level is None:
            # Includes a bare target (`sie_sidecar`), which in Rust means "everything from it"; too loose here.
            unknown.append(directive)
        elif sep:
            targets[target.strip().replace("::", ".")] = level
        else:
            root = level
    return root, targets, unknown


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC)
        out: dict[str, Any] = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key in _RECORD_ATTRS or key.startswith("_"):
                continue
            out[f"extra_{key}" if key in _RESERVED_KEYS else key] = _jsonable(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _jsonable(value: object) -> object:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return str(value)
    return value


class _JsonHandler(logging.StreamHandler[TextIO]):
    """Marker class, so configure_logging can find and replace the handler it installed earlier."""


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Install the JSON handler on the root logger (replacing ours from an earlier call) and set levels."""
    root_level, targets, unknown = parse_log_filter(level)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _JsonHandler)]:
        root.removeHandler(handler)
        handler.close()
    handler = _JsonHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(root_level)
    for name in _configured_targets - targets.keys():
        logging.getLogger(name).setLevel(logging.NOTSET)
    for name, target_level in targets.items():
        logging.getLogger(name).setLevel(target_level)
    _configured_targets.clear()
    _configured_targets.update(targets)
    for directive in unknown:
        logging.getLogger(__name__).warning("ignoring unknown log filter directive", extra={"directive": directive})


def should_log(failures: int) -> bool:
    """Log a run of failures on counts 1, 5, 30 and every 120th (the §10 rule of the health publisher and
    the backend heartbeat; the NATS connection follows it too)."""
    return failures in (1, 5, 30) or failures % 120 == 0


class Throttled:
    """Rate-limits one repeating log line (a warning per failed batch, per heartbeat, per message).

    The first occurrence of each key is logged at once; repeats within `interval_s` are counted, and
    the next line after the interval carries `repeats` (how many were folded into it) so the volume
    stays bounded while a failing dependency keeps failing, and nothing is lost from the count.
    """

    __slots__ = ("_clock", "_interval_s", "_logger", "_state")

    def __init__(
        self, logger: logging.Logger, interval_s: float = 10.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not interval_s >= 0:
            raise ValueError("interval_s must be >= 0")
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._state: dict[Hashable, tuple[float, int]] = {}  # key -> (last emitted at, repeats since)

    def log(self, level: int, msg: str, *, key: Hashable = None, extra: dict[str, Any] | None = None) -> bool:
        """Log `msg` unless the same key was logged less than `interval_s` ago; True when it was logged."""
        return self._emit(level, msg, key, extra)

    def warning(self, msg: str, *, key: Hashable = None, extra: dict[str, Any] | None = None) -> bool:
        return self._emit(logging.WARNING, msg, key, extra)

    def _emit(self, level: int, msg: str, key: Hashable, extra: dict[str, Any] | None) -> bool:
        if not self._logger.isEnabledFor(level):
            return False
        k = (msg, key)
        now = self._clock()
        last = self._state.get(k)
        if last is not None and now - last[0] < self._interval_s:
            self._state[k] = (last[0], last[1] + 1)
            return False
        if len(self._state) >= _THROTTLE_KEYS:
            self._state.clear()  # keys are few (models, methods); a flood of new ones only costs lines
        self._state[k] = (now, 0)
        fields = dict(extra or {})
        if last is not None and last[1]:
            fields["repeats"] = last[1]
        self._logger.log(level, msg, extra=fields, stacklevel=3)  # the caller's file and line
        return True

    def suppressed(self, msg: str, key: Hashable = None) -> int:
        """Repeats of (msg, key) counted since its last line (for tests and summaries)."""
        state = self._state.get((msg, key))
        return 0 if state is None else state[1]


__all__ = [
    "JsonFormatter",
    "Throttled",
    "configure_logging",
    "parse_log_filter",
    "should_log",
]
