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

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyType};

use sie_core::msgpack::{Reader, Token, MAX_DEPTH};

use crate::workitem::{decode_work_item, SPAN_COUNT};

/// The str fields kept as spans, by index.
pub const WORK_ITEM_ID: usize = 0;
pub const REQUEST_ID: usize = 1;
pub const REPLY_SUBJECT: usize = 2;
pub const BUNDLE_CONFIG_HASH: usize = 3;
pub const OPERATION: usize = 4;
pub const PROFILE_ID: usize = 5;
pub const MODEL_ID: usize = 6;
const STR_COUNT: usize = 7;

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
        std::str::from_utf8(bytes).unwrap_or("")
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
        b"engine" | b"admission_pool" | b"router_id" => (Field::StrOrEmpty(None), None),
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
        b"output_schema" => (Field::Any(7), None),
        b"traceparent" => (Field::StrOrNone(Some(8)), None),
        b"tracestate" => (Field::StrOrNone(Some(9)), None),
        b"timestamp" => (Field::Timestamp, None),
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
            std::str::from_utf8(s).ok()?;
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
    let mut p = Parsed::default();
    let mut required = 0u16;
    for _ in 0..n {
        let Token::Str(key) = r.next_token().ok()? else {
            return None; // a non-str key: the decoder converts (or refuses) it
        };
        let Some((field, bit)) = field_of(key) else {
            std::str::from_utf8(key).ok()?;
            walk(&mut r, 0)?;
            continue;
        };
        let start = r.position();
        let token = r.next_token().ok()?;
        let str_at = |p: &mut Parsed, slot: usize, s: &[u8]| -> Option<()> {
            std::str::from_utf8(s).ok()?;
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
            (Field::List(_), Token::Nil) | (Field::Options, Token::Nil) | (Field::Any(_), _) => {
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

/// A pulled message and its settlement state, with its WorkItem still in the payload
/// (`pipeline.delivery.Delivery` is the twin and the other implementation; both have the same
/// attributes). Reading `item` decodes the WorkItem once; `wire_item` is what the RunBatch writer
/// takes: this delivery while the item was never decoded, else the WorkItem.
#[pyclass(module = "sie_sidecar._native")]
pub struct LazyDelivery {
    #[pyo3(get, set)]
    pub msg: Py<PyAny>,
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
    pub data: Py<PyBytes>,
    pub parsed: Parsed,
    item_cls: Py<PyType>,
    item: Option<Py<PyAny>>,
}

impl LazyDelivery {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        py: Python<'_>,
        msg: Py<PyAny>,
        worker_direct: bool,
        model: Py<PyAny>,
        release: Py<PyAny>,
        data: Py<PyBytes>,
        parsed: Parsed,
        item_cls: Py<PyType>,
    ) -> Self {
        Self {
            msg,
            worker_direct,
            model,
            settled: false,
            payload_fetch_ms: 0.0,
            prepared_tokens: py.None(),
            prepared_audio: py.None(),
            release,
            data,
            parsed,
            item_cls,
            item: None,
        }
    }

    /// Whether the WorkItem was decoded (then its attributes are the truth, not the payload).
    pub fn decoded(&self) -> bool {
        self.item.is_some()
    }
}

#[pymethods]
impl LazyDelivery {
    /// The WorkItem, decoded from the payload on first use.
    #[getter]
    fn item(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(item) = &self.item {
            return Ok(item.clone_ref(py));
        }
        let item = decode_work_item(py, self.data.bind(py).as_any(), self.item_cls.bind(py))?;
        self.item = Some(item.clone_ref(py));
        Ok(item)
    }

    #[setter]
    fn set_item(&mut self, item: Py<PyAny>) {
        self.item = Some(item);
    }

    /// What the RunBatch writer reads: this delivery while its item is undecoded, else the item.
    #[getter]
    fn wire_item(slf: Bound<'_, Self>) -> Py<PyAny> {
        let py = slf.py();
        match &slf.borrow().item {
            Some(item) => item.clone_ref(py),
            None => slf.clone().into_any().unbind(),
        }
    }

    /// The item's `bundle_config_hash` (the config barrier reads only this).
    #[getter]
    fn bundle_config_hash(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(item) = &self.item {
            return Ok(item.bind(py).getattr("bundle_config_hash")?.unbind());
        }
        let data = self.data.bind(py).as_bytes();
        Ok(PyString::new(py, self.parsed.str(data, BUNDLE_CONFIG_HASH))
            .into_any()
            .unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let data = self.data.bind(py).as_bytes();
        format!(
            "LazyDelivery(work_item_id={:?}, decoded={}, settled={})",
            self.parsed.str(data, WORK_ITEM_ID),
            self.item.is_some(),
            self.settled
        )
    }
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
