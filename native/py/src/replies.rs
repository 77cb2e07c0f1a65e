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

use sie_core::msgpack::{Counter, Out, Reader, Token};
use sie_core::results::{encode_work_result, Units, WorkResultRef, UNIT_KEYS};

use crate::buffers::{new_bytes, with_bytes};
use crate::envelopes::{unit_counts, ItemOutcome};
use crate::lazy::{self, InPlace, LazyDelivery};
use crate::text::{text, valid_utf8};

/// `units` of an outcome as the optional counts of the WorkResult (a key absent from the dict: None).
pub fn read_units(units: Option<&Bound<'_, PyDict>>) -> PyResult<Option<Units>> {
    let Some(d) = units else { return Ok(None) };
    let mut counts: Units = [None; 7];
    for (slot, key) in counts.iter_mut().zip(UNIT_KEYS) {
        *slot = match d.get_item(key)? {
            Some(v) if !v.is_none() => Some(v.extract::<u64>()?),
            _ => None,
        };
    }
    Ok(Some(counts))
}

/// The str objects of a WorkItem that a reply needs (kept alive for the framing pass, so the
/// fields can borrow their UTF-8 without a copy), and its two numbers.
struct ItemObjects<'py> {
    strs: [Bound<'py, PyString>; 4],
    item_index: u64,
    timestamp: f64,
}

impl<'py> ItemObjects<'py> {
    fn read(item: &Bound<'py, PyAny>) -> PyResult<Self> {
        let py = item.py();
        let s = |name: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyString>> {
            Ok(item.getattr(name)?.cast_into::<PyString>()?)
        };
        Ok(Self {
            strs: [
                s(intern!(py, "work_item_id"))?,
                s(intern!(py, "request_id"))?,
                s(intern!(py, "reply_subject"))?,
                s(intern!(py, "bundle_config_hash"))?,
            ],
            item_index: item.getattr(intern!(py, "item_index"))?.extract()?,
            timestamp: item.getattr(intern!(py, "timestamp"))?.extract()?,
        })
    }

    /// The item's `request_id` str.
    fn request_id(self) -> Bound<'py, PyString> {
        let [_, rid, _, _] = self.strs;
        rid
    }

    fn fields(&self) -> PyResult<ItemFields<'_>> {
        let [wid, rid, reply, hash] = &self.strs;
        Ok(ItemFields {
            work_item_id: wid.to_str()?,
            request_id: rid.to_str()?,
            item_index: self.item_index,
            reply_subject: reply.to_str()?,
            bundle_config_hash: hash.to_str()?,
            timestamp: self.timestamp,
        })
    }
}

/// Where a delivery's reply fields come from: its WorkItem's str objects, or (a `LazyDelivery`
/// whose item was never decoded) its payload in place.
enum ItemSource<'py> {
    Objects(ItemObjects<'py>),
    Lazy(InPlace<'py>),
}

impl<'py> ItemSource<'py> {
    fn read(delivery: &Bound<'py, PyAny>) -> PyResult<Self> {
        let py = delivery.py();
        if let Ok(lazy) = delivery.cast::<LazyDelivery>() {
            if let Some(view) = lazy.borrow().in_place(py) {
                return Ok(Self::Lazy(view));
            }
        }
        Ok(Self::Objects(ItemObjects::read(
            &delivery.getattr(intern!(py, "item"))?,
        )?))
    }

    fn fields(&self) -> PyResult<ItemFields<'_>> {
        match self {
            Self::Objects(o) => o.fields(),
            Self::Lazy(view) => {
                let (data, p) = (view.data(), &view.parsed);
                Ok(ItemFields {
                    work_item_id: p.str(data, lazy::WORK_ITEM_ID),
                    request_id: p.str(data, lazy::REQUEST_ID),
                    item_index: p.item_index,
                    reply_subject: p.str(data, lazy::REPLY_SUBJECT),
                    bundle_config_hash: p.str(data, lazy::BUNDLE_CONFIG_HASH),
                    timestamp: p.timestamp,
                })
            }
        }
    }

    fn request_id(self) -> Bound<'py, PyString> {
        match self {
            Self::Objects(o) => o.request_id(),
            Self::Lazy(view) => PyString::new(
                view.buffer.py(),
                view.parsed.str(view.data(), lazy::REQUEST_ID),
            ),
        }
    }
}

/// A delivery's JetStream ACK subject: its `Msg`'s `reply`, or (a scanned `LazyDelivery`, whose
/// `Msg` was never built) its span in the run buffer.
enum AckSubject<'py> {
    Str(Bound<'py, PyString>),
    Span(Bound<'py, PyBytes>, usize, usize),
}

impl<'py> AckSubject<'py> {
    fn of(delivery: &Bound<'py, PyAny>) -> PyResult<Self> {
        let py = delivery.py();
        if let Ok(lazy) = delivery.cast::<LazyDelivery>() {
            let lazy = lazy.borrow();
            if let Some(origin) = &lazy.origin {
                let (off, len) = origin.reply;
                return Ok(Self::Span(
                    lazy.buffer.bind(py).clone(),
                    off as usize,
                    (off + len) as usize,
                ));
            }
        }
        Ok(Self::Str(
            delivery
                .getattr(intern!(py, "msg"))?
                .getattr(intern!(py, "reply"))?
                .cast_into::<PyString>()?,
        ))
    }

    fn as_str(&self) -> PyResult<&str> {
        match self {
            Self::Str(s) => s.to_str(),
            Self::Span(buffer, start, end) => {
                let bytes: &[u8] = buffer.as_bytes();
                text(&bytes[*start..*end]).ok_or_else(|| {
                    pyo3::exceptions::PyValueError::new_err("ACK subject is not UTF-8")
                })
            }
        }
    }
}

/// The per-item fields of a WorkItem that a reply needs, borrowed from its `ItemObjects`.
struct ItemFields<'a> {
    work_item_id: &'a str,
    request_id: &'a str,
    item_index: u64,
    reply_subject: &'a str,
    bundle_config_hash: &'a str,
    timestamp: f64,
}

impl ItemFields<'_> {
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
    /// The reply subject the last ACK carries (confirmed ACKs), when one was asked for and written.
    pub ack_reply: Option<String>,
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

/// What a reply needs of one backend outcome, borrowed from an `ItemOutcome` or straight from
/// the RunBatch response bytes (`frame_batch_response`).
#[derive(Clone, Copy)]
struct OutcomeView<'a> {
    work_item_id: &'a str,
    disposition: &'a str,
    result_msgpack: &'a [u8],
    error: Option<&'a str>,
    error_code: Option<&'a str>,
    inference_ms: Option<f64>,
    tokenization_ms: Option<f64>,
    postprocessing_ms: Option<f64>,
    units: Option<Units>,
    /// Passed through to the WorkResult unchanged (newer than v0.7.1).
    retry_after_s: Option<u64>,
    has_raw_output: bool,
}

impl<'a> OutcomeView<'a> {
    fn of(py: Python<'a>, o: &'a ItemOutcome) -> PyResult<Self> {
        Ok(Self {
            work_item_id: &o.work_item_id,
            disposition: o.disposition.bind(py).cast::<PyString>()?.to_str()?,
            result_msgpack: o.result_msgpack.bind(py).as_bytes(),
            error: o.error.as_deref(),
            error_code: o.error_code.as_deref(),
            inference_ms: o.inference_ms,
            tokenization_ms: o.tokenization_ms,
            postprocessing_ms: o.postprocessing_ms,
            units: read_units(o.units.as_ref().map(|u| u.bind(py)))?,
            retry_after_s: o.retry_after_s,
            has_raw_output: o.raw_output.is_some(),
        })
    }
}

/// One reply of the batch, checked and measured in the first pass.
struct Planned<'a> {
    outcome: OutcomeView<'a>,
    item: ItemFields<'a>,
    success: bool,
    worker_direct: bool,
    payload_fetch_ms: Option<f64>,
    size: usize,
}

impl Planned<'_> {
    fn result<'a>(
        &'a self,
        worker_id: &'a str,
        current_hash: Option<&'a str>,
        now: f64,
    ) -> WorkResultRef<'a> {
        let o = &self.outcome;
        let f = &self.item;
        let success = self.success;
        WorkResultRef {
            work_item_id: f.work_item_id,
            request_id: f.request_id,
            item_index: f.item_index,
            success,
            result_msgpack: if success { o.result_msgpack } else { &[] },
            error: if success { None } else { o.error },
            error_code: if success { None } else { o.error_code },
            inference_ms: o.inference_ms,
            queue_ms: Some(f.queue_ms(now)),
            processing_ms: Some(0.0),
            worker_id: Some(worker_id),
            tokenization_ms: o.tokenization_ms,
            postprocessing_ms: o.postprocessing_ms,
            payload_fetch_ms: self.payload_fetch_ms,
            units: o.units,
            worker_direct: self.worker_direct,
            executed_bundle_config_hash: current_hash
                .filter(|h| !f.bundle_config_hash.is_empty() && f.bundle_config_hash == *h),
            retry_after_s: o.retry_after_s,
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

/// A confirmed ACK's reply subject must be one token of the protocol line (no whitespace).
fn checked_ack_reply(reply: Option<&str>) -> PyResult<Option<&str>> {
    match reply {
        Some(r) if !ack_subject_ok(r) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "ack_reply {r:?} is not a valid reply subject"
        ))),
        other => Ok(other),
    }
}

/// Frame every reply of a batch whose outcomes arrived in delivery order, or `None` when the
/// batch needs the general path. `deliveries` are objects with `.item` (a WorkItem) and
/// `.worker_direct` (and `.msg.reply`, the ACK subject, with `acks`); `now` is `time.time()`
/// for `queue_ms`. With `acks`, every delivery's ACK follows the replies in the same buffer, so
/// a batch settles with one write (the replies precede the ACKs on the connection).
#[pyfunction]
#[pyo3(signature = (deliveries, outcomes, *, worker_id, current_hash, now, max_payload, acks = false, ack_reply = None))]
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
    ack_reply: Option<&str>,
) -> PyResult<Option<FramedReplies>> {
    if outcomes.len() != deliveries.len() {
        return Ok(None);
    }
    let mut held: Vec<Bound<'_, ItemOutcome>> = Vec::with_capacity(outcomes.len());
    for outcome in outcomes.iter() {
        let Ok(outcome) = outcome.cast_into::<ItemOutcome>() else {
            return Ok(None);
        };
        held.push(outcome);
    }
    let mut views = Vec::with_capacity(held.len());
    for outcome in &held {
        views.push(OutcomeView::of(py, outcome.get())?);
    }
    let frame = Frame {
        worker_id,
        current_hash,
        now,
        max_payload,
        acks,
        ack_reply: checked_ack_reply(ack_reply)?,
    };
    Ok(frame
        .replies(py, deliveries, &views)?
        .map(|(replies, _)| replies))
}

/// The batch-wide inputs of a framing pass.
struct Frame<'a> {
    worker_id: &'a str,
    current_hash: Option<&'a str>,
    now: f64,
    max_payload: u64,
    acks: bool,
    /// Written on the last ACK (`PUB <subject> <reply> 4`): a confirmed ACK (bus.ack_confirm).
    ack_reply: Option<&'a str>,
}

impl Frame<'_> {
    /// The common path's check and framing over outcome views in delivery order.
    /// Also gives the items' `request_id` objects in delivery order (what the pipeline keys its
    /// per-request latencies by), read in the same pass.
    fn replies<'py>(
        &self,
        py: Python<'py>,
        deliveries: &Bound<'py, PyList>,
        outcomes: &[OutcomeView<'_>],
    ) -> PyResult<Option<(FramedReplies, Vec<Bound<'py, PyString>>)>> {
        let (worker_id, current_hash, now) = (self.worker_id, self.current_hash, self.now);
        let n = deliveries.len();
        if outcomes.len() != n {
            return Ok(None);
        }
        let mut ack_objects: Vec<AckSubject<'_>> =
            Vec::with_capacity(if self.acks { n } else { 0 });
        if self.acks {
            for delivery in deliveries.iter() {
                let subject = AckSubject::of(&delivery)?;
                if !ack_subject_ok(subject.as_str()?) {
                    return Ok(None); // the general path settles it one by one
                }
                ack_objects.push(subject);
            }
        }
        let ack_subjects: Vec<&str> = ack_objects
            .iter()
            .map(AckSubject::as_str)
            .collect::<PyResult<_>>()?;
        let objects: Vec<ItemSource<'_>> = deliveries
            .iter()
            .map(|d| ItemSource::read(&d))
            .collect::<PyResult<_>>()?;
        let mut planned: Vec<Planned<'_>> = Vec::with_capacity(n);
        let mut sent = vec![0u8; n];
        let (mut total, mut payload_bytes) = (0usize, 0usize);
        for (i, ((delivery, o), objs)) in deliveries
            .iter()
            .zip(outcomes.iter())
            .zip(&objects)
            .enumerate()
        {
            let item = objs.fields()?;
            if o.work_item_id != item.work_item_id || o.has_raw_output {
                return Ok(None);
            }
            let success = match o.disposition {
                "publish_and_ack" if !o.result_msgpack.is_empty() => true,
                "publish_error_and_ack" => false,
                _ => return Ok(None), // nak_retry, or a success the sidecar must frame
            };
            if item.reply_subject.chars().all(py_space) {
                continue; // fire-and-forget: nothing to send, and it counts as published
            }
            let worker_direct = delivery.getattr(intern!(py, "worker_direct"))?.extract()?;
            // §6.1: written only when a payload was actually fetched for this item.
            let fetch_ms: f64 = match delivery.getattr(intern!(py, "payload_fetch_ms")) {
                Ok(v) => v.extract()?,
                Err(_) => 0.0,
            };
            let mut p = Planned {
                outcome: *o,
                item,
                success,
                worker_direct,
                payload_fetch_ms: (fetch_ms > 0.0).then_some(fetch_ms),
                size: 0,
            };
            let mut size = Counter::default();
            encode_work_result(&mut size, &p.result(worker_id, current_hash, now));
            if size.0 as u64 > self.max_payload {
                return Ok(None); // ResultChunkV1 or the compact PAYLOAD_TOO_LARGE error
            }
            p.size = size.0;
            total += pub_header_len(p.item.reply_subject, size.0) + size.0 + 2;
            payload_bytes += size.0;
            sent[i] = 1;
            planned.push(p);
        }
        let reply = self.ack_reply.filter(|_| !ack_subjects.is_empty());
        for subject in &ack_subjects {
            total += pub_header_len(subject, ACK_PAYLOAD.len()) + ACK_PAYLOAD.len() + 2;
        }
        if let Some(reply) = reply {
            total += reply.len() + 1; // " <reply>" in the last ACK's header
        }
        // Written once, not zero-filled first: the whole batch's PUB stream (~100 KB for 64
        // embeddings) passes through the cache one time fewer.
        let buffer = new_bytes(py, total, |w| {
            for p in &planned {
                write_pub_header(w, p.item.reply_subject, p.size);
                encode_work_result(w, &p.result(worker_id, current_hash, now));
                w.extend_from_slice(b"\r\n");
            }
            let last = ack_subjects.len().saturating_sub(1);
            for (k, subject) in ack_subjects.iter().enumerate() {
                match reply {
                    Some(reply) if k == last => {
                        write_pub_header(w, &format!("{subject} {reply}"), ACK_PAYLOAD.len())
                    }
                    _ => write_pub_header(w, subject, ACK_PAYLOAD.len()),
                }
                w.extend_from_slice(ACK_PAYLOAD);
                w.extend_from_slice(b"\r\n");
            }
            Ok(())
        })?;
        let replies = FramedReplies {
            buffer: buffer.unbind(),
            sent: PyBytes::new(py, &sent).unbind(),
            messages: planned.len(),
            payload_bytes,
            acks: ack_subjects.len(),
            ack_reply: reply.map(str::to_owned),
        };
        drop(planned);
        let request_ids = objects.into_iter().map(|o| o.request_id()).collect();
        Ok(Some((replies, request_ids)))
    }
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

/// A RunBatch response framed straight into replies (`frame_batch_response`), with what the
/// pipeline learns from it: the first outcome's `inference_ms`, per delivery whether it
/// succeeded (`1`), the quantum controller's samples (inference + postprocessing ms of each
/// success that was sent) and every delivery's `request_id`, in delivery order.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct FramedResponse {
    pub replies: Py<FramedReplies>,
    pub inference_ms: Option<f64>,
    pub success: Py<PyBytes>,
    pub totals: Py<PyList>,
    pub request_ids: Py<PyList>,
}

/// One outcome of a BatchOutcome read in place; `None` for anything the common path does not
/// take (a missing or unknown field value, `raw_output`, a `result_msgpack` given as an array,
/// a decode error): `decode_batch_outcome` then decides, errors included.
fn view_at<'a>(r: &mut Reader<'a>) -> Option<OutcomeView<'a>> {
    let n = r.read_map_len("ItemOutcome").ok()?;
    let (mut work_item_id, mut request_id, mut item_index, mut disposition) =
        (None, None, None, None);
    let mut v = OutcomeView {
        work_item_id: "",
        disposition: "",
        result_msgpack: &[],
        error: None,
        error_code: None,
        inference_ms: None,
        tokenization_ms: None,
        postprocessing_ms: None,
        units: None,
        retry_after_s: None,
        has_raw_output: false,
    };
    for _ in 0..n {
        let key = r.read_key().ok()?;
        match key {
            b"work_item_id" => work_item_id = Some(r.read_str("work_item_id").ok()?),
            b"request_id" => request_id = Some(r.read_str("request_id").ok()?),
            b"item_index" => item_index = Some(r.read_uint("item_index").ok()?),
            b"disposition" => {
                let d = r.read_str("disposition").ok()?;
                if !["publish_and_ack", "publish_error_and_ack", "nak_retry"].contains(&d) {
                    return None;
                }
                disposition = Some(d);
            }
            b"nak_delay_ms" => {
                r.read_opt_uint("count").ok()?;
            }
            b"retry_after_s" => v.retry_after_s = r.read_opt_uint("retry_after_s").ok()?,
            b"result_msgpack" => {
                v.result_msgpack = match r.next_token().ok()? {
                    Token::Nil => &[],
                    Token::Bin(b) | Token::Str(b) => b,
                    _ => return None,
                }
            }
            b"error" => v.error = r.read_opt_str("error").ok()?,
            b"error_code" => v.error_code = r.read_opt_str("error_code").ok()?,
            b"inference_ms" => v.inference_ms = r.read_opt_float("inference_ms").ok()?,
            b"tokenization_ms" => v.tokenization_ms = r.read_opt_float("tokenization_ms").ok()?,
            b"postprocessing_ms" => {
                v.postprocessing_ms = r.read_opt_float("postprocessing_ms").ok()?
            }
            b"raw_output" => {
                if !r.peek_nil() {
                    return None;
                }
                r.skip_value().ok()?;
            }
            b"units" => v.units = unit_counts(r).ok()?,
            _ => {
                utf8_key(key)?;
                r.skip_value().ok()?;
            }
        }
    }
    let (Some(w), Some(_), Some(_), Some(d)) = (work_item_id, request_id, item_index, disposition)
    else {
        return None;
    };
    v.work_item_id = w;
    v.disposition = d;
    Some(v)
}

/// `Some` for a key that is valid UTF-8 (anything else: the general path decides what it means).
/// Only a key matched against no known name is checked: a known name is ASCII, so bytes equal to
/// it are valid as they are. Checking every key was ~13 UTF-8 validations an item, ~1,300
/// instructions (docs/benchmarks.md).
fn utf8_key(key: &[u8]) -> Option<()> {
    valid_utf8(key).then_some(())
}

/// The outcomes of a BatchOutcome in place, or `None` when the general path must decide (no
/// `outcomes`, batched f16 multivectors present, anything `view_at` does not take).
fn views_of(bytes: &[u8]) -> Option<Vec<OutcomeView<'_>>> {
    let mut r = Reader::new(bytes);
    let n = r.read_map_len("BatchOutcome").ok()?;
    let mut views = None;
    for _ in 0..n {
        let key = r.read_key().ok()?;
        match key {
            b"outcomes" => {
                let Token::Array(count) = r.next_token().ok()? else {
                    return None;
                };
                let mut list = Vec::with_capacity(count);
                for _ in 0..count {
                    list.push(view_at(&mut r)?);
                }
                views = Some(list);
            }
            b"batched_f16_multivectors" => match r.next_token().ok()? {
                Token::Nil | Token::Array(0) => {}
                _ => return None,
            },
            _ => {
                utf8_key(key)?;
                r.skip_value().ok()?;
            }
        }
    }
    r.finish().ok()?;
    views
}

/// Frame the replies of a RunBatch response (the BatchOutcome body) without making an
/// `ItemOutcome` per item: the common path of `frame_outcome_replies` over outcomes read in
/// place. `None` whenever `decode_batch_outcome` + the general path must decide (errors too).
#[pyfunction]
#[pyo3(signature = (response, deliveries, *, worker_id, current_hash, now, max_payload, acks = false, ack_reply = None))]
#[allow(clippy::too_many_arguments)]
pub fn frame_batch_response(
    py: Python<'_>,
    response: &Bound<'_, PyAny>,
    deliveries: &Bound<'_, PyList>,
    worker_id: &str,
    current_hash: Option<&str>,
    now: f64,
    max_payload: u64,
    acks: bool,
    ack_reply: Option<&str>,
) -> PyResult<Option<FramedResponse>> {
    with_bytes(response, |bytes| {
        let Some(views) = views_of(bytes) else {
            return Ok(None);
        };
        let frame = Frame {
            worker_id,
            current_hash,
            now,
            max_payload,
            acks,
            ack_reply: checked_ack_reply(ack_reply)?,
        };
        let Some((replies, request_ids)) = frame.replies(py, deliveries, &views)? else {
            return Ok(None);
        };
        let sent = replies.sent.bind(py).as_bytes();
        let success: Vec<u8> = views
            .iter()
            .map(|v| u8::from(v.disposition == "publish_and_ack"))
            .collect();
        let totals = PyList::empty(py);
        for ((v, ok), s) in views.iter().zip(&success).zip(sent) {
            if *ok == 1 && *s == 1 {
                totals
                    .append(v.inference_ms.unwrap_or(0.0) + v.postprocessing_ms.unwrap_or(0.0))?;
            }
        }
        Ok(Some(FramedResponse {
            replies: Py::new(py, replies)?,
            inference_ms: views.first().and_then(|v| v.inference_ms),
            success: PyBytes::new(py, &success).unbind(),
            totals: totals.unbind(),
            request_ids: PyList::new(py, request_ids)?.unbind(),
        }))
    })
}
