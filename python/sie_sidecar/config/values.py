# SPDX-License-Identifier: Apache-2.0
"""Typed access to the raw settings: one value at a time, flag first, then the environment.

`EnvValues` is what every part of the env reader asks for a value: a §1.1 number is a start-up
error when malformed (as a typed CLI flag would be); a §1.2 value that is malformed or out of its
range is its default plus a line in `warnings`; any number beyond `LIMITS` is a start-up error
naming the variable; a boolean takes only the words it lists. Every refusal is one `ConfigError`
line naming the variable (and its flag), never a traceback.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from typing import Final, NoReturn

from .. import wire
from ..errors import ConfigError, SubjectError
from .flags import RUN_FLAGS
from .limits import INT64_MAX, LIMITS

UINT_RE = re.compile(r"[0-9]+", re.ASCII)
FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.I)
FALSY = frozenset({"0", "false", "no", "off"})
TRUTHY = frozenset({"1", "true", "yes", "on"})

#: The order boolean words are listed in, in refusal lines.
_WORD_ORDER: Final = ("1", "true", "yes", "on", "0", "false", "no", "off", "disabled")


def words(choices: frozenset[str]) -> str:
    """`1, true, yes or on`."""
    ordered = sorted(choices, key=lambda w: (_WORD_ORDER.index(w) if w in _WORD_ORDER else len(_WORD_ORDER), w))
    return ordered[0] if len(ordered) == 1 else f"{', '.join(ordered[:-1])} or {ordered[-1]}"


def _number(value: float) -> str:
    """A number for an error message: integers exactly, floats as Python writes them."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e16):
        return str(int(value))
    return repr(value)


class EnvValues:
    """Reads raw values flag-first, parses them and collects warnings for `Settings.warnings`."""

    def __init__(self, environ: Mapping[str, str], namespace: argparse.Namespace | None) -> None:
        self.environ = environ
        self.namespace = namespace
        # Secrets have no flag to read (`refuse_secret_flags`): only the environment.
        self._flags = {spec.env: spec for spec in RUN_FLAGS if not spec.secret}
        self.warnings: list[str] = []

    # -- raw access

    def _label(self, env: str) -> str:
        spec = self._flags.get(env)
        return f"{env} ({spec.flag})" if spec is not None else env

    def raw(self, env: str) -> str | None:
        """The flag value when given, else the env value; None when neither."""
        spec = self._flags.get(env)
        if spec is not None and self.namespace is not None:
            value = getattr(self.namespace, spec.dest, None)
            if value is not None:
                return str(value)
        return self.environ.get(env)

    def text(self, env: str) -> str | None:
        """Trimmed value; blank counts as unset."""
        value = self.raw(env)
        if value is None or not value.strip():
            return None
        return value.strip()

    def fail(self, env: str, problem: str) -> NoReturn:
        raise ConfigError(f"{self._label(env)}: {problem}")

    def within_limit(self, env: str, value: float) -> None:
        """A value beyond `LIMITS[env]` would pass here and fail later (at the server, say): refuse it now."""
        maximum = LIMITS.get(env, INT64_MAX)
        if value > maximum:
            self.fail(env, f"{_number(value)} is out of range (at most {_number(maximum)})")

    # -- §1.1 typed values: malformed = startup error

    def uint(self, env: str, default: int, *, limit: bool = True) -> int:
        value = self.text(env)
        if value is None:
            return default
        if not UINT_RE.fullmatch(value):
            self.fail(env, f"expected a non-negative integer, got {value!r}")
        if limit:
            self.within_limit(env, int(value))
        return int(value)

    def seconds_to_ms(self, env: str, default_s: float, floor_ms: int) -> int:
        """Float seconds → whole ms, floored; non-finite or ≤ 0 gives the floor (§1.1 pool admission rows)."""
        value = self.text(env)
        seconds = default_s if value is None else self._float(env, value)
        if not math.isfinite(seconds) or seconds <= 0:
            return floor_ms
        self.within_limit(env, seconds)
        return max(floor_ms, int(seconds * 1000))

    def _float(self, env: str, value: str) -> float:
        if not FLOAT_RE.fullmatch(value):
            self.fail(env, f"expected a number, got {value!r}")
        return float(value)

    def lane(self, env: str) -> str:
        value = self.raw(env)
        if value is None:
            self.fail(env, "not set (required)")
        try:
            return wire.validate_lane_token(value)
        except SubjectError as exc:
            self.fail(env, str(exc))

    # -- §1.2 env-only values: malformed or out of range = default plus a warning

    def env_uint(self, env: str, default: int, valid: Callable[[int], bool] = lambda n: n > 0) -> int:
        value = self.environ.get(env)
        if value is None:
            return default
        stripped = value.strip()
        if UINT_RE.fullmatch(stripped):
            self.within_limit(env, int(stripped))
            if valid(int(stripped)):
                return int(stripped)
        self.warnings.append(f"{env}={value!r} ignored; using {default}")
        return default

    def env_uint_given(
        self, env: str, default: int, valid: Callable[[int], bool] = lambda n: n > 0
    ) -> tuple[int, bool]:
        """`env_uint`, and whether the value came from the environment (set and not ignored): such
        a setting pins its knob against what the backend reports."""
        warned = len(self.warnings)
        value = self.env_uint(env, default, valid)
        return value, env in self.environ and len(self.warnings) == warned

    def env_float(self, env: str, default: float, valid: Callable[[float], bool] = lambda x: x > 0) -> float:
        """A finite float accepted by `valid`; anything else is the default plus a warning."""
        value = self.environ.get(env)
        if value is None:
            return default
        try:
            parsed = float(value.strip())
        except ValueError:
            parsed = math.nan
        if math.isfinite(parsed):
            self.within_limit(env, parsed)
            if valid(parsed):
                return parsed
        self.warnings.append(f"{env}={value!r} ignored; using {default}")
        return default

    def env_flag(
        self,
        env: str,
        *,
        default: bool,
        true: frozenset[str] = TRUTHY,
        false: frozenset[str] = FALSY,
        blank: bool | None = None,
    ) -> bool:
        """An env-only boolean (`flag`)."""
        return self.flag(env, self.environ.get(env), default=default, true=true, false=false, blank=blank)

    def flag(
        self,
        env: str,
        value: str | None,
        *,
        default: bool,
        true: frozenset[str] = TRUTHY,
        false: frozenset[str] = FALSY,
        blank: bool | None = None,
    ) -> bool:
        """`true` or `false` words (trimmed, any case); unset is `default`, blank is `blank` (else the
        default). Any other word is refused: upstream reads it as off, so `SIE_METRICS_ENABLED=maybe`
        or a typo of `true` would switch a feature off without a word."""
        if value is None:
            return default
        word = value.strip().lower()
        if not word:
            return default if blank is None else blank
        if word in true:
            return True
        if word in false:
            return False
        self.fail(env, f"expected {words(true)} (on) or {words(false)} (off), got {value!r}")
