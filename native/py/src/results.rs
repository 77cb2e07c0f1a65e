//! WorkResult encoding, reply planning (single / ResultChunkV1 / compact error) and the
//! gateway-side ResultChunkV1 assembler, for Python.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::IntoPyObjectExt;

use sie_core::msgpack::{Counter, SliceWriter};
use sie_core::results::{
    self as core, chunk_range, encode_result_chunk as write_chunk,
    encode_work_result as write_result, plan_chunk_count, ChunkIdentity, ResultAssembler,
    WorkResultRef,
};

use crate::assembler::HashlibSha256;
use crate::buffers::with_bytes;
use crate::errors;
use crate::replies::read_units;

/// Owned copies of the string fields of a `sie_sidecar.types.WorkResult`.
struct Fields {
    work_item_id: String,
    request_id: String,
    item_index: u64,
    success: bool,
    error: Option<String>,
    error_code: Option<String>,
    inference_ms: Option<f64>,
    queue_ms: Option<f64>,
    processing_ms: Option<f64>,
    worker_id: Option<String>,
    tokenization_ms: Option<f64>,
    postprocessing_ms: Option<f64>,
    payload_fetch_ms: Option<f64>,
    units: Option<sie_core::results::Units>,
    worker_direct: bool,
    executed_bundle_config_hash: Option<String>,
    retry_after_s: Option<u64>,
}

impl Fields {
    fn read(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let units_obj = obj.getattr("units")?;
        let units = if units_obj.is_none() {
            None
        } else {
            read_units(Some(units_obj.cast::<PyDict>()?))?
        };
        Ok(Self {
            work_item_id: obj.getattr("work_item_id")?.extract()?,
            request_id: obj.getattr("request_id")?.extract()?,
            item_index: obj.getattr("item_index")?.extract()?,
            success: obj.getattr("success")?.extract()?,
            error: obj.getattr("error")?.extract()?,
            error_code: obj.getattr("error_code")?.extract()?,
            inference_ms: obj.getattr("inference_ms")?.extract()?,
            queue_ms: obj.getattr("queue_ms")?.extract()?,
            processing_ms: obj.getattr("processing_ms")?.extract()?,
            worker_id: obj.getattr("worker_id")?.extract()?,
            tokenization_ms: obj.getattr("tokenization_ms")?.extract()?,
            postprocessing_ms: obj.getattr("postprocessing_ms")?.extract()?,
            payload_fetch_ms: obj.getattr("payload_fetch_ms")?.extract()?,
            units,
            worker_direct: obj.getattr("worker_direct")?.extract()?,
            executed_bundle_config_hash: obj.getattr("executed_bundle_config_hash")?.extract()?,
            retry_after_s: obj.getattr("retry_after_s")?.extract()?,
        })
    }

    fn as_ref<'a>(&'a self, result_msgpack: &'a [u8]) -> WorkResultRef<'a> {
        WorkResultRef {
            work_item_id: &self.work_item_id,
            request_id: &self.request_id,
            item_index: self.item_index,
            success: self.success,
            result_msgpack,
            error: self.error.as_deref(),
            error_code: self.error_code.as_deref(),
            inference_ms: self.inference_ms,
            queue_ms: self.queue_ms,
            processing_ms: self.processing_ms,
            worker_id: self.worker_id.as_deref(),
            tokenization_ms: self.tokenization_ms,
            postprocessing_ms: self.postprocessing_ms,
            payload_fetch_ms: self.payload_fetch_ms,
            units: self.units,
            worker_direct: self.worker_direct,
            executed_bundle_config_hash: self.executed_bundle_config_hash.as_deref(),
            retry_after_s: self.retry_after_s,
        }
    }
}

fn encode<'py>(py: Python<'py>, r: &WorkResultRef<'_>) -> PyResult<Bound<'py, PyBytes>> {
    let mut c = Counter::default();
    write_result(&mut c, r);
    PyBytes::new_with(py, c.0, |buf| {
        write_result(&mut SliceWriter::new(buf), r);
        Ok(())
    })
}

/// Encode a `WorkResult` as the v0.7.1 sidecar does (TV-R2).
#[pyfunction]
pub fn encode_work_result<'py>(
    py: Python<'py>,
    result: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let fields = Fields::read(result)?;
    let payload = result.getattr("result_msgpack")?;
    with_bytes(&payload, |bytes| encode(py, &fields.as_ref(bytes)))
}

/// Encode one ResultChunkV1 envelope (TV-R1, TV-R3).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn encode_result_chunk<'py>(
    py: Python<'py>,
    work_item_id: &str,
    request_id: &str,
    item_index: u64,
    transfer_digest: &Bound<'py, PyAny>,
    chunk_index: u64,
    chunk_count: u64,
    total_bytes: u64,
    payload: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let id = ChunkIdentity {
        work_item_id,
        request_id,
        item_index,
    };
    with_bytes(transfer_digest, |digest| {
        with_bytes(payload, |payload| {
            let mut c = Counter::default();
            write_chunk(
                &mut c,
                &id,
                digest,
                chunk_index,
                chunk_count,
                total_bytes,
                payload,
            );
            PyBytes::new_with(py, c.0, |buf| {
                write_chunk(
                    &mut SliceWriter::new(buf),
                    &id,
                    digest,
                    chunk_index,
                    chunk_count,
                    total_bytes,
                    payload,
                );
                Ok(())
            })
        })
    })
}

/// How to publish one WorkResult.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct ReplyPlan {
    pub mode: &'static str,
    pub messages: Py<PyList>,
    pub total_bytes: usize,
    pub transfer_digest: Option<Py<PyBytes>>,
}

#[pymethods]
impl ReplyPlan {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ReplyPlan(mode={:?}, messages={}, total_bytes={})",
            self.mode,
            self.messages.bind(py).len(),
            self.total_bytes
        )
    }
}

fn sha256<'py>(py: Python<'py>, data: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(py
        .import("hashlib")?
        .call_method1("sha256", (data,))?
        .call_method0("digest")?
        .cast_into::<PyBytes>()?)
}

/// Plan the publication of one WorkResult (wire-protocol §8.3, §9.3).
#[pyfunction]
#[pyo3(signature = (result, *, accepts_result_chunks, max_payload))]
pub fn plan_reply(
    py: Python<'_>,
    result: &Bound<'_, PyAny>,
    accepts_result_chunks: bool,
    max_payload: u64,
) -> PyResult<ReplyPlan> {
    let fields = Fields::read(result)?;
    let payload = result.getattr("result_msgpack")?;
    let encoded = with_bytes(&payload, |bytes| encode(py, &fields.as_ref(bytes)))?;
    let total = encoded.as_bytes().len();
    if total as u64 <= max_payload {
        return Ok(ReplyPlan {
            mode: "single",
            messages: PyList::new(py, [encoded])?.unbind(),
            total_bytes: total,
            transfer_digest: None,
        });
    }
    let id = ChunkIdentity {
        work_item_id: &fields.work_item_id,
        request_id: &fields.request_id,
        item_index: fields.item_index,
    };
    if accepts_result_chunks {
        if let Some(n) = plan_chunk_count(&id, total as u64, max_payload) {
            let digest = sha256(py, &encoded)?;
            let whole = encoded.as_bytes();
            let messages = PyList::empty(py);
            for i in 0..n {
                let (a, b) = chunk_range(total as u64, i, n);
                let len = core::chunk_envelope_len(&id, i, n, total as u64, b - a);
                let msg = PyBytes::new_with(py, len, |buf| {
                    write_chunk(
                        &mut SliceWriter::new(buf),
                        &id,
                        digest.as_bytes(),
                        i,
                        n,
                        total as u64,
                        &whole[a..b],
                    );
                    Ok(())
                })?;
                messages.append(msg)?;
            }
            return Ok(ReplyPlan {
                mode: "chunked",
                messages: messages.unbind(),
                total_bytes: total,
                transfer_digest: Some(digest.unbind()),
            });
        }
    }
    let message = format!(
        "Encoded result exceeds the transport limit ({total} > {max_payload} bytes); reduce the input length or requested output size."
    );
    let mut compact = fields.as_ref(&[]);
    compact.success = false;
    compact.error = Some(&message);
    compact.error_code = Some("PAYLOAD_TOO_LARGE");
    let compact = encode(py, &compact)?;
    if compact.as_bytes().len() as u64 > max_payload {
        return Err(errors::PayloadTooLarge::new_err(format!(
            "even the compact PAYLOAD_TOO_LARGE result ({} bytes) exceeds max_payload {max_payload}",
            compact.as_bytes().len()
        )));
    }
    Ok(ReplyPlan {
        mode: "compact_error",
        messages: PyList::new(py, [compact])?.unbind(),
        total_bytes: total,
        transfer_digest: None,
    })
}

/// Gateway-side ResultChunkV1 reassembly (tests and the load generator).
#[pyclass(module = "sie_sidecar._native")]
pub struct ResultChunkAssembler {
    inner: ResultAssembler,
}

#[pymethods]
impl ResultChunkAssembler {
    #[new]
    #[pyo3(signature = (max_total = core::MAX_CHUNKED_RESULT))]
    fn new(max_total: u64) -> Self {
        Self {
            inner: ResultAssembler::new(max_total),
        }
    }

    #[getter]
    fn pending(&self) -> usize {
        self.inner.pending()
    }

    /// Feed one envelope; `(work_item_id, WorkResult bytes)` once the transfer verified.
    fn feed<'py>(
        &mut self,
        py: Python<'py>,
        envelope: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        with_bytes(envelope, |bytes| {
            match self.inner.feed(bytes, HashlibSha256::new) {
                Ok(None) => Ok(None),
                Ok(Some((id, whole))) => Ok(Some(PyTuple::new(
                    py,
                    [
                        id.into_py_any(py)?,
                        PyBytes::new(py, &whole).into_any().unbind(),
                    ],
                )?)),
                Err(e) => Err(errors::ChunkProtocolError::new_err(e.0)),
            }
        })
    }
}
