//! Response envelopes, chunk frames and the typed BatchOutcome decoder.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3::IntoPyObjectExt;

use sie_core::ipc::{self, Response, ResponseError};
use sie_core::msgpack::{DecodeError, DecodeResult, Reader, Token};
use sie_core::results::{Units, LEGACY_UNIT_KEYS, UNIT_KEYS};

use crate::buffers::{slice_view, with_bytes};
use crate::convert;
use crate::errors;

/// An ordinary IPC response; `body` is a view of the body map's bytes inside the frame.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct ResponseEnvelope {
    pub version: u64,
    pub request_id: String,
    pub ok: bool,
    pub body: Option<Py<PyAny>>,
    pub error: Option<String>,
}

#[pymethods]
impl ResponseEnvelope {
    fn __repr__(&self) -> String {
        format!(
            "ResponseEnvelope(version={}, request_id={:?}, ok={}, error={:?})",
            self.version, self.request_id, self.ok, self.error
        )
    }
}

/// One IpcResponseChunkV1 frame; `payload` is a view into the frame.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct IpcResponseChunk {
    pub version: u64,
    pub request_id: String,
    pub transfer_digest: Py<PyBytes>,
    pub chunk_index: u64,
    pub chunk_count: u64,
    pub total_bytes: u64,
    pub payload: Py<PyAny>,
    pub frame_len: usize,
}

#[pymethods]
impl IpcResponseChunk {
    fn __repr__(&self) -> String {
        format!(
            "IpcResponseChunk(request_id={:?}, chunk_index={}, chunk_count={}, total_bytes={})",
            self.request_id, self.chunk_index, self.chunk_count, self.total_bytes
        )
    }
}

/// Decode a response frame body into an envelope or a chunk (key-order independent).
#[pyfunction]
pub fn decode_response(py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    with_bytes(frame, |bytes| match ipc::decode_response(bytes) {
        Ok(Response::Envelope(e)) => {
            let body = match e.body {
                Some((a, b)) => Some(slice_view(frame, a, b)?),
                None => None,
            };
            ResponseEnvelope {
                version: e.version,
                request_id: e.request_id.to_owned(),
                ok: e.ok,
                body,
                error: e.error.map(str::to_owned),
            }
            .into_py_any(py)
        }
        Ok(Response::Chunk(c)) => IpcResponseChunk {
            version: c.version,
            request_id: c.request_id.to_owned(),
            transfer_digest: PyBytes::new(py, c.transfer_digest).unbind(),
            chunk_index: c.chunk_index,
            chunk_count: c.chunk_count,
            total_bytes: c.total_bytes,
            payload: slice_view(frame, c.payload.0, c.payload.1)?,
            frame_len: c.frame_len,
        }
        .into_py_any(py),
        Err(ResponseError::Decode(e)) => Err(errors::decode(e)),
        Err(ResponseError::Chunk(m)) => Err(errors::DecodeError::new_err(m)),
    })
}

/// Apply the client rules of wire-protocol §2.2 and return the body view.
#[pyfunction]
pub fn response_body(
    py: Python<'_>,
    env: &Bound<'_, PyAny>,
    request_id: &str,
) -> PyResult<Py<PyAny>> {
    let env = env
        .cast::<ResponseEnvelope>()
        .map_err(|_| errors::ProtocolError::new_err("expected a ResponseEnvelope"))?
        .get();
    if env.version != ipc::IPC_VERSION {
        return Err(errors::ProtocolError::new_err(format!(
            "IPC version mismatch: response version {}",
            env.version
        )));
    }
    if env.request_id != request_id {
        return Err(errors::ProtocolError::new_err(format!(
            "response request_id {:?} does not match the request's {request_id:?}",
            env.request_id
        )));
    }
    if !env.ok {
        return Err(errors::IpcServerError::new_err(
            env.error.clone().unwrap_or_default(),
        ));
    }
    match &env.body {
        Some(body) => Ok(body.clone_ref(py)),
        None => Err(errors::ProtocolError::new_err("body missing")),
    }
}

/// Generic msgpack decode of a body (or any value).
#[pyfunction]
pub fn decode_body(py: Python<'_>, raw: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    with_bytes(raw, |bytes| convert::whole(py, bytes))
}

/// One item's outcome from the backend (wire-protocol §4.6).
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct ItemOutcome {
    pub work_item_id: String,
    pub request_id: String,
    pub item_index: u64,
    pub disposition: Py<PyAny>,
    pub nak_delay_ms: Option<u64>,
    pub result_msgpack: Py<PyBytes>,
    pub error: Option<String>,
    pub error_code: Option<String>,
    pub inference_ms: Option<f64>,
    pub tokenization_ms: Option<f64>,
    pub postprocessing_ms: Option<f64>,
    pub raw_output: Option<Py<PyAny>>,
    pub units: Option<Py<PyDict>>,
    pub retry_after_s: Option<u64>,
}

#[pymethods]
impl ItemOutcome {
    fn __repr__(&self) -> String {
        format!(
            "ItemOutcome(work_item_id={:?}, disposition={}, error_code={:?})",
            self.work_item_id, self.disposition, self.error_code
        )
    }
}

/// A shared f16 buffer of a BatchOutcome (wire-protocol §4.7).
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct BatchedF16Multivector {
    pub values_f16: Py<PyBytes>,
    pub items: Py<PyList>,
}

/// The decoded response of a batch RPC.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct BatchOutcome {
    pub outcomes: Py<PyList>,
    pub batched_f16_multivectors: Py<PyList>,
}

const DISPOSITIONS: [&str; 3] = ["publish_and_ack", "publish_error_and_ack", "nak_retry"];

/// Interned disposition strings and `units` keys, so 256 outcomes share them (a fresh key str
/// per count was five allocations and five hashes per outcome).
struct Interned {
    dispositions: [Py<PyAny>; 3],
    unit_keys: [Py<PyAny>; 7],
}

impl Interned {
    fn new(py: Python<'_>) -> Self {
        Self {
            dispositions: DISPOSITIONS
                .map(|d| pyo3::types::PyString::intern(py, d).into_any().unbind()),
            unit_keys: UNIT_KEYS.map(|k| pyo3::types::PyString::intern(py, k).into_any().unbind()),
        }
    }
}

fn err<T>(r: &Reader<'_>, message: impl Into<String>) -> PyResult<T> {
    Err(errors::decode(DecodeError::new(r.position(), message)))
}

fn de<T>(res: DecodeResult<T>) -> PyResult<T> {
    res.map_err(errors::decode)
}

fn owned(s: &str) -> String {
    s.to_owned()
}

/// `result_msgpack`: absent/nil → b"", bin, str (its UTF-8 bytes) or an array of byte values.
fn result_bytes<'py>(py: Python<'py>, r: &mut Reader<'_>) -> PyResult<Bound<'py, PyBytes>> {
    let at = r.position();
    match de(r.next_token())? {
        Token::Nil => Ok(PyBytes::new(py, b"")),
        Token::Bin(b) | Token::Str(b) => Ok(PyBytes::new(py, b)),
        Token::Array(n) => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let x = de(r.read_uint("result_msgpack byte"))?;
                if x > 255 {
                    return err(r, "result_msgpack byte value over 255");
                }
                v.push(x as u8);
            }
            Ok(PyBytes::new(py, &v))
        }
        other => Err(errors::decode(DecodeError::new(
            at,
            format!("result_msgpack must be bytes, got {}", other.type_name()),
        ))),
    }
}

/// UnitCounts from a named map (unknown keys dropped) or a legacy positional array.
fn units<'py>(
    py: Python<'py>,
    r: &mut Reader<'_>,
    interned: &Interned,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(counts) = unit_counts(r)? else {
        return Ok(None);
    };
    let dict = PyDict::new(py);
    for (i, (k, v)) in interned.unit_keys.iter().zip(counts).enumerate() {
        if i < LEGACY_UNIT_KEYS || v.is_some() {
            dict.set_item(k.bind(py), v)?; // the five always; the newer keys only when present
        }
    }
    Ok(Some(dict))
}

/// The counts of a `units` value (nil: `None`), as `units` reads them: a named map by key, a
/// legacy positional array for the five v0.7.1 keys only (beyond `pairs` peers disagree on order).
pub fn unit_counts(r: &mut Reader<'_>) -> PyResult<Option<Units>> {
    let at = r.position();
    let mut counts: Units = [None; 7];
    match de(r.next_token())? {
        Token::Nil => return Ok(None),
        Token::Map(n) => {
            for _ in 0..n {
                let slot = match de(r.next_token())? {
                    Token::Str(key) => UNIT_KEYS.iter().position(|k| k.as_bytes() == key),
                    Token::Array(_) | Token::Map(_) => {
                        return err(r, "units map key must be a scalar")
                    }
                    _ => None,
                };
                match slot {
                    Some(i) => counts[i] = de(r.read_opt_uint("unit count"))?,
                    None => {
                        de(r.skip_value())?;
                    }
                }
            }
        }
        Token::Array(n) => {
            let named = n.min(LEGACY_UNIT_KEYS);
            for slot in counts.iter_mut().take(named) {
                *slot = de(r.read_opt_uint("unit count"))?;
            }
            for _ in named..n {
                de(r.skip_value())?;
            }
        }
        other => {
            return Err(errors::decode(DecodeError::new(
                at,
                format!("units must be a map or an array, got {}", other.type_name()),
            )))
        }
    }
    Ok(Some(counts))
}

fn item_outcome(py: Python<'_>, r: &mut Reader<'_>, interned: &Interned) -> PyResult<ItemOutcome> {
    let n = de(r.read_map_len("ItemOutcome"))?;
    let (mut work_item_id, mut request_id, mut item_index, mut disposition) =
        (None, None, None, None);
    let mut o = ItemOutcome {
        work_item_id: String::new(),
        request_id: String::new(),
        item_index: 0,
        disposition: py.None(),
        nak_delay_ms: None,
        result_msgpack: PyBytes::new(py, b"").unbind(),
        error: None,
        error_code: None,
        inference_ms: None,
        tokenization_ms: None,
        postprocessing_ms: None,
        raw_output: None,
        units: None,
        retry_after_s: None,
    };
    for _ in 0..n {
        let key = de(r.read_key())?;
        match key {
            b"work_item_id" => work_item_id = Some(owned(de(r.read_str("work_item_id"))?)),
            b"request_id" => request_id = Some(owned(de(r.read_str("request_id"))?)),
            b"item_index" => item_index = Some(de(r.read_uint("item_index"))?),
            b"disposition" => {
                let d = de(r.read_str("disposition"))?;
                match DISPOSITIONS.iter().position(|x| *x == d) {
                    Some(i) => disposition = Some(interned.dispositions[i].clone_ref(py)),
                    None => return err(r, format!("unknown disposition {d:?}")),
                }
            }
            b"nak_delay_ms" => o.nak_delay_ms = de(r.read_opt_uint("nak_delay_ms"))?,
            b"result_msgpack" => o.result_msgpack = result_bytes(py, r)?.unbind(),
            b"error" => o.error = de(r.read_opt_str("error"))?.map(owned),
            b"error_code" => o.error_code = de(r.read_opt_str("error_code"))?.map(owned),
            b"inference_ms" => o.inference_ms = de(r.read_opt_float("inference_ms"))?,
            b"tokenization_ms" => o.tokenization_ms = de(r.read_opt_float("tokenization_ms"))?,
            b"postprocessing_ms" => {
                o.postprocessing_ms = de(r.read_opt_float("postprocessing_ms"))?
            }
            b"raw_output" => {
                if !r.peek_nil()
                    && !matches!(r.input().get(r.position()), Some(0x80..=0x8f | 0xde | 0xdf))
                {
                    return err(r, "raw_output must be a map or nil");
                }
                let v = convert::value(py, r)?;
                o.raw_output = if v.is_none(py) { None } else { Some(v) };
            }
            b"units" => o.units = units(py, r, interned)?.map(Bound::unbind),
            b"retry_after_s" => o.retry_after_s = de(r.read_opt_uint("retry_after_s"))?,
            _ => {
                de(r.skip_value())?;
            }
        }
    }
    let (Some(w), Some(q), Some(i), Some(d)) = (work_item_id, request_id, item_index, disposition)
    else {
        return err(
            r,
            "ItemOutcome is missing work_item_id, request_id, item_index or disposition",
        );
    };
    o.work_item_id = w;
    o.request_id = q;
    o.item_index = i;
    o.disposition = d;
    Ok(o)
}

const F16_ITEM_KEYS: [&str; 5] = [
    "work_item_id",
    "byte_offset",
    "byte_len",
    "num_tokens",
    "token_dims",
];

fn batched_f16(py: Python<'_>, r: &mut Reader<'_>) -> PyResult<BatchedF16Multivector> {
    let n = de(r.read_map_len("BatchedF16MultivectorOutput"))?;
    let (mut values, mut items) = (None, None);
    for _ in 0..n {
        match de(r.read_key())? {
            b"values_f16" => {
                let b = de(r.read_bin("values_f16"))?;
                if b.len() % 2 != 0 {
                    return err(r, "values_f16 has an odd byte length");
                }
                values = Some(PyBytes::new(py, b).unbind());
            }
            b"items" => {
                let list = PyList::empty(py);
                let at = r.position();
                let count = match de(r.next_token())? {
                    Token::Array(c) => c,
                    other => {
                        return Err(errors::decode(DecodeError::new(
                            at,
                            format!("items must be an array, got {}", other.type_name()),
                        )))
                    }
                };
                for _ in 0..count {
                    let m = de(r.read_map_len("BatchedF16MultivectorItem"))?;
                    let mut fields: [Option<Py<PyAny>>; 5] = Default::default();
                    for _ in 0..m {
                        let key = de(r.read_key())?;
                        match F16_ITEM_KEYS.iter().position(|k| k.as_bytes() == key) {
                            Some(0) => {
                                fields[0] = Some(de(r.read_str("work_item_id"))?.into_py_any(py)?)
                            }
                            Some(i) => {
                                fields[i] =
                                    Some(de(r.read_uint(F16_ITEM_KEYS[i]))?.into_py_any(py)?)
                            }
                            None => {
                                de(r.skip_value())?;
                            }
                        }
                    }
                    let dict = PyDict::new(py);
                    for (k, v) in F16_ITEM_KEYS.iter().zip(fields) {
                        match v {
                            Some(v) => dict.set_item(k, v)?,
                            None => return err(r, format!("batched f16 item is missing {k}")),
                        }
                    }
                    list.append(dict)?;
                }
                items = Some(list.unbind());
            }
            _ => {
                de(r.skip_value())?;
            }
        }
    }
    match (values, items) {
        (Some(values_f16), Some(items)) => Ok(BatchedF16Multivector { values_f16, items }),
        _ => err(
            r,
            "BatchedF16MultivectorOutput is missing values_f16 or items",
        ),
    }
}

/// Decode a BatchOutcome body into typed outcomes in one pass over the bytes.
#[pyfunction]
pub fn decode_batch_outcome(py: Python<'_>, raw: &Bound<'_, PyAny>) -> PyResult<BatchOutcome> {
    with_bytes(raw, |bytes| {
        let interned = Interned::new(py);
        let mut r = Reader::new(bytes);
        let n = de(r.read_map_len("BatchOutcome"))?;
        let mut outcomes = None;
        let batched = PyList::empty(py);
        for _ in 0..n {
            match de(r.read_key())? {
                b"outcomes" => {
                    let at = r.position();
                    let count = match de(r.next_token())? {
                        Token::Array(c) => c,
                        other => {
                            return Err(errors::decode(DecodeError::new(
                                at,
                                format!("outcomes must be an array, got {}", other.type_name()),
                            )))
                        }
                    };
                    let list = PyList::empty(py);
                    for _ in 0..count {
                        list.append(Bound::new(py, item_outcome(py, &mut r, &interned)?)?)?;
                    }
                    outcomes = Some(list);
                }
                b"batched_f16_multivectors" => {
                    if r.peek_nil() {
                        de(r.skip_value())?;
                        continue;
                    }
                    let at = r.position();
                    let count = match de(r.next_token())? {
                        Token::Array(c) => c,
                        other => {
                            return Err(errors::decode(DecodeError::new(
                                at,
                                format!(
                                    "batched_f16_multivectors must be an array, got {}",
                                    other.type_name()
                                ),
                            )))
                        }
                    };
                    for _ in 0..count {
                        batched.append(Bound::new(py, batched_f16(py, &mut r)?)?)?;
                    }
                }
                _ => {
                    de(r.skip_value())?;
                }
            }
        }
        de(r.finish())?;
        match outcomes {
            Some(list) => Ok(BatchOutcome {
                outcomes: list.unbind(),
                batched_f16_multivectors: batched.unbind(),
            }),
            None => err(&r, "BatchOutcome is missing outcomes"),
        }
    })
}
