//! A pulled batch's JetStream delivery attempts in one call (`bus.attempts.record_receive`): each
//! message's ACK subject is read in place for a scanned `LazyDelivery`, or from its `reply`
//! otherwise, and the counts come back grouped, so Python records per batch, not per message.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use sie_core::jetstream::AttemptCounts;

use crate::lazy::LazyDelivery;

/// `([(attempt, messages), ...] ascending, messages without an ACK subject)`. Each subject is read
/// where it lies (the run buffer, or the `reply` str), never copied: an owned copy per message was
/// most of this call's ~16 µs per 64-message batch.
#[pyfunction]
pub fn delivery_attempts(messages: &Bound<'_, PyAny>) -> PyResult<(Vec<(u64, u64)>, u64)> {
    let mut counts = AttemptCounts::default();
    count_into(&mut counts, messages)?;
    Ok(counts.finish())
}

/// A pull consumer's delivery attempts, counted as each run of deliveries arrives and taken when
/// the metrics are exported (`bus.attempts.observe_pulls`).
///
/// Why: read when a batch was taken, the ACK subjects had left the CPU's caches (the consumer
/// buffers up to its outstanding cap), ~4 cache misses an item and the largest single cost of
/// metrics on; recorded per run into the registry from Python, the calls cost as much again
/// (docs/benchmarks.md, issue 32's eighth session). Here a run costs one call and nothing else.
#[pyclass(module = "sie_sidecar._native", name = "AttemptTally")]
#[derive(Default)]
pub struct AttemptTally {
    counts: AttemptCounts,
}

#[pymethods]
impl AttemptTally {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Count `messages`' delivery attempts, as `delivery_attempts` reads them.
    fn add(&mut self, messages: &Bound<'_, PyAny>) -> PyResult<()> {
        count_into(&mut self.counts, messages)
    }

    /// `delivery_attempts`' pair for everything added since the last `take`; the tally starts
    /// again from zero.
    fn take(&mut self) -> (Vec<(u64, u64)>, u64) {
        self.counts.take()
    }
}

impl AttemptTally {
    /// One delivery's ACK subject, as it lies in a scanned run (`lazy::deliveries_of_run`).
    pub fn add_subject(&mut self, subject: &[u8]) {
        self.counts.add_bytes(Some(subject));
    }
}

fn count_into(counts: &mut AttemptCounts, messages: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = messages.py();
    let k_reply = intern!(py, "reply");
    for m in messages.try_iter()? {
        let m = m?;
        if let Ok(lazy) = m.cast::<LazyDelivery>() {
            let this = lazy.borrow();
            let buffer = this.buffer.bind(py);
            if let Some(subject) = this.ack_subject_bytes(buffer) {
                counts.add_bytes(Some(subject));
                continue;
            }
        }
        match m.getattr(k_reply) {
            Ok(reply) => match reply.cast::<PyString>() {
                Ok(s) => counts.add_bytes(s.to_str().ok().map(str::as_bytes)),
                Err(_) => counts.add_bytes(None),
            },
            Err(_) => counts.add_bytes(None),
        }
    }
    Ok(())
}
