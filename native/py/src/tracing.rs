//! Batch spans built by the compiled core (`otel.tracer`; the twin is `_twins.tracing`): one
//! `sidecar.dispatch` span per batch RPC (sidecar-behaviour §5.4), sampled once per batch.
//!
//! Why here: with every batch traced, the Python tracer spent ~25,000 instructions a batch building
//! the span and its record, and the SDK's processor path another ~30,000 building a `ReadableSpan`
//! per record (docs/benchmarks.md, "Tracing built by the compiled core"). A `BatchSpan` is the
//! span while it runs and, once ended, the finished record itself: the buffer, the SDK's batch
//! processor and the compiled OTLP encoder (`otlp.rs`) all take it as it is, so nothing is copied
//! into Python objects unless a test or the SDK's own encoder reads a field.
//!
//! Sampling is the Python `otel.tracing.Sampler`'s, read once when the tracer is made. Ids come
//! from a per-tracer wyrand generator seeded from the OS (std's `RandomState`), the time and the
//! pid: a forked child must make its own tracer (the sidecar never forks after start-up).

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyString, PyTuple};

use sie_core::otlp::{parse_traceparent, Value, KIND_CONSUMER};

use sie_core::otlp_direct::{SpanFields, BATCH_COST_KEY, BATCH_SIZE_KEY};

use crate::clock::unix_now_ns;
use crate::otlp::value_of;
use crate::run_batch::for_each_traceparent;
use crate::text::text;

/// sidecar-behaviour §5.4: the batch span's name.
const SPAN_NAME: &str = "sidecar.dispatch";
/// `otel.tracing.SAMPLED`: the flags of the context the backend is given.
const SAMPLED: u8 = 0x01;

/// wyrand: 64 bits a call, good enough for ids and the ratio samplers' draws (not for secrets).
struct Ids(u64);

impl Ids {
    fn seeded() -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(unix_now_ns());
        h.write_u32(std::process::id());
        Ids(h.finish())
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Never zero (an all-zero id is invalid in W3C and OTLP).
    fn span_id(&mut self) -> u64 {
        loop {
            let v = self.next_u64();
            if v != 0 {
                return v;
            }
        }
    }

    fn trace_id(&mut self) -> u128 {
        loop {
            let v = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
            if v != 0 {
                return v;
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Root {
    On,
    Off,
    /// Sampled when the trace id's low 64 bits are below this (`Sampler._bound`, up to 2^64).
    Ratio(u128),
}

impl Root {
    fn sampled(self, trace_id: u128) -> bool {
        match self {
            Root::On => true,
            Root::Off => false,
            Root::Ratio(bound) => (trace_id & u128::from(u64::MAX)) < bound,
        }
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The low `out.len()` hex digits of `value`, lowercase, zero-padded (`core::fmt` took ~3,500
/// instructions for a traceparent, written once a traced batch).
fn put_hex(out: &mut [u8], mut value: u128) {
    for digit in out.iter_mut().rev() {
        *digit = HEX_DIGITS[(value & 0xf) as usize];
        value >>= 4;
    }
}

fn hex(value: u128, digits: usize) -> String {
    let mut out = vec![0u8; digits];
    put_hex(&mut out, value);
    String::from_utf8(out).unwrap_or_default()
}

/// `00-{trace_id:032x}-{span_id:016x}-{flags:02x}`, the W3C form.
fn traceparent_bytes(trace_id: u128, span_id: u64, flags: u8) -> [u8; 55] {
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    put_hex(&mut out[3..35], trace_id);
    put_hex(&mut out[36..52], u128::from(span_id));
    put_hex(&mut out[53..55], u128::from(flags));
    out
}

#[cfg(test)]
fn traceparent(trace_id: u128, span_id: u64, flags: u8) -> String {
    String::from_utf8(traceparent_bytes(trace_id, span_id, flags).to_vec()).unwrap_or_default()
}

/// The event names the dispatcher stamps, borrowed instead of allocated per span.
const KNOWN_EVENTS: [&str; 3] = ["ipc.request", "ipc.response", "published"];

fn event_name(name: &str) -> Cow<'static, str> {
    KNOWN_EVENTS
        .iter()
        .find(|known| **known == name)
        .map_or_else(
            || Cow::Owned(name.to_owned()),
            |known| Cow::Borrowed(*known),
        )
}

/// The attributes every span of one (model, operation) shares: lane, operation, model, profile.
type SharedAttributes = Arc<[(String, Value)]>;

/// At most this many (model, operation) pairs keep their shared attributes; past it each span
/// builds its own (a sidecar serves a handful of models).
const MAX_SHARED: usize = 256;

/// The distinct non-empty `traceparent` strings of `items` (the items, or the contexts
/// themselves), in order.
fn distinct_contexts(py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let mut contexts: Vec<String> = Vec::new();
    for_each_traceparent(py, items, |s| add_distinct(&mut contexts, s))?;
    Ok(contexts)
}

/// `context` appended to `contexts` unless it is empty or already there (`distinct_contexts`, and
/// `columns::run_batch_columns` gathering them for `start_batch`).
pub(crate) fn add_distinct(contexts: &mut Vec<String>, context: &str) {
    if !context.is_empty() && !contexts.iter().any(|c| c == context) {
        contexts.push(context.to_owned());
    }
}

fn value_to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Double(d) => PyFloat::new(py, *d).into_any(),
    })
}

/// Starts batch spans, or not: the sampler decides once per batch, before any per-item work.
#[pyclass(module = "sie_sidecar._native", name = "BatchTracer")]
pub struct BatchTracer {
    sampler: Py<PyAny>,
    /// Where each span goes as it ends: its `forward` when set, else its `add`.
    buffer: Py<PyAny>,
    lane: String,
    root: Root,
    parent_based: bool,
    never: bool,
    ids: Ids,
    /// (model as given, operation) → the spans' shared attributes, built on first use.
    shared: Vec<(String, String, SharedAttributes)>,
}

impl BatchTracer {
    fn shared_attributes(&mut self, model: &str, operation: &str) -> SharedAttributes {
        if let Some((_, _, found)) = self
            .shared
            .iter()
            .find(|(m, o, _)| m == model && o == operation)
        {
            return Arc::clone(found);
        }
        let (base, profile) = match model.split_once(':') {
            Some((base, profile)) => (
                base,
                if profile.is_empty() {
                    "default"
                } else {
                    profile
                },
            ),
            None => (model, "default"),
        };
        let attributes: SharedAttributes = Arc::from(vec![
            ("lane".to_owned(), Value::String(self.lane.clone())),
            ("operation".to_owned(), Value::String(operation.to_owned())),
            ("model".to_owned(), Value::String(base.to_owned())),
            ("profile".to_owned(), Value::String(profile.to_owned())),
        ]);
        if self.shared.len() < MAX_SHARED {
            self.shared.push((
                model.to_owned(),
                operation.to_owned(),
                Arc::clone(&attributes),
            ));
        }
        attributes
    }
}

#[pymethods]
impl BatchTracer {
    #[new]
    #[pyo3(signature = (sampler, buffer, *, lane = "other".to_owned()))]
    fn new(sampler: &Bound<'_, PyAny>, buffer: &Bound<'_, PyAny>, lane: String) -> PyResult<Self> {
        let name: String = sampler.getattr("name")?.extract()?;
        let (parent_based, root_name) = match name.strip_prefix("parentbased_") {
            Some(rest) => (true, rest),
            None => (false, name.as_str()),
        };
        let root = match root_name {
            "always_on" => Root::On,
            "always_off" => Root::Off,
            "traceidratio" => Root::Ratio(sampler.getattr("_bound")?.extract()?),
            _ => return Err(PyValueError::new_err(format!("unknown sampler {name:?}"))),
        };
        let never = !parent_based && matches!(root, Root::Off | Root::Ratio(0));
        buffer.getattr("add")?; // a buffer that cannot keep a span is refused here, not at a span's end
        Ok(BatchTracer {
            sampler: sampler.clone().unbind(),
            buffer: buffer.clone().unbind(),
            lane,
            root,
            parent_based,
            never,
            ids: Ids::seeded(),
            shared: Vec::new(),
        })
    }

    #[getter]
    fn sampler(&self, py: Python<'_>) -> Py<PyAny> {
        self.sampler.clone_ref(py)
    }

    #[getter]
    fn buffer(&self, py: Python<'_>) -> Py<PyAny> {
        self.buffer.clone_ref(py)
    }

    /// No batch is ever sampled (the items' contexts need not even be read).
    #[getter]
    fn never(&self) -> bool {
        self.never
    }

    /// The `sidecar.dispatch` span of a batch about to be sent, or None when it is not sampled.
    /// `traceparents`: the items (their contexts read in place) or the contexts themselves; the
    /// first valid one is the parent, the other distinct ones links. `model` may be
    /// `model:profile` (the profile attribute is its suffix, else `default`).
    #[pyo3(signature = (model, operation, size, cost, traceparents = None))]
    fn start_batch(
        &mut self,
        py: Python<'_>,
        model: &str,
        operation: &str,
        size: i64,
        cost: i64,
        traceparents: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<BatchSpan>> {
        if self.never {
            return Ok(None);
        }
        let mut contexts = match traceparents {
            Some(items) => distinct_contexts(py, items)?,
            None => Vec::new(),
        };
        let parent = contexts.iter().enumerate().find_map(|(i, c)| {
            parse_traceparent(c).map(|(trace, span)| (i, trace, span, c.as_bytes()[54]))
        });
        let (trace_id, parent_span) = match parent {
            None => {
                let trace_id = self.ids.trace_id();
                if !self.root.sampled(trace_id) {
                    return Ok(None);
                }
                (trace_id, None)
            }
            Some((i, trace, span, flags_low)) => {
                let trace_id = u128::from_be_bytes(trace);
                let sampled = if self.parent_based {
                    // The flags' low hex digit holds the sampled bit (bit 0).
                    let digit = char::from(flags_low).to_digit(16).unwrap_or(0);
                    digit & 1 == 1
                } else {
                    self.root.sampled(trace_id)
                };
                if !sampled {
                    return Ok(None);
                }
                contexts.remove(i); // the parent is not also a link
                (trace_id, Some(u64::from_be_bytes(span)))
            }
        };
        Ok(Some(BatchSpan {
            trace_id,
            span_id: self.ids.span_id(),
            parent_span,
            start_ns: unix_now_ns(),
            end_ns: 0,
            shared: self.shared_attributes(model, operation),
            batch: Some((size, cost)),
            attributes: Vec::new(),
            events: Vec::with_capacity(KNOWN_EVENTS.len()),
            links: contexts,
            error: None,
            sink: Some(self.buffer.clone_ref(py)),
        }))
    }
}

/// One batch's span while it runs (`event`, `attribute`, `end`) and, once ended, its finished
/// record (the fields of `otel.tracing.SpanRecord`). Its context goes to the backend in every
/// RunBatchItem (`wire_context`); its links are the items' own contexts, kept as their distinct
/// strings and parsed by the encoder.
#[pyclass(module = "sie_sidecar._native", name = "BatchSpan")]
pub struct BatchSpan {
    trace_id: u128,
    span_id: u64,
    parent_span: Option<u64>,
    start_ns: u64,
    end_ns: u64,
    /// Lane, operation, model and profile, shared with the other spans of the same pair; then
    /// the batch's size and cost; then what `attribute` set (`SpanFields`' order). A span holds
    /// no string of its own unless `attribute` or an unknown event name gives it one.
    shared: SharedAttributes,
    batch: Option<(i64, i64)>,
    attributes: Vec<(String, Value)>,
    events: Vec<(Cow<'static, str>, u64)>,
    links: Vec<String>,
    error: Option<String>,
    /// The tracer's buffer, where the span goes when it ends; None once it has.
    sink: Option<Py<PyAny>>,
}

impl BatchSpan {
    /// Every attribute, in `SpanFields`' order, as owned pairs.
    fn own_attributes(&self) -> Vec<(String, Value)> {
        let mut own = Vec::new();
        self.fields()
            .for_each_attribute(|k, v| own.push((k.to_owned(), v.clone())));
        own
    }

    /// The span's fields as the direct OTLP writer reads them (`sie_core::otlp_direct`).
    pub fn fields(&self) -> SpanFields<'_> {
        SpanFields {
            trace_id: self.trace_id.to_be_bytes(),
            span_id: self.span_id.to_be_bytes(),
            parent_span_id: self.parent_span.map(u64::to_be_bytes),
            name: SPAN_NAME,
            kind: KIND_CONSUMER,
            start_time_unix_nano: self.start_ns,
            end_time_unix_nano: self.end_ns,
            attributes: &self.shared,
            batch: self.batch,
            more_attributes: &self.attributes,
            events: &self.events,
            links: &self.links,
            error: self.error.as_deref(),
        }
    }
}

#[pymethods]
impl BatchSpan {
    #[getter]
    fn trace_id(&self) -> String {
        hex(self.trace_id, 32)
    }

    #[getter]
    fn span_id(&self) -> String {
        hex(u128::from(self.span_id), 16)
    }

    /// The remote parent's span id, "" for a root span.
    #[getter]
    fn parent_span_id(&self) -> String {
        self.parent_span
            .map_or_else(String::new, |p| hex(u128::from(p), 16))
    }

    #[getter]
    fn name(&self) -> &'static str {
        SPAN_NAME
    }

    #[getter]
    fn kind(&self) -> &'static str {
        "consumer"
    }

    #[getter]
    fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// 0 until the span ends.
    #[getter]
    fn end_ns(&self) -> u64 {
        self.end_ns
    }

    #[getter]
    fn attributes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let pairs = self
            .own_attributes()
            .iter()
            .map(|(k, v)| PyTuple::new(py, [PyString::new(py, k).into_any(), value_to_py(py, v)?]))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, pairs)
    }

    #[getter]
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let pairs = self
            .events
            .iter()
            .map(|(name, at)| (name.as_ref(), *at).into_pyobject(py))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, pairs)
    }

    /// The items' distinct `traceparent` strings, unparsed, the parent's excepted.
    #[getter]
    fn links<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.links.iter().map(String::as_str))
    }

    /// None: status unset (the batch ran); else the ERROR status' message.
    #[getter]
    fn error(&self) -> Option<String> {
        self.error.clone()
    }

    /// (traceparent, tracestate) for the backend: this span, sampled; no tracestate.
    #[getter]
    fn wire_context<'py>(&self, py: Python<'py>) -> (Bound<'py, PyString>, Option<String>) {
        let context = traceparent_bytes(self.trace_id, self.span_id, SAMPLED);
        // Hex digits and dashes only: ASCII, read as it is.
        (PyString::new(py, text(&context).unwrap_or_default()), None)
    }

    /// Links to these contexts instead (distinct non-empty strings, in order; unparsed).
    fn link(&mut self, py: Python<'_>, traceparents: &Bound<'_, PyAny>) -> PyResult<()> {
        self.links = distinct_contexts(py, traceparents)?;
        Ok(())
    }

    /// A named moment of the batch (`ipc.request`, `published`...), stamped now.
    fn event(&mut self, name: &str) {
        if self.sink.is_some() {
            self.events.push((event_name(name), unix_now_ns()));
        }
    }

    /// Set an attribute (a repeated key keeps its place and takes the new value).
    fn attribute(&mut self, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_of(value)?;
        if self.sink.is_none() {
            return Ok(());
        }
        let shared_key = self.shared.iter().any(|(k, _)| *k == key)
            || (self.batch.is_some() && (key == BATCH_SIZE_KEY || key == BATCH_COST_KEY));
        if shared_key {
            // Set again: this span takes its own copy of every attribute, in order.
            self.attributes = self.own_attributes();
            self.shared = Arc::from(Vec::new());
            self.batch = None;
        }
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(pair) => pair.1 = value,
            None => self.attributes.push((key, value)),
        }
        Ok(())
    }

    /// Finish the span (status ERROR with `error` when the batch RPC failed) into the tracer's
    /// buffer. Once: a second call, and events or attributes after the first, change nothing.
    #[pyo3(signature = (error = None))]
    fn end(slf: &Bound<'_, Self>, error: Option<String>) -> PyResult<()> {
        let sink = {
            let mut this = slf.borrow_mut();
            let Some(sink) = this.sink.take() else {
                return Ok(());
            };
            this.end_ns = unix_now_ns();
            this.error = error;
            sink
        };
        // Straight to where the buffer forwards (the SDK's processor once it is loaded): the
        // buffer's `add` would be one Python frame a batch more. A buffer without `forward`, or
        // not attached, keeps the span through `add`.
        let py = slf.py();
        let buffer = sink.bind(py);
        match buffer.getattr(intern!(py, "forward")) {
            Ok(forward) if !forward.is_none() => forward.call1((slf,))?,
            _ => buffer.call_method1(intern!(py, "add"), (slf,))?,
        };
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "BatchSpan(trace_id={:032x}, span_id={:016x}, ended={})",
            self.trace_id,
            self.span_id,
            self.sink.is_none()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_zero_and_differ() {
        let mut ids = Ids(0);
        let a = ids.span_id();
        let b = ids.span_id();
        assert!(a != 0 && b != 0 && a != b);
        assert_ne!(ids.trace_id(), 0);
    }

    #[test]
    fn the_ratio_root_compares_the_low_64_bits() {
        let root = Root::Ratio(1 << 63);
        assert!(root.sampled((u128::MAX << 64) | 5));
        assert!(!root.sampled(u128::from(u64::MAX)));
        assert!(Root::Ratio(1 << 64).sampled(u128::MAX));
        assert!(!Root::Ratio(0).sampled(0));
    }

    #[test]
    fn hex_digits_match_core_fmt() {
        let mut ids = Ids(42);
        for round in 0..2_000u32 {
            let trace_id = match round {
                0 => 0,
                1 => u128::MAX,
                _ => ids.trace_id() >> (round % 128),
            };
            let span_id = ids.next_u64() >> (round % 64);
            let flags = (round % 256) as u8;
            assert_eq!(
                traceparent(trace_id, span_id, flags),
                format!("00-{trace_id:032x}-{span_id:016x}-{flags:02x}")
            );
            assert_eq!(hex(trace_id, 32), format!("{trace_id:032x}"));
            assert_eq!(hex(u128::from(span_id), 16), format!("{span_id:016x}"));
        }
    }

    #[test]
    fn known_event_names_are_borrowed_and_others_kept() {
        assert!(matches!(
            event_name("published"),
            Cow::Borrowed("published")
        ));
        assert!(matches!(
            event_name("ipc.request"),
            Cow::Borrowed("ipc.request")
        ));
        assert!(matches!(event_name("ipc.requestX"), Cow::Owned(ref s) if s == "ipc.requestX"));
        assert!(matches!(event_name(""), Cow::Owned(ref s) if s.is_empty()));
    }

    #[test]
    fn a_traceparent_is_formatted_as_w3c_writes_it() {
        assert_eq!(
            traceparent(1, 2, SAMPLED),
            "00-00000000000000000000000000000001-0000000000000002-01"
        );
    }
}
