//! WorkItem decoding in one pass (wire-protocol §7.2, TV-W1): parse, type-check and fill a
//! `sie_sidecar.workitem.WorkItem` without an intermediate dict. Same rules and errors as the
//! Python decoder in `workitem.py`, which stays as the twin.
//!
//! It also keeps the payload (`raw`, the very `bytes` object when it is one) and where each value the
//! RunBatch item bodies copy verbatim lies in it (`spans`), so `run_batch::write_run_batch_body` can
//! splice those values instead of re-encoding the decoded Python objects.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyString, PyType};
use pyo3::IntoPyObjectExt;

use sie_core::msgpack::{DecodeError, Reader, Token};

use std::sync::Mutex;

use crate::buffers::with_bytes;
use crate::convert;
use crate::slots::SlotLayout;

pyo3::import_exception!(sie_sidecar.errors, WorkItemError);

/// The required keys (TV-W1) are the first `REQUIRED` entries of `FIELDS`.
const REQUIRED: usize = 9;

/// The fields whose encoded values the RunBatch writer splices, in span-table order (the same
/// tuple is `SPLICED_FIELDS` in `workitem.py`).
pub const SPLICED: [&str; SPAN_COUNT] = [
    "item",
    "output_types",
    "instruction",
    "options",
    "query_item",
    "score_items",
    "labels",
    "output_schema",
    "traceparent",
    "tracestate",
];
pub const SPAN_COUNT: usize = 10;
/// `spans` is `SPAN_COUNT` little-endian u32 (offset, length) pairs; length 0 means "absent".
pub const SPANS_LEN: usize = SPAN_COUNT * 8;

/// The span-table slot of a field (by its index in `FIELDS`), if the writer splices it.
const fn span_slot(field: usize) -> Option<usize> {
    match field {
        12 => Some(0),
        14 => Some(1),
        15 => Some(2),
        17 => Some(3),
        18 => Some(4),
        20 => Some(5),
        21 => Some(6),
        22 => Some(7),
        27 => Some(8),
        28 => Some(9),
        _ => None,
    }
}

fn bad(message: impl Into<String>) -> PyErr {
    WorkItemError::new_err(message.into())
}

fn msgpack_err(e: DecodeError) -> PyErr {
    bad(format!("not msgpack: {e}"))
}

/// How one known key's value is checked and converted.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Uint,
    StrOrEmpty,
    StrOrNone,
    Bool,
    Float,
    /// A number, else None (`deadline`: lenient, any other value decodes as absent).
    LenientFloat,
    ListOrNone,
    Any,
    /// `options`: a map or nil, JSON-shaped (no bin or ext anywhere inside, wire-protocol §0.6).
    JsonMapOrNone,
    /// `output_schema`: any value, JSON-shaped.
    JsonAny,
}

/// The first bin or ext value inside the value at the reader's position, in document order (map
/// keys included): `Some("binary" | "ext")`, or None when it is JSON-shaped or malformed (the
/// converter then reports malformed bytes). Iterative, so no nesting limit of its own; the reader
/// is left wherever it stopped.
pub(crate) fn json_shape_violation(r: &mut Reader<'_>) -> Option<&'static str> {
    let mut remaining: u64 = 1;
    while remaining > 0 {
        remaining -= 1;
        match r.next_token().ok()? {
            Token::Bin(_) => return Some("binary"),
            Token::Ext(..) => return Some("ext"),
            Token::Array(n) => remaining += n as u64,
            Token::Map(n) => remaining += 2 * n as u64,
            _ => {}
        }
    }
    None
}

/// The field's index in `FIELDS` and how its value is checked.
fn field_of(key: &[u8]) -> Option<(usize, Kind)> {
    Some(match key {
        b"work_item_id" => (0, Kind::Str),
        b"request_id" => (1, Kind::Str),
        b"item_index" => (2, Kind::Uint),
        b"total_items" => (3, Kind::Uint),
        b"operation" => (4, Kind::Str),
        b"model_id" => (5, Kind::Str),
        b"pool_name" => (6, Kind::Str),
        b"machine_profile" => (7, Kind::Str),
        b"reply_subject" => (8, Kind::Str),
        b"profile_id" => (9, Kind::StrOrEmpty),
        b"engine" => (10, Kind::StrOrEmpty),
        b"admission_pool" => (11, Kind::StrOrEmpty),
        b"item" => (12, Kind::Any),
        b"payload_ref" => (13, Kind::StrOrNone),
        b"output_types" => (14, Kind::ListOrNone),
        b"instruction" => (15, Kind::StrOrNone),
        b"is_query" => (16, Kind::Bool),
        b"options" => (17, Kind::JsonMapOrNone),
        b"query_item" => (18, Kind::Any),
        b"query_payload_ref" => (19, Kind::StrOrNone),
        b"score_items" => (20, Kind::ListOrNone),
        b"labels" => (21, Kind::ListOrNone),
        b"output_schema" => (22, Kind::JsonAny),
        b"bundle_config_hash" => (23, Kind::StrOrEmpty),
        b"router_id" => (24, Kind::StrOrEmpty),
        b"timestamp" => (25, Kind::Float),
        b"accepts_result_chunks" => (26, Kind::Bool),
        b"traceparent" => (27, Kind::StrOrNone),
        b"tracestate" => (28, Kind::StrOrNone),
        b"deadline" => (29, Kind::LenientFloat),
        b"fallback_reason" => (30, Kind::StrOrNone),
        _ => return None,
    })
}

/// Interned names of every slot the decoder fills (the `FIELDS`, then `raw` and `spans`) and
/// `object.__new__`, looked up once.
struct Cache {
    names: Vec<Py<PyString>>,
    object_new: Py<PyAny>,
}

/// Where `raw` and `spans` stand in `Cache::names`, after the `FIELDS`.
const RAW_SLOT: usize = FIELDS.len();
const SPANS_SLOT: usize = FIELDS.len() + 1;

static CACHE: PyOnceLock<Cache> = PyOnceLock::new();

/// The slot layout of the first class decoded into (the `WorkItem` dataclass); `None` inside
/// when that class is not a plain `__slots__` class (then every field is `setattr`).
static LAYOUT: PyOnceLock<Option<SlotLayout>> = PyOnceLock::new();

/// Fields whose values repeat from item to item (a worker serves few models, pools, profiles,
/// routers): the last value of each is reused instead of a new str per item.
const REPEATING: [usize; 9] = [4, 5, 6, 7, 9, 10, 11, 23, 24];

/// One remembered value: its UTF-8 bytes and the str made from them.
type Remembered = (Box<[u8]>, Py<PyString>);

/// The last str decoded for each field of `REPEATING` (indexed like `FIELDS`).
struct Recent {
    last: Vec<Option<Remembered>>,
}

static RECENT: PyOnceLock<Mutex<Recent>> = PyOnceLock::new();

impl Recent {
    fn str(&mut self, py: Python<'_>, field: usize, s: &str) -> Py<PyAny> {
        if !REPEATING.contains(&field) {
            return PyString::new(py, s).into_any().unbind();
        }
        if let Some((bytes, obj)) = &self.last[field] {
            if **bytes == *s.as_bytes() {
                return obj.clone_ref(py).into_any();
            }
        }
        let obj = PyString::new(py, s).unbind();
        self.last[field] = Some((s.as_bytes().into(), obj.clone_ref(py)));
        obj.into_any()
    }
}

fn cache(py: Python<'_>) -> PyResult<&Cache> {
    CACHE.get_or_try_init(py, || {
        Ok(Cache {
            names: FIELDS
                .iter()
                .chain(&["raw", "spans"])
                .map(|f| PyString::intern(py, f).unbind())
                .collect(),
            object_new: py
                .import("builtins")?
                .getattr("object")?
                .getattr("__new__")?
                .unbind(),
        })
    })
}

fn value(
    py: Python<'_>,
    r: &mut Reader<'_>,
    key: &str,
    field: usize,
    kind: Kind,
    recent: &mut Recent,
) -> PyResult<Py<PyAny>> {
    // One token read per value: scalars are taken from it; containers and floats rewind to `at`
    // and go through the generic converter (as `msgpack.unpackb` would build them).
    let at = r.position();
    let token = r.next_token().map_err(msgpack_err)?;
    let generic = |r: &mut Reader<'_>| {
        r.skip_to(at);
        convert::value(py, r).map_err(|e| bad(format!("not msgpack: {e}")))
    };
    match (kind, token) {
        (Kind::Str | Kind::StrOrEmpty | Kind::StrOrNone, Token::Str(b)) => {
            let s = std::str::from_utf8(b)
                .map_err(|_| bad(format!("not msgpack: invalid UTF-8 in {key}")))?;
            Ok(recent.str(py, field, s))
        }
        (Kind::StrOrEmpty, Token::Nil) => Ok(PyString::intern(py, "").into_any().unbind()),
        (
            Kind::StrOrNone | Kind::ListOrNone | Kind::Any | Kind::JsonMapOrNone | Kind::JsonAny,
            Token::Nil,
        ) => Ok(py.None()),
        (Kind::Uint, Token::UInt(v)) => v.into_py_any(py),
        (Kind::Uint, Token::Int(v)) if v >= 0 => v.into_py_any(py),
        (Kind::Bool, Token::Bool(b)) => b.into_py_any(py),
        (Kind::Bool, Token::Nil) => Ok(false.into_py_any(py)?),
        (Kind::Float, Token::Nil) => Ok(0.0f64.into_py_any(py)?),
        (Kind::Float, Token::UInt(v)) => Ok((v as f64).into_py_any(py)?),
        (Kind::Float, Token::Int(v)) => Ok((v as f64).into_py_any(py)?),
        (Kind::Float | Kind::LenientFloat, Token::F32(_) | Token::F64(_)) => generic(r),
        (Kind::LenientFloat, Token::UInt(v)) => Ok((v as f64).into_py_any(py)?),
        (Kind::LenientFloat, Token::Int(v)) => Ok((v as f64).into_py_any(py)?),
        (Kind::LenientFloat, _) => {
            // Still valid msgpack (as unpackb demands), then dropped: absent.
            generic(r)?;
            Ok(py.None())
        }
        (Kind::ListOrNone, Token::Array(_)) | (Kind::Any, _) => generic(r),
        (Kind::JsonMapOrNone, Token::Map(_)) | (Kind::JsonAny, _) => {
            r.skip_to(at);
            if let Some(what) = json_shape_violation(r) {
                return Err(bad(format!(
                    "{key} must be JSON-shaped: {what} values are not allowed"
                )));
            }
            generic(r)
        }
        (Kind::Str, _) => Err(bad(format!("{key} must be a str"))),
        (Kind::Uint, _) => Err(bad(format!("{key} must be an unsigned int"))),
        (Kind::StrOrEmpty, _) => Err(bad(format!("{key} must be a str"))),
        (Kind::StrOrNone, _) => Err(bad(format!("{key} must be a str or nil"))),
        (Kind::Bool, _) => Err(bad(format!("{key} must be a bool"))),
        (Kind::Float, _) => Err(bad("timestamp must be a number")),
        (Kind::ListOrNone, _) => Err(bad(format!("{key} must be an array or nil"))),
        (Kind::JsonMapOrNone, _) => Err(bad("options must be a map or nil")),
    }
}

/// Decode one WorkItem into a new instance of `cls` (the `WorkItem` dataclass): every field is set
/// directly, defaults included, so no `__init__` runs. Errors are `WorkItemError`.
///
/// `raw` is `data` itself when it is a `bytes` (no copy), else a `bytes` copy (a mutable buffer must
/// not be spliced later); `spans` locates the `SPLICED` values in it. Both are None for a payload
/// whose offsets do not fit u32.
#[pyfunction]
pub fn decode_work_item(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    cls: &Bound<'_, PyType>,
) -> PyResult<Py<PyAny>> {
    with_bytes(data, |bytes| {
        let mut r = Reader::new(bytes);
        let n = match r.next_token().map_err(msgpack_err)? {
            Token::Map(n) => n,
            _ => return Err(bad("WorkItem must be a map")),
        };
        let mut fields: Vec<(usize, Py<PyAny>)> = Vec::with_capacity(32);
        let mut present = [false; FIELDS.len()];
        let mut spans = [0u8; SPANS_LEN];
        let recent_lock = RECENT.get_or_init(py, || {
            Mutex::new(Recent {
                last: (0..FIELDS.len()).map(|_| None).collect(),
            })
        });
        let mut recent = recent_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for _ in 0..n {
            // A key is one token: a str, another scalar (ignored with its value), or a container
            // (unhashable: an error, as in `msgpack.unpackb`).
            let key = match r.next_token().map_err(msgpack_err)? {
                Token::Str(k) => k,
                Token::Array(_) | Token::Map(_) => {
                    return Err(bad("not msgpack: unhashable map key"))
                }
                _ => {
                    convert::value(py, &mut r).map_err(|e| bad(format!("not msgpack: {e}")))?;
                    continue;
                }
            };
            match field_of(key) {
                Some((i, kind)) => {
                    // A known key is one of the ASCII names in FIELDS: valid UTF-8 by construction.
                    let start = r.position();
                    let v = value(py, &mut r, FIELDS[i], i, kind, &mut recent)?;
                    if let Some(slot) = span_slot(i) {
                        // A repeated key overwrites the span, as it overwrites the value (last wins).
                        let len = r.position() - start;
                        let at = slot * 8;
                        spans[at..at + 4].copy_from_slice(&(start as u32).to_le_bytes());
                        spans[at + 4..at + 8].copy_from_slice(&(len as u32).to_le_bytes());
                    }
                    present[i] = true;
                    fields.push((i, v));
                }
                None => {
                    // Unknown keys are ignored, but must still be valid msgpack (as unpackb demands).
                    std::str::from_utf8(key)
                        .map_err(|_| bad("not msgpack: invalid UTF-8 in a key"))?;
                    convert::value(py, &mut r).map_err(|e| bad(format!("not msgpack: {e}")))?;
                }
            }
        }
        r.finish().map_err(msgpack_err)?;
        let missing: Vec<&str> = FIELDS[..REQUIRED]
            .iter()
            .enumerate()
            .filter(|(i, _)| !present[*i])
            .map(|(_, k)| *k)
            .collect();
        if !missing.is_empty() {
            return Err(bad(format!("WorkItem is missing {}", missing.join(", "))));
        }
        drop(recent);
        let c = cache(py)?;
        let (raw, spans): (Py<PyAny>, Py<PyAny>) = if u32::try_from(bytes.len()).is_ok() {
            let raw = if data.is_instance_of::<PyBytes>() {
                data.clone().unbind()
            } else {
                PyBytes::new(py, bytes).into_any().unbind()
            };
            (raw, PyBytes::new(py, &spans).into_any().unbind())
        } else {
            (py.None(), py.None())
        };
        for (i, default) in DEFAULTS {
            if !present[i] {
                fields.push((i, default(py)?));
            }
        }
        fields.push((RAW_SLOT, raw));
        fields.push((SPANS_SLOT, spans));
        let layout = LAYOUT
            .get_or_try_init(py, || SlotLayout::of(cls, &c.names))?
            .as_ref()
            .filter(|l| l.is_for(cls));
        if let Some(layout) = layout {
            // Straight into the slots of a fresh instance; a key given twice overwrites, as setattr.
            let obj = layout.alloc(py)?;
            for (i, v) in fields {
                layout.put(&obj, i, v);
            }
            return Ok(obj.unbind());
        }
        let obj = c.object_new.bind(py).call1((cls,))?;
        for (i, v) in fields {
            obj.setattr(c.names[i].bind(py), v)?;
        }
        Ok(obj.unbind())
    })
}

/// Every field of the dataclass, for the static names used with `setattr`.
const FIELDS: [&str; 31] = [
    "work_item_id",
    "request_id",
    "item_index",
    "total_items",
    "operation",
    "model_id",
    "pool_name",
    "machine_profile",
    "reply_subject",
    "profile_id",
    "engine",
    "admission_pool",
    "item",
    "payload_ref",
    "output_types",
    "instruction",
    "is_query",
    "options",
    "query_item",
    "query_payload_ref",
    "score_items",
    "labels",
    "output_schema",
    "bundle_config_hash",
    "router_id",
    "timestamp",
    "accepts_result_chunks",
    "traceparent",
    "tracestate",
    "deadline",
    "fallback_reason",
];

type Default = fn(Python<'_>) -> PyResult<Py<PyAny>>;

fn empty(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(PyString::intern(py, "").into_any().unbind())
}
fn none(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}
fn no(py: Python<'_>) -> PyResult<Py<PyAny>> {
    false.into_py_any(py)
}
fn zero(py: Python<'_>) -> PyResult<Py<PyAny>> {
    0.0f64.into_py_any(py)
}

/// The optional fields and their defaults (the required ones are always set from the map).
const DEFAULTS: [(usize, Default); 22] = [
    (9, empty),
    (10, empty),
    (11, empty),
    (12, none),
    (13, none),
    (14, none),
    (15, none),
    (16, no),
    (17, none),
    (18, none),
    (19, none),
    (20, none),
    (21, none),
    (22, none),
    (23, empty),
    (24, empty),
    (25, zero),
    (26, no),
    (27, none),
    (28, none),
    (29, none),
    (30, none),
];

#[cfg(test)]
mod tests {
    use super::json_shape_violation;
    use sie_core::msgpack::Reader;

    fn violation(bytes: &[u8]) -> Option<&'static str> {
        json_shape_violation(&mut Reader::new(bytes))
    }

    #[test]
    fn json_shape_finds_the_first_bin_or_ext_in_document_order() {
        // {"a": [1, "x", {"b": nil}]}: JSON-shaped.
        assert_eq!(violation(b"\x81\xa1a\x93\x01\xa1x\x81\xa1b\xc0"), None);
        // {"a": bin8(1)}
        assert_eq!(violation(b"\x81\xa1a\xc4\x01z"), Some("binary"));
        // {bin key: 1}: keys count too.
        assert_eq!(violation(b"\x81\xc4\x01k\x01"), Some("binary"));
        // [fixext1, bin]: the ext comes first.
        assert_eq!(violation(b"\x92\xd4\x05\x00\xc4\x00"), Some("ext"));
        // A Timestamp (ext -1) is ext.
        assert_eq!(violation(b"\xd6\xff\x00\x00\x00\x01"), Some("ext"));
        // The value ends where it ends: a bin after it is not looked at.
        assert_eq!(violation(b"\x91\x01\xc4\x00"), None);
        // Malformed bytes are the converter's to report.
        assert_eq!(violation(b"\x92\x01"), None);
    }
}
