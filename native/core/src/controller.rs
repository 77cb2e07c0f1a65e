//! The adaptive batch controller of the scheduler (scheduler-and-prep §4.1-4.7).
//!
//! A PI law on the headroom `target_p50 − observed_p50` moves two knobs: the batch wait
//! (every PI step) and the batch cost cap (only while batches come out saturated). The target is
//! either explicit or calibrated once from the backend's own inference time. Everything is
//! IEEE-754 f64 evaluated in the spec's order, with no fused operations, so the pure-Python twin
//! reproduces every output bit for bit; the cost is stored as `u64` and truncated like `as u64`.
//!
//! Deliberate guards beyond the spec, none of which changes a trace with sane inputs:
//! a NaN or infinite `observed_p50` / `fill_ratio` counts as absent, NaN samples are dropped
//! from windows, a negative or NaN `dt` (a clock running backwards) counts as 0, and
//! configurations that could make the arithmetic leave its bounds are rejected up front.

use std::collections::VecDeque;
use std::fmt;

/// `dt` between PI steps is capped at this many seconds.
pub const DT_CAP_S: f64 = 5.0;
/// Gaps longer than this (seconds) decay the integral by `IDLE_DECAY_BASE ^ (dt − 2)`.
pub const IDLE_DECAY_AFTER_S: f64 = 2.0;
pub const IDLE_DECAY_BASE: f64 = 0.5;
/// Inference window inside the controller: 50 samples, p50 after 10.
pub const INFERENCE_WINDOW: usize = 50;
pub const INFERENCE_MIN_SAMPLES: usize = 10;
/// Per-scheduler latency window (200 samples, p50 after 10).
pub const LATENCY_WINDOW: usize = 200;
pub const LATENCY_MIN_SAMPLES: usize = 10;
/// Per-scheduler efficiency window (mean of the last 50 fill ratios).
pub const EFFICIENCY_WINDOW: usize = 50;
/// Production floor of the wait knob [R].
pub const PRODUCTION_MIN_WAIT_MS: f64 = 15.0;
/// Production initial wait: `BatchConfig.max_batch_wait_ms`.
pub const PRODUCTION_INITIAL_WAIT_MS: f64 = 15.0;

/// Env overrides of the production configuration (§4.2).
pub const ENV_TARGET_P50_MS: &str = "SIE_ADAPTIVE_BATCH_TARGET_P50_MS";
pub const ENV_CALIBRATION_MULT: &str = "SIE_ADAPTIVE_BATCH_CALIBRATION_MULT";
pub const ENV_MIN_TARGET_P50_MS: &str = "SIE_ADAPTIVE_BATCH_MIN_TARGET_P50_MS";
pub const ENV_MAX_TARGET_P50_MS: &str = "SIE_ADAPTIVE_BATCH_MAX_TARGET_P50_MS";
pub const ENV_MIN_WAIT_MS: &str = "SIE_ADAPTIVE_BATCH_MIN_WAIT_MS";
pub const ENV_MAX_WAIT_MS: &str = "SIE_ADAPTIVE_BATCH_MAX_WAIT_MS";
pub const ENV_INITIAL_WAIT_MS: &str = "SIE_ADAPTIVE_BATCH_INITIAL_WAIT_MS";
pub const ENV_MIN_COST: &str = "SIE_ADAPTIVE_BATCH_MIN_COST";
pub const ENV_MAX_COST: &str = "SIE_ADAPTIVE_BATCH_MAX_COST";
pub const ENV_INITIAL_COST: &str = "SIE_ADAPTIVE_BATCH_INITIAL_COST";
/// Every override `apply_env` reads, in the order it reads them.
pub const ENV_VARS: [&str; 10] = [
    ENV_TARGET_P50_MS,
    ENV_CALIBRATION_MULT,
    ENV_MIN_TARGET_P50_MS,
    ENV_MAX_TARGET_P50_MS,
    ENV_MIN_WAIT_MS,
    ENV_MAX_WAIT_MS,
    ENV_INITIAL_WAIT_MS,
    ENV_MIN_COST,
    ENV_MAX_COST,
    ENV_INITIAL_COST,
];

/// Rust's `f64::clamp` without its panic on `min > max` (validated configs never have that).
#[inline]
fn clamp_f64(x: f64, min: f64, max: f64) -> f64 {
    let mut x = x;
    if x < min {
        x = min;
    }
    if x > max {
        x = max;
    }
    x
}

/// A fixed-size ring of the latest samples: percentiles by sort-and-index, or the mean.
///
/// Used for the latency (200/10), inference (50/10) and efficiency (50, mean) trackers.
#[derive(Debug, Clone, PartialEq)]
pub struct PercentileWindow {
    samples: VecDeque<f64>,
    capacity: usize,
    min_samples: usize,
}

impl PercentileWindow {
    /// A window of `capacity` (≥ 1) samples that reports after `min_samples`.
    pub fn new(capacity: usize, min_samples: usize) -> Result<Self, String> {
        if capacity == 0 {
            return Err("capacity must be at least 1".into());
        }
        Ok(Self {
            samples: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
            min_samples,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn min_samples(&self) -> usize {
        self.min_samples
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// Oldest first.
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().copied()
    }

    /// Add a sample, evicting the oldest when full; NaN is dropped (it has no rank).
    pub fn push(&mut self, value: f64) -> bool {
        if value.is_nan() {
            return false;
        }
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
        true
    }

    /// `sorted[floor(p/100 × (n − 1))]`, or `None` below `min_samples` (or when empty).
    ///
    /// The sort is stable with `-0.0 == 0.0`, like Python's `sorted`, so ties resolve alike.
    pub fn percentile(&self, p: f64) -> Result<Option<f64>, String> {
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("percentile must be within [0, 100], got {p}"));
        }
        let n = self.samples.len();
        if n < self.min_samples || n == 0 {
            return Ok(None);
        }
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let index = ((p / 100.0) * (n - 1) as f64).floor() as usize;
        Ok(Some(sorted[index.min(n - 1)]))
    }

    pub fn p50(&self) -> Option<f64> {
        self.percentile(50.0).unwrap_or(None)
    }

    /// Arithmetic mean (left-to-right sum), or `None` below `min_samples` (or when empty).
    pub fn mean(&self) -> Option<f64> {
        let n = self.samples.len();
        if n < self.min_samples || n == 0 {
            return None;
        }
        let mut total = 0.0;
        for v in &self.samples {
            total += *v;
        }
        Some(total / n as f64)
    }
}

/// Every knob of the controller; `Default` is the module default column of §4.2.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// `None`: calibrate from the inference window.
    pub target_p50_ms: Option<f64>,
    pub calibration_multiplier: f64,
    pub min_target_p50_ms: f64,
    pub max_target_p50_ms: f64,
    pub min_wait_ms: f64,
    pub max_wait_ms: f64,
    pub initial_wait_ms: f64,
    pub min_batch_cost: u64,
    pub max_batch_cost: u64,
    pub initial_batch_cost: u64,
    /// Kp of the wait knob.
    pub gain: f64,
    /// Ki of the wait knob.
    pub integral_gain: f64,
    pub cost_gain: f64,
    pub update_interval: u64,
    pub fill_ratio_threshold: f64,
    pub integral_max: f64,
    pub starvation_recovery_enabled: bool,
    pub starvation_window: u64,
    pub starvation_batch_size: u64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            target_p50_ms: None,
            calibration_multiplier: 1.5,
            min_target_p50_ms: 5.0,
            max_target_p50_ms: 500.0,
            min_wait_ms: 1.0,
            max_wait_ms: 50.0,
            initial_wait_ms: 10.0,
            min_batch_cost: 256,
            max_batch_cost: 65536,
            initial_batch_cost: 16384,
            gain: 0.3,
            integral_gain: 0.05,
            cost_gain: 0.15,
            update_interval: 10,
            fill_ratio_threshold: 0.7,
            integral_max: 20.0,
            starvation_recovery_enabled: true,
            starvation_window: 20,
            starvation_batch_size: 1,
        }
    }
}

/// The production cost range from the model budget `B` (§4.2): `(floor, ceil, initial)`.
pub fn production_cost_range(budget: u64) -> (u64, u64, u64) {
    let floor = (budget / 4).max(256).min(budget.max(1));
    let ceil = floor.max(budget.saturating_mul(4));
    (floor, ceil, budget.clamp(floor, ceil))
}

/// Rust's `f64::from_str` on an env value (ASCII whitespace trimmed); `None` unless finite.
fn env_f64(raw: &str) -> Option<f64> {
    raw.trim_matches(|c: char| c.is_ascii_whitespace())
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

/// Digits only (ASCII whitespace trimmed), within u64.
fn env_u64(raw: &str) -> Option<u64> {
    let s = raw.trim_matches(|c: char| c.is_ascii_whitespace());
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok()
}

impl ControllerConfig {
    /// The production configuration [R] `from_batch_config`: wait floor 15 ms, the cost range
    /// derived from the model budget `B`, and `cost_gain = gain × 0.5`.
    pub fn production(budget: u64, initial_wait_ms: f64) -> Self {
        let (floor, ceil, initial) = production_cost_range(budget);
        let base = Self::default();
        Self {
            min_wait_ms: PRODUCTION_MIN_WAIT_MS,
            initial_wait_ms,
            min_batch_cost: floor,
            max_batch_cost: ceil,
            initial_batch_cost: initial,
            cost_gain: base.gain * 0.5,
            ..base
        }
    }

    /// Apply the `SIE_ADAPTIVE_BATCH_*` overrides read through `get`, then reconcile the ranges
    /// (`min := max` where `min > max`). Values that are not numbers, not finite or out of their
    /// field's domain are ignored; the returned strings are the warnings to log.
    pub fn apply_env<F: Fn(&str) -> Option<String>>(&mut self, get: F) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut float = |name: &str, ok: fn(f64) -> bool, slot: &mut f64| {
            if let Some(raw) = get(name) {
                match env_f64(&raw).filter(|v| ok(*v)) {
                    Some(v) => *slot = v,
                    None => warnings.push(format!("ignoring {name}={raw:?}: not a valid number")),
                }
            }
        };
        let mut target = f64::NAN;
        float(ENV_TARGET_P50_MS, |v| v > 0.0, &mut target);
        if !target.is_nan() {
            self.target_p50_ms = Some(target);
        }
        float(
            ENV_CALIBRATION_MULT,
            |v| v > 0.0,
            &mut self.calibration_multiplier,
        );
        float(
            ENV_MIN_TARGET_P50_MS,
            |v| v > 0.0,
            &mut self.min_target_p50_ms,
        );
        float(
            ENV_MAX_TARGET_P50_MS,
            |v| v > 0.0,
            &mut self.max_target_p50_ms,
        );
        float(ENV_MIN_WAIT_MS, |v| v >= 0.0, &mut self.min_wait_ms);
        float(ENV_MAX_WAIT_MS, |v| v >= 0.0, &mut self.max_wait_ms);
        float(ENV_INITIAL_WAIT_MS, |_| true, &mut self.initial_wait_ms);
        for (name, slot) in [
            (ENV_MIN_COST, &mut self.min_batch_cost),
            (ENV_MAX_COST, &mut self.max_batch_cost),
            (ENV_INITIAL_COST, &mut self.initial_batch_cost),
        ] {
            if let Some(raw) = get(name) {
                match env_u64(&raw) {
                    Some(v) => *slot = v,
                    None => {
                        warnings.push(format!("ignoring {name}={raw:?}: not an unsigned integer"))
                    }
                }
            }
        }
        self.reconcile();
        warnings
    }

    /// `min := max` wherever an override left a range inverted.
    fn reconcile(&mut self) {
        if self.min_wait_ms > self.max_wait_ms {
            self.min_wait_ms = self.max_wait_ms;
        }
        if self.min_batch_cost > self.max_batch_cost {
            self.min_batch_cost = self.max_batch_cost;
        }
        if self.min_target_p50_ms > self.max_target_p50_ms {
            self.min_target_p50_ms = self.max_target_p50_ms;
        }
    }

    /// Reject configurations whose arithmetic could leave its bounds (or panic).
    pub fn validate(&self) -> Result<(), String> {
        fn finite(name: &str, v: f64) -> Result<(), String> {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be finite, got {v}"))
            }
        }
        if let Some(t) = self.target_p50_ms {
            if !(t.is_finite() && t > 0.0) {
                return Err(format!("target_p50_ms must be finite and > 0, got {t}"));
            }
        }
        for (name, v) in [
            ("calibration_multiplier", self.calibration_multiplier),
            ("min_target_p50_ms", self.min_target_p50_ms),
            ("max_target_p50_ms", self.max_target_p50_ms),
            ("min_wait_ms", self.min_wait_ms),
            ("max_wait_ms", self.max_wait_ms),
            ("initial_wait_ms", self.initial_wait_ms),
            ("gain", self.gain),
            ("integral_gain", self.integral_gain),
            ("cost_gain", self.cost_gain),
            ("fill_ratio_threshold", self.fill_ratio_threshold),
            ("integral_max", self.integral_max),
        ] {
            finite(name, v)?;
        }
        if self.calibration_multiplier <= 0.0 {
            return Err("calibration_multiplier must be > 0".into());
        }
        if !(self.min_target_p50_ms > 0.0 && self.min_target_p50_ms <= self.max_target_p50_ms) {
            return Err("need 0 < min_target_p50_ms <= max_target_p50_ms".into());
        }
        if !(self.min_wait_ms >= 0.0 && self.min_wait_ms <= self.max_wait_ms) {
            return Err("need 0 <= min_wait_ms <= max_wait_ms".into());
        }
        if self.min_batch_cost > self.max_batch_cost {
            return Err("need min_batch_cost <= max_batch_cost".into());
        }
        for (name, v) in [
            ("gain", self.gain),
            ("integral_gain", self.integral_gain),
            ("cost_gain", self.cost_gain),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be within [0, 1], got {v}"));
            }
        }
        if self.integral_max < 0.0 {
            return Err("integral_max must be >= 0".into());
        }
        if self.update_interval == 0 {
            return Err("update_interval must be >= 1".into());
        }
        if self.starvation_window == 0 {
            return Err("starvation_window must be >= 1".into());
        }
        Ok(())
    }
}

/// What `snapshot()` reports (§4.5).
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerSnapshot {
    pub enabled: bool,
    pub calibrated: bool,
    pub target_p50_ms: Option<f64>,
    pub current_wait_ms: f64,
    pub current_batch_cost: u64,
    pub observed_p50_ms: Option<f64>,
    pub headroom_ms: Option<f64>,
    pub fill_ratio: Option<f64>,
    pub integral: f64,
    pub starvation_streak: u64,
    pub starvation_resets: u64,
}

/// The controller state (one per scheduler).
#[derive(Debug, Clone)]
pub struct AdaptiveController {
    config: ControllerConfig,
    target: Option<f64>,
    calibrated: bool,
    wait_ms: f64,
    cost: u64,
    integral: f64,
    last_step_time: Option<f64>,
    steps_since_update: u64,
    streak: u64,
    resets: u64,
    inference: PercentileWindow,
    last_observed: Option<f64>,
    last_fill: Option<f64>,
    clock_s: f64,
}

fn finite_or_none(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

impl AdaptiveController {
    pub fn new(config: ControllerConfig) -> Result<Self, String> {
        config.validate()?;
        let inference = PercentileWindow::new(INFERENCE_WINDOW, INFERENCE_MIN_SAMPLES)?;
        let mut c = Self {
            target: config.target_p50_ms,
            calibrated: config.target_p50_ms.is_some(),
            wait_ms: 0.0,
            cost: 0,
            integral: 0.0,
            last_step_time: None,
            steps_since_update: 0,
            streak: 0,
            resets: 0,
            inference,
            last_observed: None,
            last_fill: None,
            clock_s: 0.0,
            config,
        };
        c.reset();
        Ok(c)
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    pub fn current_wait_ms(&self) -> f64 {
        self.wait_ms
    }

    pub fn current_batch_cost(&self) -> u64 {
        self.cost
    }

    pub fn calibrated(&self) -> bool {
        self.calibrated
    }

    pub fn target_p50_ms(&self) -> Option<f64> {
        self.target
    }

    pub fn starvation_resets(&self) -> u64 {
        self.resets
    }

    pub fn starvation_streak(&self) -> u64 {
        self.streak
    }

    pub fn integral(&self) -> f64 {
        self.integral
    }

    /// One backend batch's inference time; only kept while the target is uncalibrated.
    pub fn record_inference(&mut self, ms: f64) {
        if !self.calibrated {
            self.inference.push(ms);
        }
    }

    /// Knobs back to their clamped initial values, counters cleared; an auto-calibrated target
    /// is forgotten (an explicit one kept); `starvation_resets` is monotonic.
    pub fn reset(&mut self) {
        let c = &self.config;
        self.wait_ms = clamp_f64(c.initial_wait_ms, c.min_wait_ms, c.max_wait_ms);
        self.cost = c
            .initial_batch_cost
            .clamp(c.min_batch_cost, c.max_batch_cost);
        self.integral = 0.0;
        self.last_step_time = None;
        self.steps_since_update = 0;
        self.streak = 0;
        self.last_observed = None;
        self.last_fill = None;
        self.clock_s = 0.0;
        if c.target_p50_ms.is_none() {
            self.target = None;
            self.calibrated = false;
            self.inference.clear();
        }
    }

    /// Replay's virtual clock: advance by `dt_s`, then step at the new time.
    pub fn step_after(
        &mut self,
        dt_s: f64,
        observed_p50: Option<f64>,
        fill_ratio: Option<f64>,
        batch_size: Option<u64>,
    ) -> (f64, u64) {
        self.clock_s += dt_s;
        self.step(observed_p50, fill_ratio, batch_size, self.clock_s)
    }

    /// One completion (§4.3); returns the knobs now in force `(wait_ms, cost)`.
    pub fn step(
        &mut self,
        observed_p50: Option<f64>,
        fill_ratio: Option<f64>,
        batch_size: Option<u64>,
        now_s: f64,
    ) -> (f64, u64) {
        let observed_p50 = finite_or_none(observed_p50);
        let fill_ratio = finite_or_none(fill_ratio);
        self.last_observed = observed_p50;
        self.last_fill = fill_ratio;
        // 1. The starvation streak counts every call (Rust semantics, §4.4 [DIV]).
        match batch_size {
            None => {}
            Some(n) if n > self.config.starvation_batch_size => self.streak = 0,
            Some(_) => self.streak = self.streak.saturating_add(1),
        }
        // 2. Gate on update_interval.
        self.steps_since_update = self.steps_since_update.saturating_add(1);
        if self.steps_since_update < self.config.update_interval {
            return (self.wait_ms, self.cost);
        }
        self.steps_since_update = 0;
        let c = &self.config;
        // 3. Calibrate first; knobs are held until then.
        if !self.calibrated {
            if let Some(p) = self.inference.p50() {
                self.target = Some(clamp_f64(
                    p * c.calibration_multiplier,
                    c.min_target_p50_ms,
                    c.max_target_p50_ms,
                ));
                self.calibrated = true;
                self.integral = 0.0;
                self.last_step_time = None;
            }
            return (self.wait_ms, self.cost);
        }
        // 4.
        let (Some(observed), Some(target)) = (observed_p50, self.target) else {
            return (self.wait_ms, self.cost);
        };
        // 5. Starvation recovery: both knobs at their floors and a long run of tiny batches.
        if c.starvation_recovery_enabled
            && self.streak >= c.starvation_window
            && self.wait_ms <= c.min_wait_ms
            && self.cost <= c.min_batch_cost
        {
            self.wait_ms = clamp_f64(
                (c.min_wait_ms + c.initial_wait_ms) / 2.0,
                c.min_wait_ms,
                c.max_wait_ms,
            );
            self.cost = (c.initial_batch_cost / 2)
                .max(c.min_batch_cost.saturating_mul(4))
                .clamp(c.min_batch_cost, c.max_batch_cost);
            self.integral = 0.0;
            self.last_step_time = None;
            self.streak = 0;
            self.resets = self.resets.saturating_add(1);
            return (self.wait_ms, self.cost);
        }
        // 6.
        let headroom = target - observed;
        let headroom_frac = headroom / target;
        // 7. dt from the previous PI step, capped; a clock that runs backwards counts as 0.
        let dt = match self.last_step_time {
            None => 0.0,
            Some(last) => {
                let d = now_s - last;
                if d > 0.0 {
                    d.min(DT_CAP_S)
                } else {
                    0.0
                }
            }
        };
        self.last_step_time = Some(now_s);
        // 8. Idle decay.
        if dt > IDLE_DECAY_AFTER_S {
            self.integral *= IDLE_DECAY_BASE.powf(dt - IDLE_DECAY_AFTER_S);
        }
        // 9. Conditional integration (anti-windup).
        let saturated = (self.wait_ms >= c.max_wait_ms && headroom > 0.0)
            || (self.wait_ms <= c.min_wait_ms && headroom < 0.0);
        if !saturated && c.integral_gain > 0.0 {
            self.integral = clamp_f64(
                self.integral + headroom * dt,
                -c.integral_max,
                c.integral_max,
            );
        }
        // 10.
        self.wait_ms = clamp_f64(
            self.wait_ms + headroom * c.gain + self.integral * c.integral_gain,
            c.min_wait_ms,
            c.max_wait_ms,
        );
        // 11. The cost knob moves only while batches come out saturated.
        if let Some(fill) = fill_ratio {
            if fill >= c.fill_ratio_threshold {
                let pinned = (self.cost >= c.max_batch_cost && headroom > 0.0)
                    || (self.cost <= c.min_batch_cost && headroom < 0.0);
                if !pinned {
                    let cost = self.cost as f64;
                    self.cost = clamp_f64(
                        cost + cost * headroom_frac * c.cost_gain,
                        c.min_batch_cost as f64,
                        c.max_batch_cost as f64,
                    ) as u64;
                }
            }
        }
        (self.wait_ms, self.cost)
    }

    pub fn snapshot(&self) -> ControllerSnapshot {
        let headroom_ms = match (self.target, self.last_observed) {
            (Some(t), Some(o)) => Some(t - o),
            _ => None,
        };
        ControllerSnapshot {
            enabled: true,
            calibrated: self.calibrated,
            target_p50_ms: self.target,
            current_wait_ms: self.wait_ms,
            current_batch_cost: self.cost,
            observed_p50_ms: self.last_observed,
            headroom_ms,
            fill_ratio: self.last_fill,
            integral: self.integral,
            starvation_streak: self.streak,
            starvation_resets: self.resets,
        }
    }
}

// ---------------------------------------------------------------------------------- replay §4.7

/// One output line of the replay: `(wait_ms, batch_cost, starvation_resets)`.
pub type ReplayStep = (f64, u64, u64);

/// A replay error, with the 1-based input line where known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayError {
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "line {n}: {}", self.message),
            None => write!(f, "config: {}", self.message),
        }
    }
}

/// JSON whitespace, the only characters a blank line may hold.
fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// A controller configuration from the replay's `--config` JSON: an object of builder fields,
/// unspecified ones at their *module* defaults; unknown fields are an error (typos must not
/// silently replay the defaults).
pub fn config_from_json(text: &str) -> Result<ControllerConfig, String> {
    let value = json::parse(text)?;
    let json::Value::Object(fields) = value else {
        return Err("the configuration must be a JSON object".into());
    };
    let mut c = ControllerConfig::default();
    for (i, (key, v)) in fields.iter().enumerate() {
        if fields[i + 1..].iter().any(|(k, _)| k == key) {
            continue; // a later duplicate wins, as in `json.loads`
        }
        match key.as_str() {
            "target_p50_ms" => c.target_p50_ms = v.opt_f64(key)?,
            "calibration_multiplier" => c.calibration_multiplier = v.f64(key)?,
            "min_target_p50_ms" => c.min_target_p50_ms = v.f64(key)?,
            "max_target_p50_ms" => c.max_target_p50_ms = v.f64(key)?,
            "min_wait_ms" => c.min_wait_ms = v.f64(key)?,
            "max_wait_ms" => c.max_wait_ms = v.f64(key)?,
            "initial_wait_ms" => c.initial_wait_ms = v.f64(key)?,
            "min_batch_cost" => c.min_batch_cost = v.u64(key)?,
            "max_batch_cost" => c.max_batch_cost = v.u64(key)?,
            "initial_batch_cost" => c.initial_batch_cost = v.u64(key)?,
            "gain" => c.gain = v.f64(key)?,
            "integral_gain" => c.integral_gain = v.f64(key)?,
            "cost_gain" => c.cost_gain = v.f64(key)?,
            "update_interval" => c.update_interval = v.u64(key)?,
            "fill_ratio_threshold" => c.fill_ratio_threshold = v.f64(key)?,
            "integral_max" => c.integral_max = v.f64(key)?,
            "starvation_recovery_enabled" => c.starvation_recovery_enabled = v.bool(key)?,
            "starvation_window" => c.starvation_window = v.u64(key)?,
            "starvation_batch_size" => c.starvation_batch_size = v.u64(key)?,
            other => return Err(format!("unknown configuration field {other:?}")),
        }
    }
    c.validate()?;
    Ok(c)
}

/// Apply one event line to the controller; `Some(step)` for a step event.
fn replay_line(ctl: &mut AdaptiveController, line: &str) -> Result<Option<ReplayStep>, String> {
    let json::Value::Object(fields) = json::parse(line)? else {
        return Err("an event must be a JSON object".into());
    };
    let get = |name: &str| fields.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
    let kind = match get("event") {
        Some(json::Value::String(s)) => s.as_str(),
        Some(_) => return Err("\"event\" must be a string".into()),
        None => return Err("missing \"event\"".into()),
    };
    match kind {
        "step" => {
            let dt_s = match get("dt_s") {
                Some(v) => v.f64("dt_s")?,
                None => return Err("missing \"dt_s\"".into()),
            };
            let observed = get("observed_p50_ms")
                .map(|v| v.opt_f64("observed_p50_ms"))
                .transpose()?
                .flatten();
            let fill = get("fill_ratio")
                .map(|v| v.opt_f64("fill_ratio"))
                .transpose()?
                .flatten();
            let size = get("batch_size")
                .map(|v| v.opt_u64("batch_size"))
                .transpose()?
                .flatten();
            let (wait, cost) = ctl.step_after(dt_s, observed, fill, size);
            Ok(Some((wait, cost, ctl.starvation_resets())))
        }
        "record_inference" => {
            let ms = match get("inference_ms") {
                Some(v) => v.f64("inference_ms")?,
                None => return Err("missing \"inference_ms\"".into()),
            };
            ctl.record_inference(ms);
            Ok(None)
        }
        other => Err(format!("unknown event kind {other:?}")),
    }
}

/// Replay a JSONL trace (§4.7) from a fresh controller; one output per `step` event.
///
/// Blank lines (JSON whitespace only) and lines whose first non-blank character is `#` are
/// skipped; unknown event kinds and malformed lines are hard errors, with the 1-based line.
pub fn replay<'a, I>(config_json: Option<&str>, lines: I) -> Result<Vec<ReplayStep>, ReplayError>
where
    I: IntoIterator<Item = &'a str>,
{
    let config = match config_json {
        Some(text) => config_from_json(text).map_err(|message| ReplayError {
            line: None,
            message,
        })?,
        None => ControllerConfig::default(),
    };
    let mut ctl = AdaptiveController::new(config).map_err(|message| ReplayError {
        line: None,
        message,
    })?;
    let mut out = Vec::new();
    for (i, line) in lines.into_iter().enumerate() {
        let body = line.trim_start_matches(is_json_ws);
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        match replay_line(&mut ctl, line) {
            Ok(Some(step)) => out.push(step),
            Ok(None) => {}
            Err(message) => {
                return Err(ReplayError {
                    line: Some(i + 1),
                    message,
                })
            }
        }
    }
    Ok(out)
}

/// The JSON subset reader of the replay: RFC 8259, numbers kept as their lexeme so that
/// conversion is Rust's correctly rounded `f64::from_str` (like Python's `float()`), duplicate
/// keys resolved last-wins (like `json.loads`), nesting capped.
mod json {
    pub const MAX_DEPTH: usize = 512;

    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        /// The lexeme, and whether it is an integer (no fraction, no exponent).
        Number(String, bool),
        String(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    impl Value {
        fn kind(&self) -> &'static str {
            match self {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(..) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            }
        }

        pub fn f64(&self, name: &str) -> Result<f64, String> {
            match self {
                Value::Number(lexeme, _) => lexeme
                    .parse::<f64>()
                    .map_err(|_| format!("{name:?}: bad number {lexeme}")),
                other => Err(format!("{name:?} must be a number, got {}", other.kind())),
            }
        }

        pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, String> {
            match self {
                Value::Null => Ok(None),
                v => v.f64(name).map(Some),
            }
        }

        pub fn u64(&self, name: &str) -> Result<u64, String> {
            match self {
                Value::Number(lexeme, true) => {
                    let digits = lexeme.strip_prefix('-').unwrap_or(lexeme);
                    if lexeme.starts_with('-') && digits.bytes().any(|b| b != b'0') {
                        return Err(format!("{name:?} must be >= 0, got {lexeme}"));
                    }
                    digits
                        .parse::<u64>()
                        .map_err(|_| format!("{name:?} is out of range: {lexeme}"))
                }
                Value::Number(lexeme, false) => {
                    Err(format!("{name:?} must be an integer, got {lexeme}"))
                }
                other => Err(format!("{name:?} must be an integer, got {}", other.kind())),
            }
        }

        pub fn opt_u64(&self, name: &str) -> Result<Option<u64>, String> {
            match self {
                Value::Null => Ok(None),
                v => v.u64(name).map(Some),
            }
        }

        pub fn bool(&self, name: &str) -> Result<bool, String> {
            match self {
                Value::Bool(b) => Ok(*b),
                other => Err(format!("{name:?} must be a boolean, got {}", other.kind())),
            }
        }
    }

    pub fn parse(text: &str) -> Result<Value, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            text,
            i: 0,
        };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("invalid JSON: extra data at column {}", p.i + 1));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        text: &'a str,
        i: usize,
    }

    impl Parser<'_> {
        fn err<T>(&self, what: &str) -> Result<T, String> {
            Err(format!("invalid JSON: {what} at column {}", self.i + 1))
        }

        fn peek(&self) -> Option<u8> {
            self.s.get(self.i).copied()
        }

        fn ws(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        fn literal(&mut self, word: &str, v: Value) -> Result<Value, String> {
            if self.s[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(v)
            } else {
                self.err("unexpected character")
            }
        }

        fn value(&mut self, depth: usize) -> Result<Value, String> {
            match self.peek() {
                None => self.err("unexpected end"),
                Some(b'{') => self.object(depth + 1),
                Some(b'[') => self.array(depth + 1),
                Some(b'"') => Ok(Value::String(self.string()?)),
                Some(b't') => self.literal("true", Value::Bool(true)),
                Some(b'f') => self.literal("false", Value::Bool(false)),
                Some(b'n') => self.literal("null", Value::Null),
                Some(b'-' | b'0'..=b'9') => self.number(),
                Some(_) => self.err("unexpected character"),
            }
        }

        fn digits(&mut self) -> usize {
            let start = self.i;
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
            self.i - start
        }

        fn number(&mut self) -> Result<Value, String> {
            let start = self.i;
            if self.peek() == Some(b'-') {
                self.i += 1;
            }
            match self.peek() {
                Some(b'0') => self.i += 1,
                Some(b'1'..=b'9') => {
                    self.digits();
                }
                _ => return self.err("bad number"),
            }
            let mut integer = true;
            if self.peek() == Some(b'.') {
                self.i += 1;
                if self.digits() == 0 {
                    return self.err("bad number");
                }
                integer = false;
            }
            if matches!(self.peek(), Some(b'e' | b'E')) {
                self.i += 1;
                if matches!(self.peek(), Some(b'+' | b'-')) {
                    self.i += 1;
                }
                if self.digits() == 0 {
                    return self.err("bad number");
                }
                integer = false;
            }
            Ok(Value::Number(self.text[start..self.i].to_owned(), integer))
        }

        fn hex4(&mut self) -> Result<u32, String> {
            let Some(h) = self.s.get(self.i..self.i + 4) else {
                return self.err("bad \\u escape");
            };
            let Some(v) = std::str::from_utf8(h)
                .ok()
                .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|t| u32::from_str_radix(t, 16).ok())
            else {
                return self.err("bad \\u escape");
            };
            self.i += 4;
            Ok(v)
        }

        fn string(&mut self) -> Result<String, String> {
            self.i += 1; // the opening quote
            let mut out = String::new();
            loop {
                let start = self.i;
                while let Some(b) = self.peek() {
                    if b == b'"' || b == b'\\' || b < 0x20 {
                        break;
                    }
                    self.i += 1;
                }
                out.push_str(&self.text[start..self.i]);
                match self.peek() {
                    None => return self.err("unterminated string"),
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let Some(e) = self.peek() else {
                            return self.err("unterminated string");
                        };
                        self.i += 1;
                        match e {
                            b'"' => out.push('"'),
                            b'\\' => out.push('\\'),
                            b'/' => out.push('/'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'n' => out.push('\n'),
                            b'r' => out.push('\r'),
                            b't' => out.push('\t'),
                            b'u' => {
                                let hi = self.hex4()?;
                                let code = if (0xD800..0xDC00).contains(&hi)
                                    && self.s[self.i..].starts_with(b"\\u")
                                {
                                    let save = self.i;
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if (0xDC00..0xE000).contains(&lo) {
                                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                                    } else {
                                        self.i = save;
                                        hi
                                    }
                                } else {
                                    hi
                                };
                                // A lone surrogate (legal in Python strings) becomes U+FFFD; it
                                // can only appear in values we compare against ASCII names.
                                out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                            }
                            _ => {
                                self.i -= 1;
                                return self.err("bad escape");
                            }
                        }
                    }
                    Some(_) => return self.err("control character in string"),
                }
            }
        }

        fn array(&mut self, depth: usize) -> Result<Value, String> {
            if depth > MAX_DEPTH {
                return self.err("nesting too deep");
            }
            self.i += 1;
            let mut items = Vec::new();
            self.ws();
            if self.peek() == Some(b']') {
                self.i += 1;
                return Ok(Value::Array(items));
            }
            loop {
                self.ws();
                items.push(self.value(depth)?);
                self.ws();
                match self.peek() {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        return Ok(Value::Array(items));
                    }
                    _ => return self.err("expected ',' or ']'"),
                }
            }
        }

        fn object(&mut self, depth: usize) -> Result<Value, String> {
            if depth > MAX_DEPTH {
                return self.err("nesting too deep");
            }
            self.i += 1;
            let mut fields = Vec::new();
            self.ws();
            if self.peek() == Some(b'}') {
                self.i += 1;
                return Ok(Value::Object(fields));
            }
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return self.err("expected a string key");
                }
                let key = self.string()?;
                self.ws();
                if self.peek() != Some(b':') {
                    return self.err("expected ':'");
                }
                self.i += 1;
                self.ws();
                let v = self.value(depth)?;
                fields.push((key, v));
                self.ws();
                match self.peek() {
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        return Ok(Value::Object(fields));
                    }
                    _ => return self.err("expected ',' or '}'"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
