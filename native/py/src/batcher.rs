//! The batch former (`sie_core::batcher`) for Python: one object per (model, op, LoRA) key,
//! driven by the scheduler's drain loop with whole batches of handles per call.

use pyo3::prelude::*;
use pyo3::types::PyList;

use sie_core::batcher::{Batch, BatchConfig, Batcher as Core, FlushReason};

/// A formed batch: item handles in packing order, their total cost and the flush reason.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct FormedBatch {
    pub ids: Py<PyList>,
    pub total_cost: u64,
    pub reason: &'static str,
}

#[pymethods]
impl FormedBatch {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "FormedBatch(items={}, total_cost={}, reason={:?})",
            self.ids.bind(py).len(),
            self.total_cost,
            self.reason
        )
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.ids.bind(py).len()
    }
}

fn formed(py: Python<'_>, batch: Batch) -> PyResult<FormedBatch> {
    Ok(FormedBatch {
        ids: PyList::new(py, batch.ids)?.unbind(),
        total_cost: batch.total_cost,
        reason: batch.reason.label(),
    })
}

fn checked_config(
    max_batch_cost: u64,
    max_batch_requests: usize,
    max_batch_wait_ms: f64,
    coalesce_ms: f64,
    coalesce_ratio: f64,
) -> PyResult<BatchConfig> {
    let finite = [max_batch_wait_ms, coalesce_ms, coalesce_ratio];
    if finite.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "batch wait, coalesce window and ratio must be finite and >= 0",
        ));
    }
    if max_batch_requests == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "max_batch_requests must be >= 1",
        ));
    }
    Ok(BatchConfig {
        max_batch_cost,
        max_batch_requests,
        max_batch_wait_ms,
        coalesce_ms,
        coalesce_ratio,
    })
}

/// One batch former (scheduler-and-prep §3). Times are seconds on the caller's monotonic clock.
#[pyclass(module = "sie_sidecar._native")]
pub struct Batcher {
    inner: Core,
}

#[pymethods]
impl Batcher {
    #[new]
    #[pyo3(signature = (*, max_batch_cost = 16384, max_batch_requests = 12, max_batch_wait_ms = 15.0, coalesce_ms = 5.0, coalesce_ratio = 0.5))]
    fn new(
        max_batch_cost: u64,
        max_batch_requests: usize,
        max_batch_wait_ms: f64,
        coalesce_ms: f64,
        coalesce_ratio: f64,
    ) -> PyResult<Self> {
        let config = checked_config(
            max_batch_cost,
            max_batch_requests,
            max_batch_wait_ms,
            coalesce_ms,
            coalesce_ratio,
        )?;
        Ok(Self {
            inner: Core::new(config),
        })
    }

    /// Replace the cost cap and wait (controller step); True when the queue became flushable.
    fn update_limits(
        &mut self,
        max_batch_cost: u64,
        max_batch_wait_ms: f64,
        now: f64,
    ) -> PyResult<bool> {
        let c = self.inner.config();
        let config = checked_config(
            max_batch_cost,
            c.max_batch_requests,
            max_batch_wait_ms,
            c.coalesce_ms,
            c.coalesce_ratio,
        )?;
        Ok(self.inner.update_config(config, now))
    }

    #[getter]
    fn max_batch_cost(&self) -> u64 {
        self.inner.config().max_batch_cost
    }

    #[getter]
    fn max_batch_requests(&self) -> usize {
        self.inner.config().max_batch_requests
    }

    #[getter]
    fn max_batch_wait_ms(&self) -> f64 {
        self.inner.config().max_batch_wait_ms
    }

    #[getter]
    fn effective_coalesce_ms(&self) -> f64 {
        self.inner.config().effective_coalesce_ms()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn total_cost(&self) -> u64 {
        self.inner.total_cost()
    }

    #[getter]
    fn head_arrival(&self) -> Option<f64> {
        self.inner.head_arrival()
    }

    /// Submit items at `now` (one call per group); True when the consumer should wake. `alone`
    /// (one bool per item, newer than v0.7.1): the item never shares a batch.
    #[pyo3(signature = (ids, costs, now, hard_caps = None, alone = None))]
    fn submit_many(
        &mut self,
        ids: Vec<u64>,
        costs: Vec<u64>,
        now: f64,
        hard_caps: Option<Vec<Option<u64>>>,
        alone: Option<Vec<bool>>,
    ) -> PyResult<bool> {
        if ids.len() != costs.len()
            || hard_caps.as_ref().is_some_and(|h| h.len() != ids.len())
            || alone.as_ref().is_some_and(|a| a.len() != ids.len())
        {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "ids, costs, hard_caps and alone must have the same length",
            ));
        }
        let mut wake = false;
        for (i, (id, cost)) in ids.into_iter().zip(costs).enumerate() {
            let cap = hard_caps.as_ref().and_then(|h| h[i]);
            let lone = alone.as_ref().is_some_and(|a| a[i]);
            wake |= self.inner.submit_item(id, cost, now, cap, lone);
        }
        Ok(wake)
    }

    /// The trigger that fires at `now` (`immediate` allows `idle_bypass`), or None.
    fn flush_reason(&self, now: f64, immediate: bool) -> Option<&'static str> {
        self.inner
            .flush_reason(now, immediate)
            .map(FlushReason::label)
    }

    fn time_until_next_trigger_ms(&self, now: f64) -> Option<f64> {
        self.inner.time_until_next_trigger_ms(now)
    }

    fn try_get_batch(
        &mut self,
        py: Python<'_>,
        now: f64,
        immediate: bool,
    ) -> PyResult<Option<FormedBatch>> {
        self.inner
            .try_get_batch(now, immediate)
            .map(|b| formed(py, b))
            .transpose()
    }

    fn try_drain_up_to(
        &mut self,
        py: Python<'_>,
        max_items: usize,
    ) -> PyResult<Option<FormedBatch>> {
        self.inner
            .try_drain_up_to(max_items)
            .map(|b| formed(py, b))
            .transpose()
    }

    /// Every pending handle, oldest first, leaving the former empty (shutdown residue).
    fn drain_all(&mut self) -> Vec<u64> {
        self.inner.drain_all()
    }
}
