//! The scheduler's adaptive batch controller (`sie_core::controller`) for Python: the controller,
//! the sample window its trackers use, and the JSONL replay harness.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use sie_core::controller::{self as core, ControllerConfig, ControllerSnapshot};

fn value_error(message: String) -> PyErr {
    PyValueError::new_err(message)
}

fn config_dict<'py>(py: Python<'py>, c: &ControllerConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("target_p50_ms", c.target_p50_ms)?;
    d.set_item("calibration_multiplier", c.calibration_multiplier)?;
    d.set_item("min_target_p50_ms", c.min_target_p50_ms)?;
    d.set_item("max_target_p50_ms", c.max_target_p50_ms)?;
    d.set_item("min_wait_ms", c.min_wait_ms)?;
    d.set_item("max_wait_ms", c.max_wait_ms)?;
    d.set_item("initial_wait_ms", c.initial_wait_ms)?;
    d.set_item("min_batch_cost", c.min_batch_cost)?;
    d.set_item("max_batch_cost", c.max_batch_cost)?;
    d.set_item("initial_batch_cost", c.initial_batch_cost)?;
    d.set_item("gain", c.gain)?;
    d.set_item("integral_gain", c.integral_gain)?;
    d.set_item("cost_gain", c.cost_gain)?;
    d.set_item("update_interval", c.update_interval)?;
    d.set_item("fill_ratio_threshold", c.fill_ratio_threshold)?;
    d.set_item("integral_max", c.integral_max)?;
    d.set_item("starvation_recovery_enabled", c.starvation_recovery_enabled)?;
    d.set_item("starvation_window", c.starvation_window)?;
    d.set_item("starvation_batch_size", c.starvation_batch_size)?;
    Ok(d)
}

fn snapshot_dict<'py>(py: Python<'py>, s: &ControllerSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("enabled", s.enabled)?;
    d.set_item("calibrated", s.calibrated)?;
    d.set_item("target_p50_ms", s.target_p50_ms)?;
    d.set_item("current_wait_ms", s.current_wait_ms)?;
    d.set_item("current_batch_cost", s.current_batch_cost)?;
    d.set_item("observed_p50_ms", s.observed_p50_ms)?;
    d.set_item("headroom_ms", s.headroom_ms)?;
    d.set_item("fill_ratio", s.fill_ratio)?;
    d.set_item("integral", s.integral)?;
    d.set_item("starvation_streak", s.starvation_streak)?;
    d.set_item("starvation_resets", s.starvation_resets)?;
    Ok(d)
}

/// PI control of the batch wait and cost cap from the latency headroom (scheduler-and-prep §4).
#[pyclass(module = "sie_sidecar._native")]
pub struct AdaptiveController {
    inner: core::AdaptiveController,
}

#[pymethods]
impl AdaptiveController {
    /// Module defaults (§4.2); `target_p50_ms=None` calibrates from the inference window.
    #[new]
    #[pyo3(signature = (
        *,
        target_p50_ms = None,
        calibration_multiplier = 1.5,
        min_target_p50_ms = 5.0,
        max_target_p50_ms = 500.0,
        min_wait_ms = 1.0,
        max_wait_ms = 50.0,
        initial_wait_ms = 10.0,
        min_batch_cost = 256,
        max_batch_cost = 65536,
        initial_batch_cost = 16384,
        gain = 0.3,
        integral_gain = 0.05,
        cost_gain = 0.15,
        update_interval = 10,
        fill_ratio_threshold = 0.7,
        integral_max = 20.0,
        starvation_recovery_enabled = true,
        starvation_window = 20,
        starvation_batch_size = 1,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        target_p50_ms: Option<f64>,
        calibration_multiplier: f64,
        min_target_p50_ms: f64,
        max_target_p50_ms: f64,
        min_wait_ms: f64,
        max_wait_ms: f64,
        initial_wait_ms: f64,
        min_batch_cost: u64,
        max_batch_cost: u64,
        initial_batch_cost: u64,
        gain: f64,
        integral_gain: f64,
        cost_gain: f64,
        update_interval: u64,
        fill_ratio_threshold: f64,
        integral_max: f64,
        starvation_recovery_enabled: bool,
        starvation_window: u64,
        starvation_batch_size: u64,
    ) -> PyResult<Self> {
        let config = ControllerConfig {
            target_p50_ms,
            calibration_multiplier,
            min_target_p50_ms,
            max_target_p50_ms,
            min_wait_ms,
            max_wait_ms,
            initial_wait_ms,
            min_batch_cost,
            max_batch_cost,
            initial_batch_cost,
            gain,
            integral_gain,
            cost_gain,
            update_interval,
            fill_ratio_threshold,
            integral_max,
            starvation_recovery_enabled,
            starvation_window,
            starvation_batch_size,
        };
        let inner = core::AdaptiveController::new(config).map_err(value_error)?;
        Ok(Self { inner })
    }

    /// The production controller for a model budget `B` (§4.2), with the
    /// `SIE_ADAPTIVE_BATCH_*` overrides read from `env` when given (bad values logged, ignored).
    #[staticmethod]
    #[pyo3(signature = (budget, initial_wait_ms = 15.0, env = None))]
    fn production(
        py: Python<'_>,
        budget: u64,
        initial_wait_ms: f64,
        env: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut config = ControllerConfig::production(budget, initial_wait_ms);
        if let Some(env) = env {
            let mut values = HashMap::new();
            for name in core::ENV_VARS {
                let v: Option<String> = env.call_method1("get", (name,))?.extract()?;
                if let Some(v) = v {
                    values.insert(name, v);
                }
            }
            let warnings = config.apply_env(|name| values.get(name).cloned());
            if !warnings.is_empty() {
                let log = py
                    .import("logging")?
                    .call_method1("getLogger", ("sie_sidecar.sched.controller",))?;
                for w in warnings {
                    log.call_method1("warning", ("%s", w))?;
                }
            }
        }
        let inner = core::AdaptiveController::new(config).map_err(value_error)?;
        Ok(Self { inner })
    }

    /// One backend batch's inference time (ms); kept only while the target is uncalibrated.
    fn record_inference(&mut self, inference_ms: f64) {
        self.inner.record_inference(inference_ms);
    }

    /// One completion: returns `(wait_ms, batch_cost)` now in force. `now_s` is a monotonic
    /// clock in seconds (the caller's, so tests and replays control time).
    #[pyo3(signature = (observed_p50_ms, fill_ratio, batch_size, now_s))]
    fn step(
        &mut self,
        observed_p50_ms: Option<f64>,
        fill_ratio: Option<f64>,
        batch_size: Option<u64>,
        now_s: f64,
    ) -> (f64, u64) {
        self.inner
            .step(observed_p50_ms, fill_ratio, batch_size, now_s)
    }

    fn reset(&mut self) {
        self.inner.reset();
    }

    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        snapshot_dict(py, &self.inner.snapshot())
    }

    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        config_dict(py, self.inner.config())
    }

    #[getter]
    fn current_wait_ms(&self) -> f64 {
        self.inner.current_wait_ms()
    }

    #[getter]
    fn current_batch_cost(&self) -> u64 {
        self.inner.current_batch_cost()
    }

    #[getter]
    fn calibrated(&self) -> bool {
        self.inner.calibrated()
    }

    #[getter]
    fn target_p50_ms(&self) -> Option<f64> {
        self.inner.target_p50_ms()
    }

    #[getter]
    fn starvation_resets(&self) -> u64 {
        self.inner.starvation_resets()
    }

    fn __repr__(&self) -> String {
        let target = match self.inner.target_p50_ms() {
            Some(t) => format!("{t:?}"),
            None => "None".to_owned(),
        };
        format!(
            "AdaptiveController(wait_ms={:?}, batch_cost={}, target_p50_ms={target})",
            self.inner.current_wait_ms(),
            self.inner.current_batch_cost(),
        )
    }
}

/// The last `capacity` samples: percentile by sort-and-index (`floor(p/100 × (n − 1))`) or mean,
/// both `None` below `min_samples`. NaN is dropped.
#[pyclass(module = "sie_sidecar._native")]
pub struct PercentileWindow {
    inner: core::PercentileWindow,
}

#[pymethods]
impl PercentileWindow {
    #[new]
    #[pyo3(signature = (capacity, min_samples = 1))]
    fn new(capacity: usize, min_samples: usize) -> PyResult<Self> {
        let inner = core::PercentileWindow::new(capacity, min_samples).map_err(value_error)?;
        Ok(Self { inner })
    }

    fn push(&mut self, value: f64) -> bool {
        self.inner.push(value)
    }

    /// `push` of each value in order, in one call (a batch's latencies); how many were kept.
    fn extend(&mut self, values: Vec<f64>) -> usize {
        values.into_iter().filter(|v| self.inner.push(*v)).count()
    }

    fn percentile(&self, p: f64) -> PyResult<Option<f64>> {
        self.inner.percentile(p).map_err(value_error)
    }

    fn p50(&self) -> Option<f64> {
        self.inner.p50()
    }

    fn mean(&self) -> Option<f64> {
        self.inner.mean()
    }

    fn values(&self) -> Vec<f64> {
        self.inner.values().collect()
    }

    fn clear(&mut self) {
        self.inner.clear();
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    #[getter]
    fn min_samples(&self) -> usize {
        self.inner.min_samples()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// Replay a JSONL controller trace (§4.7) on a fresh controller: one
/// `{"wait_ms", "batch_cost", "starvation_resets"}` per step event; `ValueError` on bad input.
#[pyfunction]
#[pyo3(signature = (trace, config = None))]
pub fn replay_controller<'py>(
    py: Python<'py>,
    trace: &str,
    config: Option<&str>,
) -> PyResult<Bound<'py, PyList>> {
    let steps = core::replay(config, trace.lines()).map_err(|e| value_error(e.to_string()))?;
    let out = PyList::empty(py);
    for (wait_ms, batch_cost, resets) in steps {
        let d = PyDict::new(py);
        d.set_item("wait_ms", wait_ms)?;
        d.set_item("batch_cost", batch_cost)?;
        d.set_item("starvation_resets", resets)?;
        out.append(d)?;
    }
    Ok(out)
}
