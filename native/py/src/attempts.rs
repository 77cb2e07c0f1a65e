//! A pulled batch's JetStream delivery attempts in one call (`bus.attempts.record_receive`): each
//! message's ACK subject is read in place for a scanned `LazyDelivery`, or from its `reply`
//! otherwise, and the counts come back grouped, so Python records per batch, not per message.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use sie_core::jetstream::attempt_counts;

use crate::lazy::LazyDelivery;

/// `([(attempt, messages), ...] ascending, messages without an ACK subject)`.
#[pyfunction]
pub fn delivery_attempts(messages: &Bound<'_, PyAny>) -> PyResult<(Vec<(u64, u64)>, u64)> {
    let py = messages.py();
    let k_reply = intern!(py, "reply");
    let mut owned: Vec<Option<String>> = Vec::new();
    for m in messages.try_iter()? {
        let m = m?;
        if let Ok(lazy) = m.cast::<LazyDelivery>() {
            let this = lazy.borrow();
            let buffer = this.buffer.bind(py).clone();
            if let Some(subject) = this.ack_subject(&buffer) {
                owned.push(Some(subject.to_owned()));
                continue;
            }
        }
        let reply = m.getattr(k_reply).ok();
        owned.push(reply.and_then(|r| {
            r.cast::<PyString>()
                .ok()
                .and_then(|s| s.to_str().ok().map(str::to_owned))
        }));
    }
    Ok(attempt_counts(owned.iter().map(Option::as_deref)))
}
