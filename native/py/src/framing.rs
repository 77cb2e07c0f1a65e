//! `FrameSplitter`, `encode_frame` and `encode_request` for Python.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use sie_core::frame::{self, Body};
use sie_core::ipc;
use sie_core::msgpack::{Out, SliceWriter};

use crate::buffers::{fill_buffer, new_bytes, shared_view, with_bytes};
use crate::errors;
use crate::read_blocks::{Block, BlockReader, ReadError, BLOCK_SIZE};
use crate::request_body::RequestBody;

/// Incremental IPC frame splitter: feed it socket reads, get complete bodies back.
#[pyclass(module = "sie_sidecar._native")]
pub struct FrameSplitter {
    inner: frame::FrameSplitter,
    scratch: Vec<Body>,
}

#[pymethods]
impl FrameSplitter {
    #[new]
    #[pyo3(signature = (max_body = frame::MAX_FRAME))]
    fn new(max_body: usize) -> Self {
        Self {
            inner: frame::FrameSplitter::new(max_body),
            scratch: Vec::new(),
        }
    }

    /// Feed one read; returns the complete bodies as read-only memoryviews, in order.
    fn feed<'py>(
        &mut self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let Self { inner, scratch } = self;
        scratch.clear();
        // Bodies wholly inside this read share one copy of the span that holds them.
        let block = with_bytes(data, |bytes| {
            inner
                .feed(bytes, scratch)
                .map_err(errors::frame_too_large)?;
            let mut span: Option<(usize, usize)> = None;
            for body in scratch.iter() {
                if let Body::InInput { start, end } = body {
                    span = Some(match span {
                        None => (*start, *end),
                        Some((a, _)) => (a, *end),
                    });
                }
            }
            Ok(span.map(|(a, b)| (a, Arc::new(bytes[a..b].to_vec()))))
        })?;
        let out = PyList::empty(py);
        for body in scratch.drain(..) {
            match body {
                Body::InInput { start, end } => {
                    let (base, data) = block.as_ref().expect("a block exists for in-input bodies");
                    out.append(shared_view(py, Arc::clone(data), start - base, end - base)?)?;
                }
                Body::Assembled(v) => {
                    let len = v.len();
                    out.append(shared_view(py, Arc::new(v), 0, len)?)?;
                }
            }
        }
        Ok(out)
    }

    /// Bytes held for an incomplete frame.
    #[getter]
    fn buffered(&self) -> usize {
        self.inner.buffered()
    }
}

/// Reads one connection's byte stream into blocks of its own (`read_window` for the socket read,
/// then `window_filled`), and hands out each complete frame body as a read-only memoryview of the
/// block it arrived in: the kernel's copy is the only one (see `read_blocks`). For an
/// `asyncio.BufferedProtocol`: `get_buffer` returns `read_window()`.
#[pyclass(module = "sie_sidecar._native")]
pub struct FrameReader {
    inner: BlockReader,
    scratch: Vec<(usize, usize)>,
    /// Bumped by each `window_filled`: a window handed out before it can no longer be exported.
    fills: Arc<AtomicU64>,
}

#[pymethods]
impl FrameReader {
    #[new]
    #[pyo3(signature = (max_body = frame::MAX_FRAME, block_size = BLOCK_SIZE))]
    fn new(max_body: usize, block_size: usize) -> Self {
        Self {
            inner: BlockReader::new(max_body, block_size),
            scratch: Vec::new(),
            fills: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A writable buffer for the next read (pass its filled length to `window_filled`).
    fn read_window(&mut self) -> PyResult<ReadWindow> {
        let (block, start, len) = self.inner.window().map_err(read_error)?;
        Ok(ReadWindow {
            block,
            start,
            len,
            issued: self.fills.load(Ordering::Relaxed),
            fills: Arc::clone(&self.fills),
        })
    }

    /// `nbytes` were read into the last window; returns the bodies completed, in order.
    fn window_filled<'py>(
        &mut self,
        py: Python<'py>,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let Self {
            inner,
            scratch,
            fills,
        } = self;
        scratch.clear();
        inner.filled(nbytes, scratch).map_err(read_error)?;
        fills.fetch_add(1, Ordering::Relaxed);
        let out = PyList::empty(py);
        for &(start, end) in scratch.iter() {
            out.append(shared_view(py, Arc::clone(inner.block()), start, end)?)?;
        }
        Ok(out)
    }

    /// Bytes read but not yet part of a returned body.
    #[getter]
    fn buffered(&self) -> usize {
        self.inner.buffered()
    }

    /// `{"windows", "moves", "moved_bytes", "blocks_made"}`: reads offered, frames in progress
    /// moved to another block (and the bytes that copied), blocks allocated.
    #[getter]
    fn stats(&self) -> std::collections::HashMap<&'static str, u64> {
        let s = self.inner.stats();
        std::collections::HashMap::from([
            ("windows", s.windows),
            ("moves", s.moves),
            ("moved_bytes", s.moved_bytes),
            ("blocks_made", s.blocks_made),
        ])
    }
}

fn read_error(err: ReadError) -> PyErr {
    match err {
        ReadError::TooLarge(e) => errors::frame_too_large(e),
        ReadError::NoWindow => {
            PyValueError::new_err("window_filled() called without a read_window() before it")
        }
        ReadError::Overfilled { filled, window } => PyValueError::new_err(format!(
            "window_filled({filled}) is more than the {window} byte window"
        )),
    }
}

/// The writable region of a `FrameReader` block that one socket read may fill.
#[pyclass(frozen, module = "sie_sidecar._native")]
pub struct ReadWindow {
    block: Arc<Block>,
    start: usize,
    len: usize,
    /// The reader's fill count when this window was handed out.
    issued: u64,
    fills: Arc<AtomicU64>,
}

#[pymethods]
impl ReadWindow {
    /// # Safety
    /// Called by CPython with a valid `view`; the memory is kept alive by the view's reference
    /// to `slf`, and no frame view covers it (the reader hands out only bytes before the window).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        if this.fills.load(Ordering::Relaxed) != this.issued {
            // Its bytes may be frames now: a late writer must not change them.
            return Err(PyBufferError::new_err(
                "this read window was filled already",
            ));
        }
        let ptr = this.block.window_ptr(this.start, this.len);
        // SAFETY: `ptr..ptr+len` is in bounds of the block, which `slf` keeps alive, and only the
        // read this window is for writes it (see `read_blocks`).
        unsafe { fill_buffer(slf.as_any(), ptr, this.len, false, view, flags) }
    }

    /// # Safety
    /// Nothing to release: the memory lives as long as the object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.len
    }
}

/// Prefix `body` with its 4-byte big-endian length; `FrameTooLarge` over 32 MiB.
#[pyfunction]
pub fn encode_frame<'py>(
    py: Python<'py>,
    body: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    with_bytes(body, |b| {
        frame::check_len(b.len()).map_err(errors::frame_too_large)?;
        new_bytes(py, frame::HEADER_LEN + b.len(), |out| {
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
            Ok(())
        })
    })
}

/// A whole request frame with keys in spec order; `body` is pre-encoded msgpack. `bytes`, or for
/// the first frame of a `RequestBody` a read-only memoryview of the body's own memory.
#[pyfunction]
#[pyo3(signature = (method, request_id, body, accepts_chunks = true))]
pub fn encode_request<'py>(
    py: Python<'py>,
    method: &str,
    request_id: &str,
    body: &Bound<'py, PyAny>,
    accepts_chunks: bool,
) -> PyResult<Bound<'py, PyAny>> {
    if let Ok(request) = body.cast::<RequestBody>() {
        // The first frame of a RequestBody is its own memory: the envelope goes in front of it.
        if let Some(frame) = request
            .get()
            .frame_in_place(py, method, request_id, accepts_chunks)?
        {
            return Ok(frame.into_bound(py));
        }
    }
    with_bytes(body, |b| {
        let len = ipc::request_len(method, request_id, b.len()).map_err(errors::frame_too_large)?;
        // Written once, not zero-filled first (a 64-item RunBatch request is ~30 KB).
        new_bytes(py, frame::HEADER_LEN + len, |out| {
            ipc::write_request(out, len, method, request_id, b, accepts_chunks);
            Ok(())
        })
    })
    .map(Bound::into_any)
}

/// The frame bodies a backend sends for one serialized response: the response itself when it
/// fits the legacy ceiling, else IpcResponseChunkV1 frames (wire-protocol §6.4).
#[pyfunction]
#[pyo3(signature = (response, request_id, *, accepts_chunks = true, limits = None))]
pub fn encode_response_frames<'py>(
    py: Python<'py>,
    response: &Bound<'py, PyAny>,
    request_id: &str,
    accepts_chunks: bool,
    limits: Option<PyRef<'py, crate::assembler::ChunkLimits>>,
) -> PyResult<Bound<'py, PyList>> {
    let limits = limits.map_or_else(crate::assembler::ChunkLimits::production, |l| l.clone());
    with_bytes(response, |whole| {
        let plan = ipc::plan_response(
            whole.len() as u64,
            accepts_chunks,
            limits.legacy_ceiling,
            limits.max_chunk_payload,
            limits.max_total,
            limits.max_chunks,
        )
        .map_err(errors::FrameTooLarge::new_err)?;
        let out = PyList::empty(py);
        match plan {
            ipc::ResponsePlan::Legacy if response.is_instance_of::<PyBytes>() => {
                out.append(response)?
            }
            ipc::ResponsePlan::Legacy => out.append(PyBytes::new(py, whole))?,
            ipc::ResponsePlan::Chunked { count, slice } => {
                let digest = py
                    .import("hashlib")?
                    .call_method1("sha256", (response,))?
                    .call_method0("digest")?;
                let digest = digest.cast::<PyBytes>()?.as_bytes();
                let total = whole.len() as u64;
                for (i, payload) in whole.chunks(slice as usize).enumerate() {
                    let mut c = sie_core::msgpack::Counter::default();
                    ipc::write_chunk_frame(
                        &mut c, request_id, digest, i as u64, count, total, payload,
                    );
                    let frame = PyBytes::new_with(py, c.0, |buf| {
                        ipc::write_chunk_frame(
                            &mut SliceWriter::new(buf),
                            request_id,
                            digest,
                            i as u64,
                            count,
                            total,
                            payload,
                        );
                        Ok(())
                    })?;
                    out.append(frame)?;
                }
            }
        }
        Ok(out)
    })
}
