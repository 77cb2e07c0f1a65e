# SPDX-License-Identifier: Apache-2.0
"""Pure-Python twin of the adaptive batch controller (`sie_core::controller`, scheduler-and-prep §4).

Same API and the same outputs, bit for bit: every f64 expression is evaluated in the Rust order
(Python floats are IEEE-754 doubles and CPython does not fuse), the cost is truncated like Rust's
saturating `as u64`, and the replay's JSON numbers are converted from their lexeme exactly like
Rust's `f64::from_str`. Argument checks raise the exception types PyO3 raises for the native class.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from ..sched.controller_params import (
    DT_CAP_S,
    EFFICIENCY_WINDOW,
    ENV_CALIBRATION_MULT,
    ENV_INITIAL_COST,
    ENV_INITIAL_WAIT_MS,
    ENV_MAX_COST,
    ENV_MAX_TARGET_P50_MS,
    ENV_MAX_WAIT_MS,
    ENV_MIN_COST,
    ENV_MIN_TARGET_P50_MS,
    ENV_MIN_WAIT_MS,
    ENV_TARGET_P50_MS,
    ENV_VARS,
    IDLE_DECAY_AFTER_S,
    IDLE_DECAY_BASE,
    INFERENCE_MIN_SAMPLES,
    INFERENCE_WINDOW,
    LATENCY_MIN_SAMPLES,
    LATENCY_WINDOW,
    PRODUCTION_INITIAL_WAIT_MS,
    PRODUCTION_MIN_WAIT_MS,
)

U64_MAX: Final = 2**64 - 1
_TWO_POW_64: Final = 18446744073709551616.0

_log = logging.getLogger("sie_sidecar.sched.controller")


# ------------------------------------------------------------------ argument conversion (PyO3's rules)


def _f64(value: object) -> float:
    """PyO3's `f64` extraction: floats, ints and anything with `__float__`; never `str`."""
    if isinstance(value, float):
        return value
    convert = getattr(type(value), "__float__", None)
    if convert is not None:
        return float(convert(value))
    if hasattr(type(value), "__index__"):
        return float(operator.index(value))  # type: ignore[arg-type]
    raise TypeError(f"must be real number, not {type(value).__name__}")


def _opt_f64(value: object) -> float | None:
    return None if value is None else _f64(value)


def _u64(value: object) -> int:
    """PyO3's `u64` extraction: an integer (not a float) within [0, 2**64)."""
    n = operator.index(value)  # type: ignore[arg-type]
    if n < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if n > U64_MAX:
        raise OverflowError("int too big to convert")
    return n


def _opt_u64(value: object) -> int | None:
    return None if value is None else _u64(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"'{type(value).__name__}' object cannot be converted to 'PyBool'")
    return value


# --------------------------------------------------------------------------------- Rust arithmetic


def _clamp(x: float, lo: float, hi: float) -> float:
    """Rust's `clamp`: a NaN input stays NaN (no NaN reaches here from validated state)."""
    if x < lo:  # noqa: PLR1730 (ifs, not min/max: the Rust shape, and faster)
        x = lo
    if x > hi:  # noqa: PLR1730
        x = hi
    return x


def _clamp_int(x: int, lo: int, hi: int) -> int:
    return lo if x < lo else hi if x > hi else x


def _as_u64(x: float) -> int:
    """Rust's `f64 as u64`: truncates toward zero, saturates, NaN becomes 0."""
    if math.isnan(x) or x <= 0.0:
        return 0
    if x >= _TWO_POW_64:
        return U64_MAX
    return int(x)


# ---------------------------------------------------------------------------------------- windows


class PercentileWindow:
    """The last `capacity` samples: percentile by sort-and-index (`floor(p/100 x (n - 1))`) or mean,
    both `None` below `min_samples`. NaN is dropped (it has no rank)."""

    __slots__ = ("_capacity", "_min_samples", "_samples")

    def __init__(self, capacity: int, min_samples: int = 1) -> None:
        capacity = _u64(capacity)
        min_samples = _u64(min_samples)
        if capacity == 0:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._min_samples = min_samples
        self._samples: deque[float] = deque(maxlen=capacity)

    def push(self, value: float) -> bool:
        v = _f64(value)
        if math.isnan(v):
            return False
        self._samples.append(v)
        return True

    def extend(self, values: Sequence[float]) -> int:
        """`push` of each value in order (a batch's latencies at once); how many were kept."""
        return sum(self.push(v) for v in list(values))

    def percentile(self, p: float) -> float | None:
        p = _f64(p)
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile must be within [0, 100], got {p}")
        n = len(self._samples)
        if n < self._min_samples or n == 0:
            return None
        ordered = sorted(self._samples)  # stable, -0.0 == 0.0: the same order as Rust's sort_by
        return ordered[min(math.floor(p / 100.0 * (n - 1)), n - 1)]

    def p50(self) -> float | None:
        return self.percentile(50.0)

    def mean(self) -> float | None:
        n = len(self._samples)
        if n < self._min_samples or n == 0:
            return None
        total = 0.0
        for v in self._samples:  # left to right, like Rust (not sum(), which compensates on 3.12+)
            total += v
        return total / n

    def values(self) -> list[float]:
        return list(self._samples)

    def clear(self) -> None:
        self._samples.clear()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def min_samples(self) -> int:
        return self._min_samples

    def __len__(self) -> int:
        return len(self._samples)


# ----------------------------------------------------------------------------------- configuration


@dataclass(slots=True)
class _Config:
    target_p50_ms: float | None = None
    calibration_multiplier: float = 1.5
    min_target_p50_ms: float = 5.0
    max_target_p50_ms: float = 500.0
    min_wait_ms: float = 1.0
    max_wait_ms: float = 50.0
    initial_wait_ms: float = 10.0
    min_batch_cost: int = 256
    max_batch_cost: int = 65536
    initial_batch_cost: int = 16384
    gain: float = 0.3
    integral_gain: float = 0.05
    cost_gain: float = 0.15
    update_interval: int = 10
    fill_ratio_threshold: float = 0.7
    integral_max: float = 20.0
    starvation_recovery_enabled: bool = True
    starvation_window: int = 20
    starvation_batch_size: int = 1

    def validate(self) -> None:
        """The same rejections as `ControllerConfig::validate`, in the same order."""
        t = self.target_p50_ms
        if t is not None and not (math.isfinite(t) and t > 0.0):
            raise ValueError(f"target_p50_ms must be finite and > 0, got {t}")
        for name in sorted(_FLOAT_FIELDS):
            v = getattr(self, name)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
        if self.calibration_multiplier <= 0.0:
            raise ValueError("calibration_multiplier must be > 0")
        if not (self.min_target_p50_ms > 0.0 and self.min_target_p50_ms <= self.max_target_p50_ms):
            raise ValueError("need 0 < min_target_p50_ms <= max_target_p50_ms")
        if not (self.min_wait_ms >= 0.0 and self.min_wait_ms <= self.max_wait_ms):
            raise ValueError("need 0 <= min_wait_ms <= max_wait_ms")
        if self.min_batch_cost > self.max_batch_cost:
            raise ValueError("need min_batch_cost <= max_batch_cost")
        for name in ("gain", "integral_gain", "cost_gain"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {v}")
        if self.integral_max < 0.0:
            raise ValueError("integral_max must be >= 0")
        if self.update_interval == 0:
            raise ValueError("update_interval must be >= 1")
        if self.starvation_window == 0:
            raise ValueError("starvation_window must be >= 1")

    def apply_env(self, env: Mapping[str, str]) -> list[str]:
        """`ControllerConfig::apply_env`: overrides, then `min := max` where a range is inverted."""
        warnings: list[str] = []

        def read(name: str) -> str | None:
            raw = env.get(name)
            if raw is not None and not isinstance(raw, str):
                raise TypeError(f"'{type(raw).__name__}' object cannot be converted to 'PyString'")
            return raw

        def number(name: str, ok: Any, current: float) -> float:
            raw = read(name)
            if raw is None:
                return current
            v = _env_f64(raw)
            if v is None or not ok(v):
                warnings.append(f"ignoring {name}={raw!r}: not a valid number")
                return current
            return v

        target = number(ENV_TARGET_P50_MS, lambda v: v > 0.0, math.nan)
        if not math.isnan(target):
            self.target_p50_ms = target
        self.calibration_multiplier = number(ENV_CALIBRATION_MULT, lambda v: v > 0.0, self.calibration_multiplier)
        self.min_target_p50_ms = number(ENV_MIN_TARGET_P50_MS, lambda v: v > 0.0, self.min_target_p50_ms)
        self.max_target_p50_ms = number(ENV_MAX_TARGET_P50_MS, lambda v: v > 0.0, self.max_target_p50_ms)
        self.min_wait_ms = number(ENV_MIN_WAIT_MS, lambda v: v >= 0.0, self.min_wait_ms)
        self.max_wait_ms = number(ENV_MAX_WAIT_MS, lambda v: v >= 0.0, self.max_wait_ms)
        self.initial_wait_ms = number(ENV_INITIAL_WAIT_MS, lambda v: True, self.initial_wait_ms)
        for name, field in (
            (ENV_MIN_COST, "min_batch_cost"),
            (ENV_MAX_COST, "max_batch_cost"),
            (ENV_INITIAL_COST, "initial_batch_cost"),
        ):
            raw = read(name)
            if raw is None:
                continue
            n = _env_u64(raw)
            if n is None:
                warnings.append(f"ignoring {name}={raw!r}: not an unsigned integer")
            else:
                setattr(self, field, n)
        self.min_wait_ms = min(self.min_wait_ms, self.max_wait_ms)
        self.min_batch_cost = min(self.min_batch_cost, self.max_batch_cost)
        self.min_target_p50_ms = min(self.min_target_p50_ms, self.max_target_p50_ms)
        return warnings


_ENV_WS: Final = " \t\n\x0c\r"  # Rust's char::is_ascii_whitespace
# Rust's `f64::from_str` grammar for finite values ("inf"/"nan" forms are non-finite: ignored anyway).
_RUST_FLOAT: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _env_f64(raw: str) -> float | None:
    s = raw.strip(_ENV_WS)
    if not _RUST_FLOAT.match(s):
        return None
    v = float(s)
    return v if math.isfinite(v) else None


def _env_u64(raw: str) -> int | None:
    s = raw.strip(_ENV_WS)
    if not s or not s.isascii() or not s.isdigit() or len(s) > 20:
        return None
    n = int(s)
    return n if n <= U64_MAX else None


def production_cost_range(budget: int) -> tuple[int, int, int]:
    """`(floor, ceil, initial)` of the cost knob for a model budget `B` (§4.2)."""
    budget = _u64(budget)
    floor = min(max(256, budget // 4), max(budget, 1))
    ceil = max(floor, min(budget * 4, U64_MAX))  # saturating multiply
    return floor, ceil, _clamp_int(budget, floor, ceil)


def _production_config(budget: int, initial_wait_ms: float) -> _Config:
    floor, ceil, initial = production_cost_range(budget)
    base = _Config()
    base.min_wait_ms = PRODUCTION_MIN_WAIT_MS
    base.initial_wait_ms = _f64(initial_wait_ms)
    base.min_batch_cost, base.max_batch_cost, base.initial_batch_cost = floor, ceil, initial
    base.cost_gain = base.gain * 0.5
    return base


# -------------------------------------------------------------------------------------- controller


class AdaptiveController:
    """PI control of the batch wait and cost cap from the latency headroom (scheduler-and-prep §4)."""

    __slots__ = (
        "_c",
        "_calibrated",
        "_clock_s",
        "_cost",
        "_inference",
        "_integral",
        "_last_fill",
        "_last_observed",
        "_last_step_time",
        "_resets",
        "_steps",
        "_streak",
        "_target",
        "_wait",
    )

    _c: _Config
    _calibrated: bool
    _clock_s: float
    _cost: int
    _inference: PercentileWindow
    _integral: float
    _last_fill: float | None
    _last_observed: float | None
    _last_step_time: float | None
    _resets: int
    _steps: int
    _streak: int
    _target: float | None
    _wait: float

    def __init__(
        self,
        *,
        target_p50_ms: float | None = None,
        calibration_multiplier: float = 1.5,
        min_target_p50_ms: float = 5.0,
        max_target_p50_ms: float = 500.0,
        min_wait_ms: float = 1.0,
        max_wait_ms: float = 50.0,
        initial_wait_ms: float = 10.0,
        min_batch_cost: int = 256,
        max_batch_cost: int = 65536,
        initial_batch_cost: int = 16384,
        gain: float = 0.3,
        integral_gain: float = 0.05,
        cost_gain: float = 0.15,
        update_interval: int = 10,
        fill_ratio_threshold: float = 0.7,
        integral_max: float = 20.0,
        starvation_recovery_enabled: bool = True,
        starvation_window: int = 20,
        starvation_batch_size: int = 1,
    ) -> None:
        config = _Config(
            target_p50_ms=_opt_f64(target_p50_ms),
            calibration_multiplier=_f64(calibration_multiplier),
            min_target_p50_ms=_f64(min_target_p50_ms),
            max_target_p50_ms=_f64(max_target_p50_ms),
            min_wait_ms=_f64(min_wait_ms),
            max_wait_ms=_f64(max_wait_ms),
            initial_wait_ms=_f64(initial_wait_ms),
            min_batch_cost=_u64(min_batch_cost),
            max_batch_cost=_u64(max_batch_cost),
            initial_batch_cost=_u64(initial_batch_cost),
            gain=_f64(gain),
            integral_gain=_f64(integral_gain),
            cost_gain=_f64(cost_gain),
            update_interval=_u64(update_interval),
            fill_ratio_threshold=_f64(fill_ratio_threshold),
            integral_max=_f64(integral_max),
            starvation_recovery_enabled=_bool(starvation_recovery_enabled),
            starvation_window=_u64(starvation_window),
            starvation_batch_size=_u64(starvation_batch_size),
        )
        self._init(config)

    def _init(self, config: _Config) -> None:
        config.validate()
        self._c = config
        self._target = config.target_p50_ms
        self._calibrated = config.target_p50_ms is not None
        self._resets = 0
        self._inference = PercentileWindow(INFERENCE_WINDOW, INFERENCE_MIN_SAMPLES)
        self.reset()

    @staticmethod
    def production(
        budget: int, initial_wait_ms: float = PRODUCTION_INITIAL_WAIT_MS, env: Mapping[str, str] | None = None
    ) -> AdaptiveController:
        """The production controller for a model budget `B` (§4.2), with the
        `SIE_ADAPTIVE_BATCH_*` overrides read from `env` when given (bad values logged, ignored)."""
        config = _production_config(budget, initial_wait_ms)
        if env is not None:
            for warning in config.apply_env(env):
                _log.warning("%s", warning)
        ctl = AdaptiveController.__new__(AdaptiveController)
        ctl._init(config)
        return ctl

    def record_inference(self, inference_ms: float) -> None:
        """One backend batch's inference time (ms); kept only while the target is uncalibrated."""
        v = _f64(inference_ms)
        if not self._calibrated:
            self._inference.push(v)

    def reset(self) -> None:
        """Knobs back to their clamped initial values, counters cleared; an auto-calibrated target is
        forgotten (an explicit one kept); `starvation_resets` is monotonic."""
        c = self._c
        self._wait = _clamp(c.initial_wait_ms, c.min_wait_ms, c.max_wait_ms)
        self._cost = _clamp_int(c.initial_batch_cost, c.min_batch_cost, c.max_batch_cost)
        self._integral = 0.0
        self._last_step_time = None
        self._steps = 0
        self._streak = 0
        self._last_observed = None
        self._last_fill = None
        self._clock_s = 0.0
        if c.target_p50_ms is None:
            self._target = None
            self._calibrated = False
            self._inference.clear()

    def _step_after(
        self, dt_s: float, observed: float | None, fill: float | None, batch_size: int | None
    ) -> tuple[float, int]:
        """Replay's virtual clock: advance by `dt_s`, then step at the new time."""
        self._clock_s += dt_s
        return self.step(observed, fill, batch_size, self._clock_s)

    def step(
        self, observed_p50_ms: float | None, fill_ratio: float | None, batch_size: int | None, now_s: float
    ) -> tuple[float, int]:
        """One completion: returns `(wait_ms, batch_cost)` now in force. `now_s` is a monotonic clock
        in seconds (the caller's, so tests and replays control time)."""
        observed = _opt_f64(observed_p50_ms)
        fill = _opt_f64(fill_ratio)
        size = _opt_u64(batch_size)
        now = _f64(now_s)
        if observed is not None and not math.isfinite(observed):
            observed = None
        if fill is not None and not math.isfinite(fill):
            fill = None
        self._last_observed = observed
        self._last_fill = fill
        c = self._c
        # 1. The starvation streak counts every call (Rust semantics, §4.4 [DIV]).
        if size is not None:
            if size > c.starvation_batch_size:
                self._streak = 0
            elif self._streak < U64_MAX:
                self._streak += 1
        # 2. Gate on update_interval.
        if self._steps < U64_MAX:
            self._steps += 1
        if self._steps < c.update_interval:
            return self._wait, self._cost
        self._steps = 0
        # 3. Calibrate first; knobs are held until then.
        if not self._calibrated:
            p = self._inference.p50()
            if p is not None:
                self._target = _clamp(p * c.calibration_multiplier, c.min_target_p50_ms, c.max_target_p50_ms)
                self._calibrated = True
                self._integral = 0.0
                self._last_step_time = None
            return self._wait, self._cost
        # 4.
        target = self._target
        if observed is None or target is None:
            return self._wait, self._cost
        # 5. Starvation recovery: both knobs at their floors and a long run of tiny batches.
        if (
            c.starvation_recovery_enabled
            and self._streak >= c.starvation_window
            and self._wait <= c.min_wait_ms
            and self._cost <= c.min_batch_cost
        ):
            self._wait = _clamp((c.min_wait_ms + c.initial_wait_ms) / 2.0, c.min_wait_ms, c.max_wait_ms)
            self._cost = _clamp_int(
                max(c.initial_batch_cost // 2, min(c.min_batch_cost * 4, U64_MAX)),
                c.min_batch_cost,
                c.max_batch_cost,
            )
            self._integral = 0.0
            self._last_step_time = None
            self._streak = 0
            if self._resets < U64_MAX:
                self._resets += 1
            return self._wait, self._cost
        # 6.
        headroom = target - observed
        headroom_frac = headroom / target
        # 7. dt from the previous PI step, capped; a clock that runs backwards counts as 0.
        last = self._last_step_time
        if last is None:
            dt = 0.0
        else:
            d = now - last
            dt = (d if d < DT_CAP_S else DT_CAP_S) if d > 0.0 else 0.0
        self._last_step_time = now
        # 8. Idle decay.
        if dt > IDLE_DECAY_AFTER_S:
            self._integral *= IDLE_DECAY_BASE ** (dt - IDLE_DECAY_AFTER_S)
        # 9. Conditional integration (anti-windup).
        wait = self._wait
        saturated = (wait >= c.max_wait_ms and headroom > 0.0) or (wait <= c.min_wait_ms and headroom < 0.0)
        if not saturated and c.integral_gain > 0.0:
            self._integral = _clamp(self._integral + headroom * dt, -c.integral_max, c.integral_max)
        # 10.
        self._wait = _clamp(wait + headroom * c.gain + self._integral * c.integral_gain, c.min_wait_ms, c.max_wait_ms)
        # 11. The cost knob moves only while batches come out saturated.
        if fill is not None and fill >= c.fill_ratio_threshold:
            cost = self._cost
            pinned = (cost >= c.max_batch_cost and headroom > 0.0) or (cost <= c.min_batch_cost and headroom < 0.0)
            if not pinned:
                f = float(cost)
                self._cost = _as_u64(
                    _clamp(f + f * headroom_frac * c.cost_gain, float(c.min_batch_cost), float(c.max_batch_cost))
                )
        return self._wait, self._cost

    def snapshot(self) -> dict[str, Any]:
        target, observed = self._target, self._last_observed
        return {
            "enabled": True,
            "calibrated": self._calibrated,
            "target_p50_ms": target,
            "current_wait_ms": self._wait,
            "current_batch_cost": self._cost,
            "observed_p50_ms": observed,
            "headroom_ms": target - observed if target is not None and observed is not None else None,
            "fill_ratio": self._last_fill,
            "integral": self._integral,
            "starvation_streak": self._streak,
            "starvation_resets": self._resets,
        }

    @property
    def config(self) -> dict[str, Any]:
        return asdict(self._c)

    @property
    def current_wait_ms(self) -> float:
        return self._wait

    @property
    def current_batch_cost(self) -> int:
        return self._cost

    @property
    def calibrated(self) -> bool:
        return self._calibrated

    @property
    def target_p50_ms(self) -> float | None:
        return self._target

    @property
    def starvation_resets(self) -> int:
        return self._resets

    def __repr__(self) -> str:
        return f"AdaptiveController(wait_ms={self._wait!r}, batch_cost={self._cost}, target_p50_ms={self._target!r})"


# ------------------------------------------------------------------------------------ replay §4.7


class _IntLexeme(str):
    """An integer JSON number kept as its lexeme, so conversions match Rust's from its text."""

    __slots__ = ()


def _no_constants(name: str) -> Any:
    raise ValueError(f"invalid JSON: {name} is not a number")


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_int=_IntLexeme, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("invalid JSON: nesting too deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (_IntLexeme, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _json_f64(value: object, name: str) -> float:
    if isinstance(value, _IntLexeme):
        return float(value)  # the lexeme, correctly rounded like Rust's f64::from_str
    if isinstance(value, float):
        return value
    raise ValueError(f'"{name}" must be a number, got {_kind(value)}')


def _json_opt_f64(value: object, name: str) -> float | None:
    return None if value is None else _json_f64(value, name)


def _json_u64(value: object, name: str) -> int:
    if isinstance(value, _IntLexeme):
        digits = value.removeprefix("-")
        if value.startswith("-") and digits.strip("0"):
            raise ValueError(f'"{name}" must be >= 0, got {value}')
        if len(digits) > 20 or int(digits) > U64_MAX:
            raise ValueError(f'"{name}" is out of range: {value}')
        return int(digits)
    if isinstance(value, float):
        raise ValueError(f'"{name}" must be an integer, got {value!r}')
    raise ValueError(f'"{name}" must be an integer, got {_kind(value)}')


def _json_opt_u64(value: object, name: str) -> int | None:
    return None if value is None else _json_u64(value, name)


def _json_bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f'"{name}" must be a boolean, got {_kind(value)}')


_FLOAT_FIELDS: Final = frozenset(
    {
        "calibration_multiplier",
        "min_target_p50_ms",
        "max_target_p50_ms",
        "min_wait_ms",
        "max_wait_ms",
        "initial_wait_ms",
        "gain",
        "integral_gain",
        "cost_gain",
        "fill_ratio_threshold",
        "integral_max",
    }
)
_INT_FIELDS: Final = frozenset(
    {
        "min_batch_cost",
        "max_batch_cost",
        "initial_batch_cost",
        "update_interval",
        "starvation_window",
        "starvation_batch_size",
    }
)


def _config_from_json(text: str) -> _Config:
    """The replay's `--config`: builder fields over the *module* defaults; unknown fields are errors."""
    fields = _loads(text)
    if not isinstance(fields, dict):
        raise ValueError("the configuration must be a JSON object")
    config = _Config()
    for key, value in fields.items():
        if key == "target_p50_ms":
            config.target_p50_ms = _json_opt_f64(value, key)
        elif key in _FLOAT_FIELDS:
            setattr(config, key, _json_f64(value, key))
        elif key in _INT_FIELDS:
            setattr(config, key, _json_u64(value, key))
        elif key == "starvation_recovery_enabled":
            config.starvation_recovery_enabled = _json_bool(value, key)
        else:
            raise ValueError(f'unknown configuration field "{key}"')
    config.validate()
    return config


def _replay_line(ctl: AdaptiveController, line: str) -> tuple[float, int, int] | None:
    event = _loads(line)
    if not isinstance(event, dict):
        raise ValueError("an event must be a JSON object")
    if "event" not in event:
        raise ValueError('missing "event"')
    kind = event["event"]
    if not isinstance(kind, str) or isinstance(kind, _IntLexeme):
        raise ValueError('"event" must be a string')
    if kind == "step":
        if "dt_s" not in event:
            raise ValueError('missing "dt_s"')
        dt_s = _json_f64(event["dt_s"], "dt_s")
        observed = _json_opt_f64(event.get("observed_p50_ms"), "observed_p50_ms")
        fill = _json_opt_f64(event.get("fill_ratio"), "fill_ratio")
        size = _json_opt_u64(event.get("batch_size"), "batch_size")
        wait, cost = ctl._step_after(dt_s, observed, fill, size)
        return wait, cost, ctl.starvation_resets
    if kind == "record_inference":
        if "inference_ms" not in event:
            raise ValueError('missing "inference_ms"')
        ctl.record_inference(_json_f64(event["inference_ms"], "inference_ms"))
        return None
    raise ValueError(f'unknown event kind "{kind}"')


def _rust_lines(text: str) -> list[str]:
    """Rust's `str::lines`: split on `\\n`, drop one `\\r` before it, no empty last line."""
    parts = text.split("\n")
    last = parts.pop()
    lines = [p[:-1] if p.endswith("\r") else p for p in parts]
    if last:
        lines.append(last)
    return lines


def replay_controller(trace: str, config: str | None = None) -> list[dict[str, Any]]:
    """Replay a JSONL controller trace (§4.7) on a fresh controller: one
    `{"wait_ms", "batch_cost", "starvation_resets"}` per step event; `ValueError` on bad input."""
    if not isinstance(trace, str) or (config is not None and not isinstance(config, str)):
        raise TypeError("trace and config must be str")
    try:
        cfg = _Config() if config is None else _config_from_json(config)
        ctl = AdaptiveController.__new__(AdaptiveController)
        ctl._init(cfg)
    except ValueError as exc:
        raise ValueError(f"config: {exc}") from None
    out: list[dict[str, Any]] = []
    for number, line in enumerate(_rust_lines(trace), start=1):
        body = line.lstrip(" \t\n\r")
        if not body or body.startswith("#"):
            continue
        try:
            step = _replay_line(ctl, line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if step is not None:
            out.append({"wait_ms": step[0], "batch_cost": step[1], "starvation_resets": step[2]})
    return out


__all__ = [
    "DT_CAP_S",
    "EFFICIENCY_WINDOW",
    "ENV_VARS",
    "IDLE_DECAY_AFTER_S",
    "IDLE_DECAY_BASE",
    "INFERENCE_MIN_SAMPLES",
    "INFERENCE_WINDOW",
    "LATENCY_MIN_SAMPLES",
    "LATENCY_WINDOW",
    "PRODUCTION_INITIAL_WAIT_MS",
    "PRODUCTION_MIN_WAIT_MS",
    "AdaptiveController",
    "PercentileWindow",
    "production_cost_range",
    "replay_controller",
]
