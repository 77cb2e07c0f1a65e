//! `Histogram`: the telemetry registry's explicit-bucket histogram (sie-core `histogram`), so a
//! batch's values are binned without a Python object per value. The twin is
//! `telemetry.registry.PyHistogram`, with the same names and methods.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use sie_core::histogram::Histogram as Core;

/// Floats of a list or tuple read in place; any other iterable item by item.
fn for_each_float(values: &Bound<'_, PyAny>, mut f: impl FnMut(f64)) -> PyResult<()> {
    if let Ok(list) = values.cast::<PyList>() {
        for v in list.iter() {
            f(v.extract()?);
        }
    } else if let Ok(tuple) = values.cast::<PyTuple>() {
        for v in tuple.iter() {
            f(v.extract()?);
        }
    } else {
        for v in values.try_iter()? {
            f(v?.extract()?);
        }
    }
    Ok(())
}

#[pyclass(module = "sie_sidecar._native")]
pub struct Histogram {
    inner: Core,
    #[pyo3(get)]
    name: Py<PyAny>,
    #[pyo3(get)]
    attrs: Py<PyAny>,
    bounds: Py<PyTuple>,
}

impl Histogram {
    /// One observation per value, from Rust (`columns::run_batch_columns`'s work-item ages).
    pub(crate) fn record_values(&mut self, values: Vec<f64>) {
        self.inner.record_many(values);
    }
}

#[pymethods]
impl Histogram {
    #[new]
    fn new(py: Python<'_>, name: Py<PyAny>, attrs: Py<PyAny>, bounds: Vec<f64>) -> PyResult<Self> {
        let inner = Core::new(bounds.clone()).map_err(|_| {
            PyValueError::new_err(format!(
                "histogram {} bounds must be strictly increasing",
                name.bind(py)
            ))
        })?;
        Ok(Self {
            inner,
            name,
            attrs,
            bounds: PyTuple::new(py, bounds)?.unbind(),
        })
    }

    #[classattr]
    fn kind() -> &'static str {
        "histogram"
    }

    #[getter]
    fn bounds(&self, py: Python<'_>) -> Py<PyTuple> {
        self.bounds.clone_ref(py)
    }

    /// The bucket counts, a new list (the last bucket is above the last bound).
    #[getter]
    fn buckets(&self) -> Vec<u64> {
        self.inner.buckets().to_vec()
    }

    #[getter]
    fn count(&self) -> u64 {
        self.inner.count
    }

    #[getter]
    fn sum(&self) -> f64 {
        self.inner.sum
    }

    #[getter]
    fn min(&self) -> f64 {
        self.inner.min
    }

    #[getter]
    fn max(&self) -> f64 {
        self.inner.max
    }

    fn record(&mut self, value: f64) {
        self.inner.record_n(value, 1);
    }

    /// `n` observations of one value (nothing for `n` <= 0).
    fn record_n(&mut self, value: f64, n: i64) {
        if n > 0 {
            self.inner.record_n(value, n as u64);
        }
    }

    /// One observation per value.
    fn record_many(&mut self, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut batch = Vec::new();
        for_each_float(values, |v| batch.push(v))?;
        self.inner.record_many(batch);
        Ok(())
    }
}

/// A model lane's per-batch histograms for one operation (sidecar-behaviour §13), recorded in one
/// call a batch: the lane's recording was ~20 Python calls a batch into five histograms, three
/// gauges and a dict of depths, and cost more CPU than its instructions (docs/benchmarks.md).
/// The twin is `_twins.histogram.BatchInstruments`.
#[pyclass(module = "sie_sidecar._native", frozen)]
pub struct BatchInstruments {
    queue_duration: Py<Histogram>,
    size: Py<Histogram>,
    cost: Py<Histogram>,
    dispatch_wait: Py<Histogram>,
    total: Py<Histogram>,
}

#[pymethods]
impl BatchInstruments {
    #[new]
    fn new(
        queue_duration: Py<Histogram>,
        size: Py<Histogram>,
        cost: Py<Histogram>,
        dispatch_wait: Py<Histogram>,
        total: Py<Histogram>,
    ) -> Self {
        Self {
            queue_duration,
            size,
            cost,
            dispatch_wait,
            total,
        }
    }

    /// One formed batch: each item's queue time (`taken_at - t` per enqueue time `t`) and, when
    /// the backend answered (`answered` is its time), the batch's size and cost and its oldest
    /// item's enqueue → `dispatched` and → `answered`. Returns the oldest enqueue time (None for no
    /// items).
    #[pyo3(signature = (enqueued_at, taken_at, items, cost, dispatched, answered=None))]
    #[allow(clippy::too_many_arguments)] // positional, one call a batch (as the twin's)
    fn record(
        &self,
        py: Python<'_>,
        enqueued_at: &Bound<'_, PyAny>,
        taken_at: f64,
        items: i64,
        cost: i64,
        dispatched: f64,
        answered: Option<f64>,
    ) -> PyResult<Option<f64>> {
        let mut waits = Vec::new();
        let mut oldest: Option<f64> = None;
        for_each_float(enqueued_at, |t| {
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
            waits.push(taken_at - t);
        })?;
        self.queue_duration.borrow_mut(py).inner.record_many(waits);
        if let Some(answered) = answered {
            let first = oldest.unwrap_or(dispatched);
            self.size.borrow_mut(py).inner.record_n(items as f64, 1);
            self.cost.borrow_mut(py).inner.record_n(cost as f64, 1);
            self.dispatch_wait
                .borrow_mut(py)
                .inner
                .record_n(dispatched - first, 1);
            self.total
                .borrow_mut(py)
                .inner
                .record_n(answered - first, 1);
        }
        Ok(oldest)
    }
}
