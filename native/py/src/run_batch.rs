//! The RunBatchRequest body in one pass (wire-protocol §3.10, §4.1-4.3): what
//! `ipc.requests.run_batch_body_py` builds as dicts and packs, written straight into one buffer.
//!
//! A WorkItem decoded natively carries its payload (`raw`) and a span table (`spans`, see
//! `workitem.rs`): the values the item bodies copy verbatim (item, options, score_items, trace
//! context...) are spliced from there as encoded bytes. A WorkItem without them (the twin decoder,
//! or one whose fields changed after decoding, which must drop `raw`) is written from its attributes.
//! Scalars the body normalises (ids, indexes, `float(timestamp)`, `profile_id or None`...) always
//! come from the attributes.

use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyString};

use sie_core::msgpack::{
    write_array_header, write_bool, write_f64, write_map_header, write_nil, write_opt_str,
    write_str, write_uint, Reader,
};

use crate::lazy::{self, LazyDelivery, Parsed};
use crate::pack::{float_of, pack};
use crate::request_body::{RequestBody, ENVELOPE_ROOM};
use crate::workitem::{SPANS_LEN, SPAN_COUNT, SPLICED};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Encode,
    Score,
    Extract,
}

// Span-table slots (the order of `SPLICED`).
const ITEM: usize = 0;
const OUTPUT_TYPES: usize = 1;
const INSTRUCTION: usize = 2;
const OPTIONS: usize = 3;
const QUERY_ITEM: usize = 4;
const SCORE_ITEMS: usize = 5;
const LABELS: usize = 6;
const OUTPUT_SCHEMA: usize = 7;
const TRACEPARENT: usize = 8;
/// msgpack nil.
const NIL: u8 = 0xc0;
const TRACESTATE: usize = 9;

/// The attributes read from every WorkItem, after the `SPLICED` ones.
const SCALARS: [&str; 10] = [
    "work_item_id",
    "request_id",
    "item_index",
    "total_items",
    "timestamp",
    "is_query",
    "profile_id",
    "bundle_config_hash",
    "raw",
    "spans",
];
const WORK_ITEM_ID: usize = SPAN_COUNT;
const REQUEST_ID: usize = SPAN_COUNT + 1;
const ITEM_INDEX: usize = SPAN_COUNT + 2;
const TOTAL_ITEMS: usize = SPAN_COUNT + 3;
const TIMESTAMP: usize = SPAN_COUNT + 4;
const IS_QUERY: usize = SPAN_COUNT + 5;
const PROFILE_ID: usize = SPAN_COUNT + 6;
const BUNDLE_CONFIG_HASH: usize = SPAN_COUNT + 7;
const RAW: usize = SPAN_COUNT + 8;
const SPANS: usize = SPAN_COUNT + 9;

static NAMES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();

fn names(py: Python<'_>) -> &Vec<Py<PyString>> {
    NAMES.get_or_init(py, || {
        SPLICED
            .iter()
            .chain(SCALARS.iter())
            .map(|n| PyString::intern(py, n).unbind())
            .collect()
    })
}

/// Where one item's spliced values come from.
enum Source<'a> {
    /// The encoded values in the payload, by span (length 0: the key was absent).
    Raw(&'a [u8], [(usize, usize); SPAN_COUNT]),
    /// The WorkItem's attributes (re-encoded).
    Attrs,
}

impl<'a> Source<'a> {
    /// The payload spans, when `raw` and `spans` are present and consistent; else `Attrs`.
    fn of(raw: &'a Bound<'_, PyAny>, spans: &Bound<'_, PyAny>) -> Self {
        let (Ok(raw), Ok(spans)) = (raw.cast::<PyBytes>(), spans.cast::<PyBytes>()) else {
            return Source::Attrs;
        };
        let (raw, table) = (raw.as_bytes(), spans.as_bytes());
        if table.len() != SPANS_LEN {
            return Source::Attrs;
        }
        let mut out = [(0usize, 0usize); SPAN_COUNT];
        for (slot, pair) in out.iter_mut().zip(table.chunks_exact(8)) {
            let off = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]) as usize;
            let len = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]) as usize;
            if off.checked_add(len).is_none_or(|end| end > raw.len()) {
                return Source::Attrs;
            }
            *slot = (off, len);
        }
        Source::Raw(raw, out)
    }
}

/// One WorkItem while its RunBatchItem is written.
struct Item<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    names: &'a [Py<PyString>],
    source: Source<'a>,
    ids: Ids<'py>,
}

impl<'py> Item<'_, 'py> {
    fn attr(&self, i: usize) -> PyResult<Bound<'py, PyAny>> {
        self.obj.getattr(self.names[i].bind(self.obj.py()))
    }

    fn write_attr(&self, out: &mut Vec<u8>, i: usize) -> PyResult<()> {
        pack(out, &self.attr(i)?)
    }

    /// A spliced value: its payload bytes, or its attribute re-encoded. `score_items` is `[]` when
    /// absent or nil, every other one nil.
    fn write_spliced(&self, out: &mut Vec<u8>, slot: usize) -> PyResult<()> {
        let empty_list = slot == SCORE_ITEMS;
        match &self.source {
            Source::Raw(raw, spans) => {
                let (off, len) = spans[slot];
                write_raw_value(out, &raw[off..off + len], slot);
                Ok(())
            }
            Source::Attrs => {
                let value = self.attr(slot)?;
                if empty_list && value.is_none() {
                    write_array_header(out, 0);
                    Ok(())
                } else {
                    pack(out, &value)
                }
            }
        }
    }

    fn write_float(&self, out: &mut Vec<u8>, i: usize) -> PyResult<()> {
        write_f64(out, float_of(&self.attr(i)?)?);
        Ok(())
    }
}

/// The values of one RunBatchItem, wherever they come from: a WorkItem's attributes and payload
/// (`Item`), or a `LazyDelivery`'s payload read in place (`InPayload`). `write_item` is the one
/// statement of the layout.
trait Values {
    /// `work_item_id`, `request_id` and `item_index`, keys included (the wrapper and the body both carry them).
    fn ids(&self, out: &mut Vec<u8>) -> PyResult<()>;
    /// `total_items` and `float(timestamp)`, keys included.
    fn total_and_timestamp(&self, out: &mut Vec<u8>) -> PyResult<()>;
    /// A spliced value (`SPLICED` slot): `score_items` is `[]` when absent or nil, any other nil.
    fn spliced(&self, out: &mut Vec<u8>, slot: usize) -> PyResult<()>;
    fn is_query(&self, out: &mut Vec<u8>) -> PyResult<()>;
    /// `value or None` of `profile_id` (`profile`) or `bundle_config_hash`.
    fn or_none(&self, out: &mut Vec<u8>, profile: bool) -> PyResult<()>;
}

impl Values for Item<'_, '_> {
    fn ids(&self, out: &mut Vec<u8>) -> PyResult<()> {
        let ids = &self.ids;
        write_str(out, "work_item_id");
        pack(out, &ids.work_item_id)?;
        write_str(out, "request_id");
        pack(out, &ids.request_id)?;
        write_str(out, "item_index");
        pack(out, &ids.item_index)
    }

    fn total_and_timestamp(&self, out: &mut Vec<u8>) -> PyResult<()> {
        write_str(out, "total_items");
        self.write_attr(out, TOTAL_ITEMS)?;
        write_str(out, "timestamp");
        self.write_float(out, TIMESTAMP)
    }

    fn spliced(&self, out: &mut Vec<u8>, slot: usize) -> PyResult<()> {
        self.write_spliced(out, slot)
    }

    fn is_query(&self, out: &mut Vec<u8>) -> PyResult<()> {
        self.write_attr(out, IS_QUERY)
    }

    fn or_none(&self, out: &mut Vec<u8>, profile: bool) -> PyResult<()> {
        let value = self.attr(if profile {
            PROFILE_ID
        } else {
            BUNDLE_CONFIG_HASH
        })?;
        if value.is_truthy()? {
            pack(out, &value)
        } else {
            write_nil(out);
            Ok(())
        }
    }
}

/// A `LazyDelivery`'s payload read in place (its WorkItem was never decoded).
struct InPayload<'a> {
    data: &'a [u8],
    parsed: &'a Parsed,
}

impl Values for InPayload<'_> {
    fn ids(&self, out: &mut Vec<u8>) -> PyResult<()> {
        write_str(out, "work_item_id");
        write_str(out, self.parsed.str(self.data, lazy::WORK_ITEM_ID));
        write_str(out, "request_id");
        write_str(out, self.parsed.str(self.data, lazy::REQUEST_ID));
        write_str(out, "item_index");
        write_uint(out, self.parsed.item_index);
        Ok(())
    }

    fn total_and_timestamp(&self, out: &mut Vec<u8>) -> PyResult<()> {
        write_str(out, "total_items");
        write_uint(out, self.parsed.total_items);
        write_str(out, "timestamp");
        write_f64(out, self.parsed.timestamp);
        Ok(())
    }

    fn spliced(&self, out: &mut Vec<u8>, slot: usize) -> PyResult<()> {
        let (off, len) = self.parsed.spans[slot];
        write_raw_value(out, &self.data[off as usize..(off + len) as usize], slot);
        Ok(())
    }

    fn is_query(&self, out: &mut Vec<u8>) -> PyResult<()> {
        write_bool(out, self.parsed.is_query);
        Ok(())
    }

    fn or_none(&self, out: &mut Vec<u8>, profile: bool) -> PyResult<()> {
        let field = if profile {
            lazy::PROFILE_ID
        } else {
            lazy::BUNDLE_CONFIG_HASH
        };
        match self.parsed.str(self.data, field) {
            "" => write_nil(out),
            value => write_str(out, value),
        }
        Ok(())
    }
}

/// A spliced value as it lies in the payload (empty: absent).
fn write_raw_value(out: &mut Vec<u8>, value: &[u8], slot: usize) {
    let empty_list = slot == SCORE_ITEMS;
    if value.is_empty() || (empty_list && value == [0xc0]) {
        if empty_list {
            write_array_header(out, 0);
        } else {
            write_nil(out);
        }
    } else {
        out.extend_from_slice(value);
    }
}

/// One tagged RunBatchItem: the wrapper keys around the op's body (wire-protocol §4.1-4.3).
fn write_item(
    v: &impl Values,
    out: &mut Vec<u8>,
    op: Op,
    op_name: &Bound<'_, PyAny>,
    fetch_ms: f64,
    prepared: Option<&Bound<'_, PyAny>>,
    trace: Option<&Trace>,
) -> PyResult<()> {
    write_map_header(out, 9);
    write_str(out, "op");
    pack(out, op_name)?;
    v.ids(out)?;
    for (key, this) in [
        ("encode", Op::Encode),
        ("score", Op::Score),
        ("extract", Op::Extract),
    ] {
        write_str(out, key);
        if this != op {
            write_nil(out);
            continue;
        }
        let spliced = |out: &mut Vec<u8>, key: &str, slot: usize| {
            write_str(out, key);
            v.spliced(out, slot)
        };
        match op {
            Op::Encode => {
                write_map_header(out, 14);
                v.ids(out)?;
                v.total_and_timestamp(out)?;
                spliced(out, "item", ITEM)?;
                spliced(out, "output_types", OUTPUT_TYPES)?;
                spliced(out, "instruction", INSTRUCTION)?;
                write_str(out, "is_query");
                v.is_query(out)?;
                spliced(out, "options", OPTIONS)?;
            }
            Op::Score => {
                write_map_header(out, 13);
                v.ids(out)?;
                v.total_and_timestamp(out)?;
                spliced(out, "query_item", QUERY_ITEM)?;
                spliced(out, "score_items", SCORE_ITEMS)?;
                spliced(out, "instruction", INSTRUCTION)?;
                spliced(out, "options", OPTIONS)?;
            }
            Op::Extract => {
                write_map_header(out, 14);
                v.ids(out)?;
                v.total_and_timestamp(out)?;
                spliced(out, "item", ITEM)?;
                spliced(out, "labels", LABELS)?;
                spliced(out, "output_schema", OUTPUT_SCHEMA)?;
                spliced(out, "instruction", INSTRUCTION)?;
                spliced(out, "options", OPTIONS)?;
            }
        }
        write_str(out, "profile_id");
        v.or_none(out, true)?;
        // Score too, newer than v0.7.1 (wire-protocol §4.3): v0.7.1's ScoreBatchItem had none.
        write_str(out, "bundle_config_hash");
        v.or_none(out, false)?;
        write_str(out, "payload_fetch_ms");
        write_f64(out, fetch_ms);
        write_str(
            out,
            if op == Op::Extract {
                "prepared_audio"
            } else {
                "prepared_tokens"
            },
        );
        match prepared {
            Some(p) => pack(out, p)?,
            None => write_nil(out),
        }
    }
    if let Some(trace) = trace {
        write_str(out, "traceparent");
        write_str(out, &trace.parent);
        write_str(out, "tracestate");
        write_opt_str(out, trace.state.as_deref());
        return Ok(());
    }
    write_str(out, "traceparent");
    v.spliced(out, TRACEPARENT)?;
    write_str(out, "tracestate");
    v.spliced(out, TRACESTATE)
}

/// The trace context every item of a sampled batch carries instead of its own: the sidecar's
/// batch span (wire-protocol §4.2, "sidecar dispatch span's").
struct Trace {
    parent: String,
    state: Option<String>,
}

/// Each item's own `traceparent` string, handed to `f` where it lies (nothing copied): an element
/// that is itself a `str` (the tests' and the twins' lists of contexts), an undecoded
/// `LazyDelivery` read in place, or anything else by attribute. None, nil and non-strings are
/// skipped. The batch tracer (`tracing.rs`) reads a batch's contexts through this.
pub(crate) fn for_each_traceparent<'py>(
    py: Python<'py>,
    items: &Bound<'py, PyAny>,
    mut f: impl FnMut(&str),
) -> PyResult<()> {
    for obj in items.try_iter()? {
        traceparent_of(py, &obj?, &mut f)?;
    }
    Ok(())
}

/// `for_each_traceparent` for one object: `f` gets its non-nil `traceparent`, if it has one.
pub(crate) fn traceparent_of<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    f: &mut impl FnMut(&str),
) -> PyResult<()> {
    let name = &names(py)[TRACEPARENT];
    if obj.is_none() {
        return Ok(());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        f(s.to_str()?);
        return Ok(());
    }
    if let Ok(lazy) = obj.cast::<LazyDelivery>() {
        let this = lazy.borrow();
        if let Some((data, parsed)) = this.in_place_ref(py) {
            let (off, len) = parsed.spans[TRACEPARENT];
            let value = &data[off as usize..(off + len) as usize];
            // Absent or nil (most items): skipped before the reader, whose refusal would
            // format an error message (a malloc and a free per item, ~130 instructions).
            if value.is_empty() || value == [NIL] {
                return Ok(());
            }
            if let Ok(s) = Reader::new(value).read_str("traceparent") {
                f(s);
            }
            return Ok(());
        }
        drop(this);
        let item = lazy.borrow_mut().decode(py)?;
        let value = item.bind(py).getattr(name.bind(py))?;
        if let Ok(s) = value.cast::<PyString>() {
            f(s.to_str()?);
        }
        return Ok(());
    }
    let value = obj.getattr(name.bind(py))?;
    if let Ok(s) = value.cast::<PyString>() {
        f(s.to_str()?);
    }
    Ok(())
}

/// The three ids both the wrapper and the body carry, read once.
struct Ids<'py> {
    work_item_id: Bound<'py, PyAny>,
    request_id: Bound<'py, PyAny>,
    item_index: Bound<'py, PyAny>,
}

/// A per-item argument as a list of `n` (None: not given), like the strict `zip` of the twin.
fn per_item<'py>(
    arg: Option<&Bound<'py, PyAny>>,
    n: usize,
    what: &str,
) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
    let Some(arg) = arg.filter(|a| !a.is_none()) else {
        return Ok(None);
    };
    let values: Vec<Bound<'py, PyAny>> = arg.try_iter()?.collect::<PyResult<_>>()?;
    if values.len() != n {
        return Err(PyValueError::new_err(format!(
            "{what} has {} entries for {n} items",
            values.len()
        )));
    }
    Ok(Some(values))
}

/// An encoded RunBatchRequest, equal (after decoding, with the same key order) to what
/// `ipc.requests.run_batch_body_py` packs; byte-identical when the payloads were canonically encoded.
///
/// `room=True` (the dispatcher's call): the body comes as a `RequestBody`, written after
/// `ENVELOPE_ROOM` bytes left for the IPC envelope, so `encode_request` makes the request frame of
/// the body's own memory. Why: the body went from a growing `Vec` into `bytes` and from there into
/// the frame, three copies of ~45 KB a 64-item batch (docs/benchmarks.md, issue 32).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (model_id, op, lora, total_cost, batch_id, items, payload_fetch_ms = None, prepared_tokens = None, prepared_audio = None, trace = None, *, room = false))]
pub fn write_run_batch_body<'py>(
    py: Python<'py>,
    model_id: &Bound<'py, PyAny>,
    op: &Bound<'py, PyAny>,
    lora: &Bound<'py, PyAny>,
    total_cost: &Bound<'py, PyAny>,
    batch_id: &Bound<'py, PyAny>,
    items: &Bound<'py, PyAny>,
    payload_fetch_ms: Option<&Bound<'py, PyAny>>,
    prepared_tokens: Option<&Bound<'py, PyAny>>,
    prepared_audio: Option<&Bound<'py, PyAny>>,
    trace: Option<(String, Option<String>)>,
    room: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let trace = trace.map(|(parent, state)| Trace { parent, state });
    let kind = match op.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) {
        Some("encode") => Op::Encode,
        Some("score") => Op::Score,
        Some("extract") => Op::Extract,
        _ => return Err(PyKeyError::new_err(op.clone().unbind())),
    };
    let items: Vec<Bound<'py, PyAny>> = items.try_iter()?.collect::<PyResult<_>>()?;
    let n = items.len();
    let fetch_ms = per_item(payload_fetch_ms, n, "payload_fetch_ms")?;
    let prepared = match kind {
        Op::Encode => per_item(prepared_tokens, n, "prepared_tokens")?,
        Op::Extract => per_item(prepared_audio, n, "prepared_audio")?,
        Op::Score => None,
    };
    let names = names(py);
    let room = if room { ENVELOPE_ROOM } else { 0 };
    let mut out = Vec::with_capacity(room + 64 + n * item_size_hint());
    out.resize(room, 0);
    write_map_header(&mut out, 6);
    write_str(&mut out, "model_id");
    pack(&mut out, model_id)?;
    write_str(&mut out, "batch_id");
    pack(&mut out, batch_id)?;
    write_str(&mut out, "lora_key");
    pack(&mut out, lora)?;
    write_str(&mut out, "total_cost");
    pack(&mut out, total_cost)?;
    write_str(&mut out, "items");
    write_array_header(&mut out, n);
    for (i, obj) in items.iter().enumerate() {
        let ms = match &fetch_ms {
            Some(v) => float_of(&v[i])?,
            None => 0.0,
        };
        let p = prepared.as_ref().map(|v| &v[i]).filter(|p| !p.is_none());
        if let Ok(lazy) = obj.cast::<LazyDelivery>() {
            let this = lazy.borrow();
            if let Some((data, parsed)) = this.in_place_ref(py) {
                let values = InPayload { data, parsed };
                write_item(&values, &mut out, kind, op, ms, p, trace.as_ref())?;
                continue;
            }
            // Decoded since intake: its WorkItem (possibly edited) is the truth.
            return Err(PyValueError::new_err(
                "a decoded LazyDelivery must be passed as its WorkItem (wire_item)",
            ));
        }
        let raw = obj.getattr(names[RAW].bind(py))?;
        let spans = obj.getattr(names[SPANS].bind(py))?;
        let attr = |i: usize| obj.getattr(names[i].bind(py));
        let item = Item {
            obj,
            names,
            source: Source::of(&raw, &spans),
            ids: Ids {
                work_item_id: attr(WORK_ITEM_ID)?,
                request_id: attr(REQUEST_ID)?,
                item_index: attr(ITEM_INDEX)?,
            },
        };
        write_item(&item, &mut out, kind, op, ms, p, trace.as_ref())?;
    }
    write_str(&mut out, "accepts_batched_f16_multivectors");
    write_bool(&mut out, true);
    // An eighth more than this batch's, so a slightly larger next batch does not grow; at most
    // `MAX_ITEM_SIZE_HINT`, so one batch of large items does not size every later one.
    if let Some(per_item) = (out.len() - room).checked_div(n) {
        let hint = (per_item + per_item / 8 + 16).min(MAX_ITEM_SIZE_HINT);
        ITEM_SIZE_HINT.store(hint, Ordering::Relaxed);
    }
    if room > 0 {
        return Ok(Bound::new(py, RequestBody::new(out))?.into_any());
    }
    Ok(PyBytes::new(py, &out).into_any())
}

/// Bytes an item took in the last body written: the next body's `Vec` is made that large up
/// front (a 64-item batch of gateway WorkItems outgrew the old fixed 512 a item, and its ~32 KB
/// were copied by the `Vec`'s growth every batch).
static ITEM_SIZE_HINT: AtomicUsize = AtomicUsize::new(512);

/// The largest hint: a body of items larger than this grows as it is written (its items' own
/// size dwarfs the growth's copies).
const MAX_ITEM_SIZE_HINT: usize = 8 * 1024;

fn item_size_hint() -> usize {
    ITEM_SIZE_HINT.load(Ordering::Relaxed)
}
