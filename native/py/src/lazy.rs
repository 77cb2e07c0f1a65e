//! A delivery whose WorkItem stays in its payload until Python asks for it (issue 10: no Python
//! object per field on the common path).
//!
//! `intake_batch` makes a `LazyDelivery` for a payload that `parse` accepts: a one-pass walk that
//! checks everything `decode_work_item` checks (types, UTF-8, required keys, nesting, hashable
//! keys) without building a Python object, and records where each field lies in the payload. The
//! RunBatch writer and the reply framer read those fields in place. Whatever reads `.item` gets the
//! real `WorkItem`, decoded then (once) by `decode_work_item` itself, and from that moment every
//! native consumer reads the WorkItem's attributes instead (it may have been edited).
//!
//! `parse` is allowed to refuse more than the decoder (an ext value, a non-str key, deep nesting):
//! the caller then decodes the payload the usual way, so the verdict is always the decoder's.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyType};

use sie_core::msgpack::{Reader, Token, MAX_DEPTH};

use crate::attempts::AttemptTally;
use crate::text::{text, valid_utf8};
use crate::workitem::{decode_work_item, json_shape_violation, SPAN_COUNT};

/// The str fields kept as spans, by index.
pub const WORK_ITEM_ID: usize = 0;
pub const REQUEST_ID: usize = 1;
pub const REPLY_SUBJECT: usize = 2;
pub const BUNDLE_CONFIG_HASH: usize = 3;
pub const OPERATION: usize = 4;
pub const PROFILE_ID: usize = 5;
pub const MODEL_ID: usize = 6;
pub const ADMISSION_POOL: usize = 7;
const STR_COUNT: usize = 8;

/// Where a WorkItem's fields lie in its payload (offset, length), and its scalars.
#[derive(Clone, Copy, Default)]
pub struct Parsed {
    /// UTF-8 contents of the str fields (length 0: empty or absent).
    strs: [(u32, u32); STR_COUNT],
    /// The encoded values the RunBatch writer splices, in `workitem::SPLICED` order (length 0: absent).
    pub spans: [(u32, u32); SPAN_COUNT],
    pub item_index: u64,
    pub total_items: u64,
    pub timestamp: f64,
    /// `deadline` (newer than v0.7.1): NaN when absent or not a number (decoded as absent).
    pub deadline: f64,
    pub is_query: bool,
    /// `options` is a non-empty map.
    pub has_options: bool,
    pub payload_ref: bool,
    pub query_payload_ref: bool,
}

impl Parsed {
    /// A str field's contents (validated UTF-8 when parsed).
    pub fn str<'a>(&self, data: &'a [u8], field: usize) -> &'a str {
        let (off, len) = self.strs[field];
        let bytes = &data[off as usize..(off + len) as usize];
        // `parse` checked every str field it recorded with from_utf8; an empty span is "".
        text(bytes).unwrap_or("")
    }

    /// The operation of a plain item (encode or score, no options, no offloaded payload).
    pub fn plain_op<'a>(&self, data: &'a [u8]) -> Option<&'a str> {
        let op = self.str(data, OPERATION);
        let reference = match op {
            "encode" => self.payload_ref,
            "score" => self.query_payload_ref,
            _ => return None,
        };
        (!reference && !self.has_options).then_some(op)
    }
}

/// `output_schema`'s span slot: JSON-shaped, like `options` (wire-protocol §0.6).
const OUTPUT_SCHEMA_SLOT: usize = 7;

/// Field kinds, as `workitem::Kind` (the decoder's), plus where a str goes.
#[derive(Clone, Copy)]
enum Field {
    /// A required str.
    Str(usize),
    /// A str or nil ("").
    StrOrEmpty(Option<usize>),
    /// A str or nil; `Some(slot)`: spliced.
    StrOrNone(Option<usize>),
    Uint(bool),
    Bool(bool),
    Timestamp,
    /// `deadline`: a number, else absent (any other value is walked and ignored).
    Deadline,
    /// An array or nil, spliced at the slot.
    List(usize),
    /// `options`: a map or nil.
    Options,
    /// Any value, spliced at the slot.
    Any(usize),
    PayloadRef(bool),
}

/// The known keys: (name, kind, required bit).
fn field_of(key: &[u8]) -> Option<(Field, Option<usize>)> {
    Some(match key {
        b"work_item_id" => (Field::Str(WORK_ITEM_ID), Some(0)),
        b"request_id" => (Field::Str(REQUEST_ID), Some(1)),
        b"item_index" => (Field::Uint(true), Some(2)),
        b"total_items" => (Field::Uint(false), Some(3)),
        b"operation" => (Field::Str(OPERATION), Some(4)),
        b"model_id" => (Field::Str(MODEL_ID), Some(5)),
        b"pool_name" => (Field::Str(usize::MAX), Some(6)),
        b"machine_profile" => (Field::Str(usize::MAX), Some(7)),
        b"reply_subject" => (Field::Str(REPLY_SUBJECT), Some(8)),
        b"profile_id" => (Field::StrOrEmpty(Some(PROFILE_ID)), None),
        b"admission_pool" => (Field::StrOrEmpty(Some(ADMISSION_POOL)), None),
        b"engine" | b"router_id" => (Field::StrOrEmpty(None), None),
        b"bundle_config_hash" => (Field::StrOrEmpty(Some(BUNDLE_CONFIG_HASH)), None),
        b"item" => (Field::Any(0), None),
        b"payload_ref" => (Field::PayloadRef(false), None),
        b"query_payload_ref" => (Field::PayloadRef(true), None),
        b"output_types" => (Field::List(1), None),
        b"instruction" => (Field::StrOrNone(Some(2)), None),
        b"is_query" => (Field::Bool(true), None),
        b"accepts_result_chunks" => (Field::Bool(false), None),
        b"options" => (Field::Options, None),
        b"query_item" => (Field::Any(4), None),
        b"score_items" => (Field::List(5), None),
        b"labels" => (Field::List(6), None),
        b"output_schema" => (Field::Any(OUTPUT_SCHEMA_SLOT), None),
        b"traceparent" => (Field::StrOrNone(Some(8)), None),
        b"tracestate" => (Field::StrOrNone(Some(9)), None),
        b"timestamp" => (Field::Timestamp, None),
        b"deadline" => (Field::Deadline, None),
        b"fallback_reason" => (Field::StrOrNone(None), None),
        _ => return None,
    })
}

/// Walk one value without building it, as strictly as `convert::value` builds it: every str valid
/// UTF-8, no container as a map key. `None` for anything it leaves to the decoder (ext values,
/// nesting near the limit, malformed bytes).
fn walk(r: &mut Reader<'_>, depth: usize) -> Option<()> {
    if depth + 1 >= MAX_DEPTH {
        return None;
    }
    match r.next_token().ok()? {
        Token::Str(s) => {
            valid_utf8(s).then_some(())?;
        }
        Token::Ext(..) => return None,
        Token::Array(n) => {
            for _ in 0..n {
                walk(r, depth + 1)?;
            }
        }
        Token::Map(n) => {
            for _ in 0..n {
                let at = r.position();
                if matches!(r.next_token().ok()?, Token::Array(_) | Token::Map(_)) {
                    return None; // unhashable: the decoder reports it
                }
                r.skip_to(at);
                walk(r, depth + 1)?;
                walk(r, depth + 1)?;
            }
        }
        _ => {}
    }
    Some(())
}

/// Offset of `inner` within `outer` (a sub-slice of it).
fn offset_in(outer: &[u8], inner: &[u8]) -> u32 {
    (inner.as_ptr() as usize - outer.as_ptr() as usize) as u32
}

/// The fields of a WorkItem payload in place, or `None` when the decoder must decide (anything it
/// would refuse, and a few things this leaves to it).
pub fn parse(bytes: &[u8]) -> Option<Parsed> {
    u32::try_from(bytes.len()).ok()?;
    let mut r = Reader::new(bytes);
    let Token::Map(n) = r.next_token().ok()? else {
        return None;
    };
    let mut p = Parsed {
        deadline: f64::NAN,
        ..Parsed::default()
    };
    let mut required = 0u16;
    for _ in 0..n {
        let Token::Str(key) = r.next_token().ok()? else {
            return None; // a non-str key: the decoder converts (or refuses) it
        };
        let Some((field, bit)) = field_of(key) else {
            valid_utf8(key).then_some(())?;
            walk(&mut r, 0)?;
            continue;
        };
        let start = r.position();
        let token = r.next_token().ok()?;
        let str_at = |p: &mut Parsed, slot: usize, s: &[u8]| -> Option<()> {
            valid_utf8(s).then_some(())?;
            if slot != usize::MAX {
                p.strs[slot] = (offset_in(bytes, s), s.len() as u32);
            }
            Some(())
        };
        match (field, token) {
            (Field::Str(slot), Token::Str(s)) | (Field::StrOrEmpty(Some(slot)), Token::Str(s)) => {
                str_at(&mut p, slot, s)?
            }
            (Field::StrOrEmpty(None), Token::Str(s)) => str_at(&mut p, usize::MAX, s)?,
            (Field::StrOrEmpty(slot), Token::Nil) => {
                if let Some(slot) = slot {
                    p.strs[slot] = (0, 0);
                }
            }
            (Field::StrOrNone(_), Token::Str(s)) => str_at(&mut p, usize::MAX, s)?,
            (Field::StrOrNone(_), Token::Nil) => {}
            (Field::PayloadRef(query), Token::Str(s)) => {
                str_at(&mut p, usize::MAX, s)?;
                *if query {
                    &mut p.query_payload_ref
                } else {
                    &mut p.payload_ref
                } = true;
            }
            (Field::PayloadRef(query), Token::Nil) => {
                *if query {
                    &mut p.query_payload_ref
                } else {
                    &mut p.payload_ref
                } = false;
            }
            (Field::Uint(index), Token::UInt(v)) => {
                *if index {
                    &mut p.item_index
                } else {
                    &mut p.total_items
                } = v;
            }
            (Field::Uint(index), Token::Int(v)) if v >= 0 => {
                *if index {
                    &mut p.item_index
                } else {
                    &mut p.total_items
                } = v as u64;
            }
            (Field::Bool(query), Token::Bool(b)) => {
                if query {
                    p.is_query = b;
                }
            }
            (Field::Bool(query), Token::Nil) => {
                if query {
                    p.is_query = false;
                }
            }
            (Field::Timestamp, Token::Nil) => p.timestamp = 0.0,
            (Field::Timestamp, Token::UInt(v)) => p.timestamp = v as f64,
            (Field::Timestamp, Token::Int(v)) => p.timestamp = v as f64,
            (Field::Timestamp, Token::F32(v)) => p.timestamp = f64::from(v),
            (Field::Timestamp, Token::F64(v)) => p.timestamp = v,
            (Field::Deadline, Token::UInt(v)) => p.deadline = v as f64,
            (Field::Deadline, Token::Int(v)) => p.deadline = v as f64,
            (Field::Deadline, Token::F32(v)) => p.deadline = f64::from(v),
            (Field::Deadline, Token::F64(v)) => p.deadline = v,
            (Field::Deadline, _) => {
                // Lenient (wire-protocol §7.2): any other value decodes as absent.
                r.skip_to(start);
                walk(&mut r, 0)?;
                p.deadline = f64::NAN;
            }
            (Field::List(_), Token::Nil) | (Field::Options, Token::Nil) | (Field::Any(_), _) => {
                r.skip_to(start);
                if matches!(field, Field::Any(OUTPUT_SCHEMA_SLOT))
                    && json_shape_violation(&mut r).is_some()
                {
                    return None; // not JSON-shaped: the decoder says why
                }
                r.skip_to(start);
                walk(&mut r, 0)?;
                if matches!(field, Field::Options) {
                    p.has_options = false;
                }
            }
            (Field::List(_), Token::Array(_)) => {
                r.skip_to(start);
                walk(&mut r, 0)?;
            }
            (Field::Options, Token::Map(m)) => {
                r.skip_to(start);
                if json_shape_violation(&mut r).is_some() {
                    return None; // not JSON-shaped: the decoder says why
                }
                r.skip_to(start);
                walk(&mut r, 0)?;
                p.has_options = m > 0;
            }
            _ => return None, // a type the decoder refuses: it says why
        }
        let slot = match field {
            Field::StrOrNone(Some(slot)) | Field::List(slot) | Field::Any(slot) => Some(slot),
            Field::Options => Some(3),
            _ => None,
        };
        if let Some(slot) = slot {
            // A repeated key overwrites the span, as it overwrites the value (last wins).
            p.spans[slot] = (start as u32, (r.position() - start) as u32);
        }
        if let Some(bit) = bit {
            required |= 1 << bit;
        }
    }
    r.finish().ok()?;
    (required == 0x1ff).then_some(p)
}

/// Where a delivery made by the inbound scanner came from: enough to build its nats-py `Msg`
/// when a per-message path (NAK, progress ACK, a log line) asks for it.
pub struct Origin {
    pub subject: Py<PyString>,
    /// The JetStream ACK subject, in the run buffer.
    pub reply: (u32, u32),
    pub sid: i64,
    pub client: Py<PyAny>,
    pub msg_cls: Py<PyAny>,
}

/// A pulled message and its settlement state, with its WorkItem still in the payload
/// (`pipeline.delivery.Delivery` is the twin and the other implementation; both have the same
/// attributes). Reading `item` decodes the WorkItem once; `wire_item` is what the RunBatch writer
/// takes: this delivery while the item was never decoded, else the WorkItem. Made by the inbound
/// scanner (`deliveries_of_run`: one per frame, the run's bytes shared, no `Msg` until `msg` is
/// read) or by the intake from a message (`intake_batch`).
#[pyclass(module = "sie_sidecar._native")]
pub struct LazyDelivery {
    #[pyo3(get, set)]
    pub worker_direct: bool,
    #[pyo3(get, set)]
    pub model: Py<PyAny>,
    #[pyo3(get, set)]
    pub settled: bool,
    #[pyo3(get, set)]
    pub payload_fetch_ms: f64,
    #[pyo3(get, set)]
    pub prepared_tokens: Py<PyAny>,
    #[pyo3(get, set)]
    pub prepared_audio: Py<PyAny>,
    #[pyo3(get, set)]
    pub release: Py<PyAny>,
    msg: Option<Py<PyAny>>,
    pub origin: Option<Origin>,
    /// The bytes holding the payload (the message's `data`, or the scanner's run buffer).
    pub buffer: Py<PyBytes>,
    pub payload: (u32, u32),
    /// `None`: not (yet) read in place; the intake decodes the payload instead.
    pub parsed: Option<Parsed>,
    item_cls: Py<PyType>,
    item: Option<Py<PyAny>>,
}

/// The payload of a delivery read in place: its bytes, where it lies, what `parse` found.
pub struct InPlace<'py> {
    pub buffer: Bound<'py, PyBytes>,
    pub payload: (u32, u32),
    pub parsed: Parsed,
}

impl InPlace<'_> {
    pub fn data(&self) -> &[u8] {
        let (off, len) = self.payload;
        &self.buffer.as_bytes()[off as usize..(off + len) as usize]
    }
}

impl LazyDelivery {
    /// A delivery of a message (`msg`, whose `data` is `buffer`), parsed in place.
    #[allow(clippy::too_many_arguments)]
    pub fn of_message(
        py: Python<'_>,
        msg: Py<PyAny>,
        worker_direct: bool,
        model: Py<PyAny>,
        release: Py<PyAny>,
        buffer: Bound<'_, PyBytes>,
        parsed: Parsed,
        item_cls: Py<PyType>,
    ) -> Self {
        let len = buffer.as_bytes().len() as u32;
        let mut d = Self::unsettled(
            py,
            Some(msg),
            None,
            buffer.unbind(),
            (0, len),
            Some(parsed),
            item_cls,
        );
        (d.worker_direct, d.model, d.release) = (worker_direct, model, release);
        d
    }

    /// A delivery not yet settled, its payload at `payload` in `buffer`; no model, no release
    /// (intake sets them), nothing fetched or prepared.
    fn unsettled(
        py: Python<'_>,
        msg: Option<Py<PyAny>>,
        origin: Option<Origin>,
        buffer: Py<PyBytes>,
        payload: (u32, u32),
        parsed: Option<Parsed>,
        item_cls: Py<PyType>,
    ) -> Self {
        Self {
            worker_direct: false,
            model: py.None(),
            settled: false,
            payload_fetch_ms: 0.0,
            prepared_tokens: py.None(),
            prepared_audio: py.None(),
            release: py.None(),
            msg,
            origin,
            buffer,
            payload,
            parsed,
            item_cls,
            item: None,
        }
    }

    /// The payload read in place, while the item was never decoded.
    pub fn in_place<'py>(&self, py: Python<'py>) -> Option<InPlace<'py>> {
        if self.item.is_some() {
            return None;
        }
        Some(InPlace {
            buffer: self.buffer.bind(py).clone(),
            payload: self.payload,
            parsed: self.parsed?,
        })
    }

    /// `in_place`, borrowed from the delivery: the payload's bytes and its parse, neither copied
    /// (for a caller that holds the borrow while it reads; `in_place` copies the ~180-byte parse
    /// and takes a reference to the buffer, per item).
    pub fn in_place_ref<'a>(&'a self, py: Python<'a>) -> Option<(&'a [u8], &'a Parsed)> {
        if self.item.is_some() {
            return None;
        }
        let parsed = self.parsed.as_ref()?;
        let (off, len) = self.payload;
        let bytes: &'a [u8] = self.buffer.bind(py).as_bytes();
        Some((&bytes[off as usize..(off + len) as usize], parsed))
    }

    pub fn decoded(&self) -> bool {
        self.item.is_some()
    }

    /// The payload as its own `bytes` (the message's data itself when it is one).
    pub fn payload_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let buffer = self.buffer.bind(py);
        let (off, len) = self.payload;
        if off == 0 && len as usize == buffer.as_bytes().len() {
            return buffer.clone();
        }
        PyBytes::new(py, &buffer.as_bytes()[off as usize..(off + len) as usize])
    }

    /// The JetStream ACK subject as it lies in the run buffer (unvalidated), without building the
    /// `Msg` (a scanned delivery), else `None`.
    pub fn ack_subject_bytes<'a>(&self, buffer: &'a Bound<'_, PyBytes>) -> Option<&'a [u8]> {
        let (off, len) = self.origin.as_ref()?.reply;
        let bytes: &'a [u8] = buffer.as_bytes();
        Some(&bytes[off as usize..(off + len) as usize])
    }

    /// The subject it was delivered on, without building the `Msg` (a scanned delivery).
    pub fn origin_subject<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        self.origin.as_ref().map(|o| o.subject.bind(py).clone())
    }

    /// Decode the payload now (the intake does, when `parse` left it to the decoder).
    pub fn decode(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(item) = &self.item {
            return Ok(item.clone_ref(py));
        }
        let payload = self.payload_bytes(py);
        let item = decode_work_item(py, payload.as_any(), self.item_cls.bind(py))?;
        self.item = Some(item.clone_ref(py));
        Ok(item)
    }

    /// A NAKed delivery has no item (`item` reads None, as on the dataclass), whatever its payload.
    pub fn clear_item(&mut self, py: Python<'_>) {
        self.item = Some(py.None());
    }
}

#[pymethods]
impl LazyDelivery {
    /// The WorkItem, decoded from the payload on first use.
    #[getter]
    fn item(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.decode(py)
    }

    #[setter]
    fn set_item(&mut self, item: Py<PyAny>) {
        self.item = Some(item);
    }

    /// The settle handle: the nats-py `Msg` (built on first use for a scanned delivery, as the
    /// scanner used to build it: instance dict filled, no `__init__`).
    #[getter]
    fn msg(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(msg) = &self.msg {
            return Ok(msg.clone_ref(py));
        }
        let Some(origin) = &self.origin else {
            return Ok(py.None());
        };
        let buffer = self.buffer.bind(py);
        let (off, len) = origin.reply;
        let bytes: &[u8] = buffer.as_bytes();
        let reply = text(&bytes[off as usize..(off + len) as usize]).unwrap_or("");
        let cls = origin.msg_cls.bind(py);
        let msg = cls.call_method1("__new__", (cls,))?;
        let dict = msg.getattr("__dict__")?;
        dict.set_item("_client", origin.client.bind(py))?;
        dict.set_item("subject", origin.subject.bind(py))?;
        dict.set_item("reply", reply)?;
        dict.set_item("data", self.payload_bytes(py))?;
        dict.set_item("headers", py.None())?;
        dict.set_item("_sid", origin.sid)?;
        let msg = msg.unbind();
        self.msg = Some(msg.clone_ref(py));
        Ok(msg)
    }

    #[setter]
    fn set_msg(&mut self, msg: Py<PyAny>) {
        self.msg = Some(msg);
    }

    /// Anything else is the message's (`data`, `reply`, `ack()`, `metadata`...): a scanned
    /// delivery stands in for the nats-py `Msg` it was not made into.
    fn __getattr__(&mut self, py: Python<'_>, name: &Bound<'_, PyString>) -> PyResult<Py<PyAny>> {
        let msg = self.msg(py)?;
        if msg.is_none(py) {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                name.clone().unbind(),
            ));
        }
        Ok(msg.bind(py).getattr(name)?.unbind())
    }

    /// What the RunBatch writer reads: this delivery while its item is undecoded, else the item.
    #[getter]
    fn wire_item(slf: Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let mut this = slf.borrow_mut();
        if this.item.is_none() && this.parsed.is_none() {
            return this.decode(py);
        }
        Ok(match &this.item {
            Some(item) => item.clone_ref(py),
            None => slf.clone().into_any().unbind(),
        })
    }

    /// The item's `bundle_config_hash` (the config barrier reads only this).
    #[getter]
    fn bundle_config_hash(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some((data, parsed)) = self.in_place_ref(py) {
            let hash = parsed.str(data, BUNDLE_CONFIG_HASH);
            return Ok(PyString::new(py, hash).into_any().unbind());
        }
        Ok(self
            .decode(py)?
            .bind(py)
            .getattr("bundle_config_hash")?
            .unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let id = match self.in_place_ref(py) {
            Some((data, parsed)) => parsed.str(data, WORK_ITEM_ID).to_owned(),
            None => "?".to_owned(),
        };
        format!(
            "LazyDelivery(work_item_id={id:?}, decoded={}, settled={})",
            self.item.is_some(),
            self.settled
        )
    }
}

/// The deliveries of one run of scanned MSG frames (`cython/_parts/inbound.pxi`): `run` holds the
/// frames' bytes, `spans` per frame four little-endian u32 (reply offset, reply length, payload
/// offset, payload length, in `run`), `subjects` each frame's subject. Each payload is parsed in
/// place; nothing else is made per frame.
///
/// `tallies` (metrics on): sid -> `AttemptTally`. When `sid` has one, each frame's ACK subject is
/// counted into it here, once the whole run was read: the subjects were just scanned and are still
/// in the CPU's caches, and the pull consumer's own pass over the run's deliveries (a cast, a
/// borrow and a buffer per delivery) is not needed (docs/benchmarks.md, issue 32).
#[pyfunction]
#[pyo3(signature = (run, spans, subjects, sid, client, msg_cls, *, item_cls, tallies = None))]
#[allow(clippy::too_many_arguments)]
pub fn deliveries_of_run<'py>(
    py: Python<'py>,
    run: Bound<'py, PyBytes>,
    spans: &Bound<'py, PyBytes>,
    subjects: &Bound<'py, PyList>,
    sid: i64,
    client: &Bound<'py, PyAny>,
    msg_cls: &Bound<'py, PyAny>,
    item_cls: &Bound<'py, PyType>,
    tallies: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    let table = spans.as_bytes();
    let n = subjects.len();
    if table.len() != n * 16 {
        return Err(PyValueError::new_err(
            "spans must hold four u32 per subject",
        ));
    }
    let bytes = run.as_bytes();
    let u32_at =
        |i: usize| u32::from_le_bytes([table[i], table[i + 1], table[i + 2], table[i + 3]]);
    let out = PyList::empty(py);
    for (i, subject) in subjects.iter().enumerate() {
        let at = i * 16;
        let reply = (u32_at(at), u32_at(at + 4));
        let payload = (u32_at(at + 8), u32_at(at + 12));
        for (off, len) in [reply, payload] {
            if (off as usize)
                .checked_add(len as usize)
                .is_none_or(|end| end > bytes.len())
            {
                return Err(PyValueError::new_err("a span lies outside the run"));
            }
        }
        let data = &bytes[payload.0 as usize..(payload.0 + payload.1) as usize];
        let origin = Origin {
            subject: subject.cast_into::<PyString>()?.unbind(),
            reply,
            sid,
            client: client.clone().unbind(),
            msg_cls: msg_cls.clone().unbind(),
        };
        let d = LazyDelivery::unsettled(
            py,
            None,
            Some(origin),
            run.clone().unbind(),
            payload,
            parse(data),
            item_cls.clone().unbind(),
        );
        out.append(Bound::new(py, d)?)?;
    }
    if let Some(tallies) = tallies {
        if let Some(tally) = tallies.get_item(sid)? {
            let mut tally = tally.cast_into::<AttemptTally>()?.borrow_mut();
            for at in (0..n).map(|i| i * 16) {
                let (off, len) = (u32_at(at) as usize, u32_at(at + 4) as usize);
                tally.add_subject(&bytes[off..off + len]); // checked above, with the payload
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sie_core::msgpack::{write_map_header, write_str, write_uint};

    fn item(extra: &[(&str, &str)]) -> Vec<u8> {
        let base = [
            ("work_item_id", "r.0"),
            ("request_id", "r"),
            ("operation", "encode"),
            ("model_id", "m"),
            ("pool_name", "p"),
            ("machine_profile", "c"),
            ("reply_subject", "_INBOX.g.r"),
        ];
        let mut out = Vec::new();
        write_map_header(&mut out, base.len() + 2 + extra.len());
        for (k, v) in base.iter().chain(extra) {
            write_str(&mut out, k);
            write_str(&mut out, v);
        }
        for k in ["item_index", "total_items"] {
            write_str(&mut out, k);
            write_uint(&mut out, 1);
        }
        out
    }

    #[test]
    fn fields_are_found_in_place() {
        let bytes = item(&[("bundle_config_hash", "h")]);
        let p = parse(&bytes).expect("parsed");
        assert_eq!(p.str(&bytes, WORK_ITEM_ID), "r.0");
        assert_eq!(p.str(&bytes, REPLY_SUBJECT), "_INBOX.g.r");
        assert_eq!(p.str(&bytes, BUNDLE_CONFIG_HASH), "h");
        assert_eq!(p.str(&bytes, PROFILE_ID), "");
        assert_eq!(p.plain_op(&bytes), Some("encode"));
        assert_eq!((p.item_index, p.total_items), (1, 1));
    }

    #[test]
    fn a_missing_required_key_or_a_wrong_type_is_left_to_the_decoder() {
        let mut bytes = Vec::new();
        write_map_header(&mut bytes, 1);
        write_str(&mut bytes, "work_item_id");
        write_str(&mut bytes, "x");
        assert!(parse(&bytes).is_none());
        assert!(parse(&[0xc1]).is_none());
        let mut bad = item(&[]);
        bad[0] += 1; // one more entry announced than present
        assert!(parse(&bad).is_none());
    }

    #[test]
    fn an_offloaded_payload_is_not_plain() {
        let bytes = item(&[("payload_ref", "s3://b/k")]);
        assert_eq!(parse(&bytes).expect("parsed").plain_op(&bytes), None);
    }
}
