//! IpcResponseChunkV1 reassembly for Python: the process-wide budget, the per-RPC assembler and
//! the assembled response that holds its reservation until the typed decode is done.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;
use pyo3::{ffi, IntoPyObjectExt};

use sie_core::chunks::{
    self, Assembler, Budget, ChunkLimits as CoreLimits, Reservation, Sha256Sink,
};
use sie_core::ipc::{ChunkFrame, DIGEST_LEN};

use crate::buffers::{fill_readonly, with_bytes};
use crate::envelopes::{decode_response, IpcResponseChunk, ResponseEnvelope};
use crate::errors;

/// SHA-256 through Python's hashlib (OpenSSL); it releases the GIL on large updates.
pub struct HashlibSha256 {
    obj: Py<PyAny>,
}

impl HashlibSha256 {
    pub fn new() -> Result<Self, String> {
        Python::attach(|py| {
            let obj = py
                .import("hashlib")
                .and_then(|m| m.call_method0("sha256"))
                .map_err(|e| e.to_string())?;
            Ok(Self { obj: obj.unbind() })
        })
    }
}

impl Sha256Sink for HashlibSha256 {
    fn update(&mut self, data: &[u8]) -> Result<(), String> {
        Python::attach(|py| {
            // SAFETY: the memoryview borrows `data` read-only and is dropped before we return,
            // so it never outlives the slice.
            let view = unsafe {
                let ptr = ffi::PyMemoryView_FromMemory(
                    data.as_ptr() as *mut std::ffi::c_char,
                    data.len() as ffi::Py_ssize_t,
                    ffi::PyBUF_READ,
                );
                Bound::from_owned_ptr_or_err(py, ptr)
            }
            .map_err(|e| e.to_string())?;
            let result = self.obj.bind(py).call_method1("update", (&view,));
            let _ = view.call_method0("release");
            result.map(|_| ()).map_err(|e| e.to_string())
        })
    }

    fn finalize(&mut self) -> Result<[u8; DIGEST_LEN], String> {
        Python::attach(|py| {
            let digest = self
                .obj
                .bind(py)
                .call_method0("digest")
                .map_err(|e| e.to_string())?;
            let bytes: &[u8] = digest
                .cast::<PyBytes>()
                .map_err(|e| e.to_string())?
                .as_bytes();
            bytes
                .try_into()
                .map_err(|_| "digest is not 32 bytes".to_owned())
        })
    }
}

/// Limits of the chunked-response protocol (the pinned v1 values unless a test relaxes them).
#[pyclass(frozen, get_all, eq, module = "sie_sidecar._native")]
#[derive(Clone, PartialEq)]
pub struct ChunkLimits {
    pub legacy_ceiling: u64,
    pub max_chunk_payload: u64,
    pub max_chunk_frame: u64,
    pub max_total: u64,
    pub max_chunks: u64,
}

#[pymethods]
impl ChunkLimits {
    #[new]
    #[pyo3(signature = (
        legacy_ceiling = CoreLimits::PRODUCTION.legacy_ceiling,
        max_chunk_payload = CoreLimits::PRODUCTION.max_chunk_payload,
        max_chunk_frame = CoreLimits::PRODUCTION.max_chunk_frame,
        max_total = CoreLimits::PRODUCTION.max_total,
        max_chunks = CoreLimits::PRODUCTION.max_chunks,
    ))]
    fn new(
        legacy_ceiling: u64,
        max_chunk_payload: u64,
        max_chunk_frame: u64,
        max_total: u64,
        max_chunks: u64,
    ) -> Self {
        Self {
            legacy_ceiling,
            max_chunk_payload,
            max_chunk_frame,
            max_total,
            max_chunks,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ChunkLimits(legacy_ceiling={}, max_chunk_payload={}, max_chunk_frame={}, max_total={}, max_chunks={})",
            self.legacy_ceiling, self.max_chunk_payload, self.max_chunk_frame, self.max_total, self.max_chunks
        )
    }
}

impl ChunkLimits {
    pub fn production() -> Self {
        let p = CoreLimits::PRODUCTION;
        Self::new(
            p.legacy_ceiling,
            p.max_chunk_payload,
            p.max_chunk_frame,
            p.max_total,
            p.max_chunks,
        )
    }

    pub fn core(&self) -> CoreLimits {
        CoreLimits {
            legacy_ceiling: self.legacy_ceiling,
            max_chunk_payload: self.max_chunk_payload,
            max_chunk_frame: self.max_chunk_frame,
            max_total: self.max_total,
            max_chunks: self.max_chunks,
        }
    }
}

/// Memory budget for chunked-response reassembly, with outcome counters.
#[pyclass(frozen, module = "sie_sidecar._native")]
pub struct ResponseBudget {
    inner: Arc<Budget>,
}

#[pymethods]
impl ResponseBudget {
    #[new]
    #[pyo3(signature = (capacity = chunks::DEFAULT_BUDGET))]
    fn new(capacity: u64) -> Self {
        Self {
            inner: Budget::new(capacity),
        }
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    #[getter]
    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }

    #[getter]
    fn completed(&self) -> u64 {
        self.inner
            .completed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    #[getter]
    fn protocol_error(&self) -> u64 {
        self.inner
            .protocol_error
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of the one reassembly buffer kept for reuse (0 when none is kept).
    #[getter]
    fn spare_buffer(&self) -> usize {
        self.inner.spare_capacity()
    }

    #[getter]
    fn budget_rejected(&self) -> u64 {
        self.inner
            .budget_rejected
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn __repr__(&self) -> String {
        format!(
            "ResponseBudget(capacity={}, reserved={}, completed={}, protocol_error={}, budget_rejected={})",
            self.capacity(),
            self.reserved(),
            self.completed(),
            self.protocol_error(),
            self.budget_rejected()
        )
    }
}

static PROCESS_BUDGET: PyOnceLock<Py<ResponseBudget>> = PyOnceLock::new();

/// The process-wide budget shared by every connection.
#[pyfunction]
pub fn response_budget(py: Python<'_>) -> PyResult<Py<ResponseBudget>> {
    PROCESS_BUDGET
        .get_or_try_init(py, || {
            Py::new(py, ResponseBudget::new(chunks::DEFAULT_BUDGET))
        })
        .map(|b| b.clone_ref(py))
}

/// A complete response: a legacy envelope, or reassembled bytes holding their reservation.
#[pyclass(frozen, module = "sie_sidecar._native")]
pub struct AssembledResponse {
    data: Arc<Vec<u8>>,
    envelope: Option<Py<PyAny>>,
    reservation: Mutex<Option<Reservation>>,
    reserved: u64,
    /// Where the buffer goes back for reuse once nothing views it any more.
    recycle_to: Option<Arc<Budget>>,
}

impl Drop for AssembledResponse {
    fn drop(&mut self) {
        // Every memoryview of this object holds a reference to it, so by now nothing else can
        // see the bytes: hand the (already faulted-in) buffer to the budget for the next transfer.
        if let Some(budget) = self.recycle_to.take() {
            if let Ok(buf) = Arc::try_unwrap(std::mem::take(&mut self.data)) {
                budget.give_back(buf);
            }
        }
    }
}

impl AssembledResponse {
    /// The reassembled bytes did not decode: release and count a protocol error.
    fn fail(&self) {
        if let Some(r) = self.reservation.lock().ok().and_then(|mut g| g.take()) {
            r.fail();
        }
    }
}

#[pymethods]
impl AssembledResponse {
    /// # Safety
    /// Called by CPython with a valid `view`; delegates to the shared-bytes exporter logic.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        // SAFETY: forwarded from CPython; `slf` owns the Arc'd bytes for the view's lifetime.
        unsafe { fill_readonly(slf.as_any(), slf.get().data.as_slice(), view, flags) }
    }

    /// # Safety
    /// Nothing to release: the memory lives as long as the object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    /// A read-only memoryview of the response bytes.
    #[getter]
    fn view(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Ok(pyo3::types::PyMemoryView::from(slf.as_any())?
            .into_any()
            .unbind())
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.data.len()
    }

    /// Bytes still held against the budget (0 after release, and for legacy responses).
    #[getter]
    fn reservation(&self) -> u64 {
        match self.reservation.lock() {
            Ok(guard) if guard.is_some() => self.reserved,
            _ => 0,
        }
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    /// Decode as an ordinary envelope; a reassembled chunk is a protocol error.
    fn decode(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if let Some(env) = &slf.get().envelope {
            return Ok(env.clone_ref(py));
        }
        // A response that can not be decoded is dead weight: give its reservation back at once.
        let decoded = decode_response(py, slf.as_any()).inspect_err(|_| slf.get().fail())?;
        if decoded.bind(py).is_instance_of::<IpcResponseChunk>() {
            slf.get().fail();
            return Err(errors::ChunkProtocolError::new_err(
                "reassembled response is itself a response chunk",
            ));
        }
        Ok(decoded)
    }

    /// Give the reservation back (idempotent).
    pub fn release(&self) {
        if let Ok(mut guard) = self.reservation.lock() {
            guard.take();
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> bool {
        self.release();
        false
    }
}

/// Reassembles the chunked response of one RPC.
#[pyclass(module = "sie_sidecar._native")]
pub struct IpcChunkAssembler {
    inner: Assembler<HashlibSha256>,
}

#[pymethods]
impl IpcChunkAssembler {
    #[new]
    #[pyo3(signature = (request_id, budget = None, limits = None))]
    fn new(
        py: Python<'_>,
        request_id: String,
        budget: Option<Py<ResponseBudget>>,
        limits: Option<PyRef<'_, ChunkLimits>>,
    ) -> PyResult<Self> {
        let budget = match budget {
            Some(b) => b,
            None => response_budget(py)?,
        };
        let limits = limits.map_or_else(|| ChunkLimits::production().core(), |l| l.core());
        Ok(Self {
            inner: Assembler::new(request_id, Arc::clone(&budget.get().inner), limits),
        })
    }

    #[getter]
    fn in_progress(&self) -> bool {
        self.inner.in_progress()
    }

    /// Release any partial transfer (timeout, lost connection).
    fn abort(&mut self) {
        self.inner.abort();
    }

    /// Feed one decoded frame; returns the complete response once it is whole and verified.
    fn feed(
        &mut self,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
    ) -> PyResult<Option<AssembledResponse>> {
        if frame.is_instance_of::<ResponseEnvelope>() {
            self.inner.accept_envelope().map_err(errors::chunk)?;
            return Ok(Some(AssembledResponse {
                data: Arc::new(Vec::new()),
                envelope: Some(frame.clone().unbind()),
                reservation: Mutex::new(None),
                reserved: 0,
                recycle_to: None,
            }));
        }
        let chunk = frame
            .cast::<IpcResponseChunk>()
            .map_err(|_| {
                errors::ChunkProtocolError::new_err(
                    "expected a ResponseEnvelope or IpcResponseChunk",
                )
            })?
            .get();
        let digest = chunk.transfer_digest.bind(py).as_bytes();
        let payload_obj = chunk.payload.bind(py);
        with_bytes(payload_obj, |payload| {
            let core = ChunkFrame {
                version: chunk.version,
                request_id: &chunk.request_id,
                transfer_digest: digest,
                chunk_index: chunk.chunk_index,
                chunk_count: chunk.chunk_count,
                total_bytes: chunk.total_bytes,
                payload: (0, payload.len()),
                frame_len: chunk.frame_len,
            };
            match self
                .inner
                .feed(&core, payload, HashlibSha256::new)
                .map_err(errors::chunk)?
            {
                None => Ok(None),
                Some(done) => {
                    let reserved = done.reservation.amount();
                    let recycle_to = Some(Arc::clone(done.reservation.budget()));
                    Ok(Some(AssembledResponse {
                        data: Arc::new(done.bytes),
                        envelope: None,
                        reservation: Mutex::new(Some(done.reservation)),
                        reserved,
                        recycle_to,
                    }))
                }
            }
        })
    }
}

/// Used by module init to expose `PRODUCTION_LIMITS`.
pub fn production_limits(py: Python<'_>) -> PyResult<Py<PyAny>> {
    ChunkLimits::production().into_py_any(py)
}
