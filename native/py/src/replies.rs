//! A whole batch of backend outcomes to one buffer of NATS `PUB` commands, in one call.
//!
//! The common case of a batch (every outcome in item order, already framed by the backend or an
//! error, each reply under `max_payload`) needs no per-item Python: this builds every WorkResult
//! (wire-protocol §8.1, the fields `results.outcome_result` would give) and frames it as
//! `PUB <reply> <len>\r\n<WorkResult>\r\n`. Anything else (`nak_retry`, sidecar-side framing of
//! `raw_output`, a reply that needs ResultChunkV1 or PAYLOAD_TOO_LARGE, outcomes out of order)
//! returns `None` and the caller takes the general per-item path.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use sie_core::msgpack::{Counter, Out, SliceWriter};
use sie_core::results::{encode_work_result, WorkResultRef, UNIT_KEYS};

use crate::envelopes::ItemOutcome;

/// `units` of an outcome as the five optional counts of the WorkResult.
pub fn read_units(units: Option<&Bound<'_, PyDict>>) -> PyResult<Option<[Option<u64>; 5]>> {
    let Some(d) = units else { return Ok(None) };
    let mut counts = [None; 5];
    for (slot, key) in counts.iter_mut().zip(UNIT_KEYS) {
        *slot = match d.get_item(key)? {
            Some(v) if !v.is_none() => Some(v.extract::<u64>()?),
            _ => None,
        };
    }
    Ok(Some(counts))
}

/// The per-item fields of a WorkItem that a reply needs.
struct ItemFields {
    work_item_id: String,
    request_id: String,
    item_index: u64,
    reply_subject: String,
    bundle_config_hash: String,
    timestamp: f64,
}

impl ItemFields {
    fn read(item: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = item.py();
        Ok(Self {
            work_item_id: item.getattr(intern!(py, "work_item_id"))?.extract()?,
            request_id: item.getattr(intern!(py, "request_id"))?.extract()?,
            item_index: item.getattr(intern!(py, "item_index"))?.extract()?,
            reply_subject: item.getattr(intern!(py, "reply_subject"))?.extract()?,
            bundle_config_hash: item.getattr(intern!(py, "bundle_config_hash"))?.extract()?,
            timestamp: item.getattr(intern!(py, "timestamp"))?.extract()?,
        })
    }

    /// Wall time from the gateway's publish to `now`, in ms (≥ 0; 0 without a timestamp).
    fn queue_ms(&self, now: f64) -> f64 {
        if self.timestamp <= 0.0 {
            0.0
        } else {
            ((now - self.timestamp) * 1000.0).max(0.0)
        }
    }
}

/// The framed replies of a batch: one buffer, and per delivery whether a PUB was written
/// (`1`) or there was no reply subject, so nothing was sent (`0`). With `acks`, the buffer ends
/// with one `+ACK` per delivery (`acks` of them), after every reply.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct FramedReplies {
    pub buffer: Py<PyBytes>,
    pub sent: Py<PyBytes>,
    pub messages: usize,
    pub payload_bytes: usize,
    pub acks: usize,
}

#[pymethods]
impl FramedReplies {
    fn __repr__(&self) -> String {
        format!(
            "FramedReplies(messages={}, payload_bytes={}, acks={})",
            self.messages, self.payload_bytes, self.acks
        )
    }
}

/// One reply of the batch, checked and measured in the first pass.
struct Planned<'py> {
    outcome: Bound<'py, ItemOutcome>,
    item: ItemFields,
    success: bool,
    worker_direct: bool,
    payload_fetch_ms: Option<f64>,
    units: Option<[Option<u64>; 5]>,
    size: usize,
}

impl Planned<'_> {
    fn result<'a>(
        &'a self,
        py: Python<'a>,
        worker_id: &'a str,
        current_hash: Option<&'a str>,
        now: f64,
    ) -> WorkResultRef<'a> {
        let o = self.outcome.get();
        let f = &self.item;
        let success = self.success;
        WorkResultRef {
            work_item_id: &f.work_item_id,
            request_id: &f.request_id,
            item_index: f.item_index,
            success,
            result_msgpack: if success {
                o.result_msgpack.bind(py).as_bytes()
            } else {
                &[]
            },
            error: if success { None } else { o.error.as_deref() },
            error_code: if success {
                None
            } else {
                o.error_code.as_deref()
            },
            inference_ms: o.inference_ms,
            queue_ms: Some(f.queue_ms(now)),
            processing_ms: Some(0.0),
            worker_id: Some(worker_id),
            tokenization_ms: o.tokenization_ms,
            postprocessing_ms: o.postprocessing_ms,
            payload_fetch_ms: self.payload_fetch_ms,
            units: self.units,
            worker_direct: self.worker_direct,
            executed_bundle_config_hash: current_hash
                .filter(|h| !f.bundle_config_hash.is_empty() && f.bundle_config_hash == *h),
            retry_after_s: None,
        }
    }
}

/// Python's `str.isspace()` for one char: Unicode White_Space plus the separators U+001C..U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// A JetStream ACK subject usable in a PUB line: non-empty, no whitespace or control bytes.
fn ack_subject_ok(subject: &str) -> bool {
    !subject.is_empty() && subject.bytes().all(|b| b > b' ' && b != 0x7f)
}

const ACK_PAYLOAD: &[u8] = b"+ACK";

/// Frame every reply of a batch whose outcomes arrived in delivery order, or `None` when the
/// batch needs the general path. `deliveries` are objects with `.item` (a WorkItem) and
/// `.worker_direct` (and `.msg.reply`, the ACK subject, with `acks`); `now` is `time.time()`
/// for `queue_ms`. With `acks`, every delivery's ACK follows the replies in the same buffer, so
/// a batch settles with one write (the replies precede the ACKs on the connection).
#[pyfunction]
#[pyo3(signature = (deliveries, outcomes, *, worker_id, current_hash, now, max_payload, acks = false))]
#[allow(clippy::too_many_arguments)]
pub fn frame_outcome_replies(
    py: Python<'_>,
    deliveries: &Bound<'_, PyList>,
    outcomes: &Bound<'_, PyList>,
    worker_id: &str,
    current_hash: Option<&str>,
    now: f64,
    max_payload: u64,
    acks: bool,
) -> PyResult<Option<FramedReplies>> {
    let n = deliveries.len();
    if outcomes.len() != n {
        return Ok(None);
    }
    let mut ack_subjects: Vec<String> = Vec::with_capacity(if acks { n } else { 0 });
    if acks {
        for delivery in deliveries.iter() {
            let subject: String = delivery
                .getattr(intern!(py, "msg"))?
                .getattr(intern!(py, "reply"))?
                .extract()?;
            if !ack_subject_ok(&subject) {
                return Ok(None); // the general path settles it one by one
            }
            ack_subjects.push(subject);
        }
    }
    let mut planned: Vec<Planned<'_>> = Vec::with_capacity(n);
    let mut sent = vec![0u8; n];
    let (mut total, mut payload_bytes) = (0usize, 0usize);
    for (i, (delivery, outcome)) in deliveries.iter().zip(outcomes.iter()).enumerate() {
        let Ok(outcome) = outcome.cast_into::<ItemOutcome>() else {
            return Ok(None);
        };
        let item = ItemFields::read(&delivery.getattr(intern!(py, "item"))?)?;
        let o = outcome.get();
        if o.work_item_id != item.work_item_id || o.raw_output.is_some() {
            return Ok(None);
        }
        let success = match o.disposition.bind(py).cast::<PyString>()?.to_str()? {
            "publish_and_ack" if !o.result_msgpack.bind(py).as_bytes().is_empty() => true,
            "publish_error_and_ack" => false,
            _ => return Ok(None), // nak_retry, or a success the sidecar must frame
        };
        if item.reply_subject.chars().all(py_space) {
            continue; // fire-and-forget: nothing to send, and it counts as published
        }
        let units = read_units(o.units.as_ref().map(|u| u.bind(py)))?;
        let worker_direct = delivery.getattr(intern!(py, "worker_direct"))?.extract()?;
        // §6.1: written only when a payload was actually fetched for this item.
        let fetch_ms: f64 = match delivery.getattr(intern!(py, "payload_fetch_ms")) {
            Ok(v) => v.extract()?,
            Err(_) => 0.0,
        };
        let mut p = Planned {
            outcome,
            item,
            success,
            worker_direct,
            payload_fetch_ms: (fetch_ms > 0.0).then_some(fetch_ms),
            units,
            size: 0,
        };
        let mut size = Counter::default();
        encode_work_result(&mut size, &p.result(py, worker_id, current_hash, now));
        if size.0 as u64 > max_payload {
            return Ok(None); // ResultChunkV1 or the compact PAYLOAD_TOO_LARGE error
        }
        p.size = size.0;
        total += pub_header_len(&p.item.reply_subject, size.0) + size.0 + 2;
        payload_bytes += size.0;
        sent[i] = 1;
        planned.push(p);
    }
    for subject in &ack_subjects {
        total += pub_header_len(subject, ACK_PAYLOAD.len()) + ACK_PAYLOAD.len() + 2;
    }
    let buffer = PyBytes::new_with(py, total, |buf| {
        let mut w = SliceWriter::new(buf);
        for p in &planned {
            write_pub_header(&mut w, &p.item.reply_subject, p.size);
            encode_work_result(&mut w, &p.result(py, worker_id, current_hash, now));
            w.extend_from_slice(b"\r\n");
        }
        for subject in &ack_subjects {
            write_pub_header(&mut w, subject, ACK_PAYLOAD.len());
            w.extend_from_slice(ACK_PAYLOAD);
            w.extend_from_slice(b"\r\n");
        }
        Ok(())
    })?;
    Ok(Some(FramedReplies {
        buffer: buffer.unbind(),
        sent: PyBytes::new(py, &sent).unbind(),
        messages: planned.len(),
        payload_bytes,
        acks: ack_subjects.len(),
    }))
}

/// Write `PUB <subject> <size>\r\n` (no intermediate String: this runs twice per item).
fn write_pub_header(w: &mut impl Out, subject: &str, size: usize) {
    w.extend_from_slice(b"PUB ");
    w.extend_from_slice(subject.as_bytes());
    w.extend_from_slice(b" ");
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = size;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    w.extend_from_slice(&digits[at..]);
    w.extend_from_slice(b"\r\n");
}

/// The length `write_pub_header` writes.
fn pub_header_len(subject: &str, size: usize) -> usize {
    let digits = size.checked_ilog10().map_or(1, |d| d as usize + 1);
    "PUB ".len() + subject.len() + 1 + digits + "\r\n".len()
}
