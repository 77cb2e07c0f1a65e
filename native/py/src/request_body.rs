//! A request body written with room in front of it for its IPC envelope, so the request frame is
//! the body's own memory (`encode_request` writes the envelope into that room, once).
//!
//! Why: a 64-item RunBatch body (~45 KB of gateway WorkItems) was written into a `Vec`, copied
//! into `bytes`, and copied again into the frame; each copy's destination was memory the caches
//! had not seen (docs/benchmarks.md, issue 32, twelfth session).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use sie_core::frame::FrameTooLarge;
use sie_core::ipc;
use sie_core::msgpack::SliceWriter;

use crate::buffers::{fill_readonly, shared_view};
use crate::errors;
use crate::read_blocks::Block;

/// Bytes left in front of a body for its envelope: a RunBatch request's head is 79 bytes plus its
/// request id ("w-<n>"), so ids up to 48 characters fit. A longer one is framed by a copy.
pub const ENVELOPE_ROOM: usize = 128;

/// An encoded request body (a read-only buffer of the body's bytes, as `bytes(body)` gives)
/// whose request frame `encode_request` makes in place the first time it frames it; later frames
/// of the same body (a retry under another request id) are copies.
#[pyclass(frozen, module = "sie_sidecar._native")]
pub struct RequestBody {
    /// The room, then the body: written whole before it is shared, and after that only the room,
    /// once, by whoever claims it (`room_free`), before any view of it exists.
    memory: Arc<Block>,
    room_free: AtomicBool,
}

impl RequestBody {
    /// `bytes`: `ENVELOPE_ROOM` bytes of room, then the body.
    pub fn new(bytes: Vec<u8>) -> Self {
        assert!(bytes.len() >= ENVELOPE_ROOM);
        Self {
            memory: Arc::new(Block::from_vec(bytes)),
            room_free: AtomicBool::new(true),
        }
    }

    pub fn body(&self) -> &[u8] {
        self.memory.slice(ENVELOPE_ROOM, self.memory.capacity())
    }

    /// The request frame as a read-only memoryview of this body's memory, or None when the room
    /// was already used or is too small for this request id (the caller copies then).
    pub fn frame_in_place(
        &self,
        py: Python<'_>,
        method: &str,
        request_id: &str,
        accepts_chunks: bool,
    ) -> PyResult<Option<Py<PyAny>>> {
        match self
            .claim_room(method, request_id, accepts_chunks)
            .map_err(errors::frame_too_large)?
        {
            Some(start) => {
                shared_view(py, self.memory.clone(), start, self.memory.capacity()).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Write the request's head into the room, once: where the frame starts, or None (used
    /// already, or too small for this request id).
    fn claim_room(
        &self,
        method: &str,
        request_id: &str,
        accepts_chunks: bool,
    ) -> Result<Option<usize>, FrameTooLarge> {
        let body_len = self.memory.capacity() - ENVELOPE_ROOM;
        let envelope_len = ipc::request_len(method, request_id, body_len)?;
        let head_len = ipc::request_head_len(method, request_id);
        if head_len > ENVELOPE_ROOM
            || self
                .room_free
                .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return Ok(None);
        }
        let mut head = [0u8; ENVELOPE_ROOM];
        let mut out = SliceWriter::new(&mut head[..head_len]);
        ipc::write_request_head(&mut out, envelope_len, method, request_id, accepts_chunks);
        debug_assert_eq!(out.written(), head_len);
        let start = ENVELOPE_ROOM - head_len;
        // SAFETY: `start..ENVELOPE_ROOM` is in bounds (`window_ptr` checks) and nothing reads it:
        // the room was free (claimed just now, once for this object's life), the body's buffer
        // starts at ENVELOPE_ROOM, and frames exist only after this. `head` is a separate buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                head.as_ptr(),
                self.memory.window_ptr(start, head_len),
                head_len,
            )
        };
        Ok(Some(start))
    }

    #[cfg(test)]
    fn frame(&self, start: usize) -> &[u8] {
        self.memory.slice(start, self.memory.capacity())
    }
}

#[pymethods]
impl RequestBody {
    /// # Safety
    /// Called by CPython with a valid `view`; filled read-only over the body, which lives as
    /// long as `slf` (the view holds a reference to it) and is never written again.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: forwarded from CPython, see above.
        unsafe { fill_readonly(slf.as_any(), slf.get().body(), view, flags) }
    }

    /// # Safety
    /// Nothing to release: the memory lives as long as the object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.memory.capacity() - ENVELOPE_ROOM
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(body: &[u8]) -> RequestBody {
        let mut bytes = vec![0u8; ENVELOPE_ROOM];
        bytes.extend_from_slice(body);
        RequestBody::new(bytes)
    }

    const BODY: &[u8] = &[0x81, 0xa1, b'a', 0x93, 1, 2, 3];

    #[test]
    fn the_first_frame_is_the_body_with_its_envelope_in_front() {
        for accepts in [true, false] {
            let request = body_of(BODY);
            let start = request
                .claim_room("RunBatch", "w-17", accepts)
                .unwrap()
                .unwrap();
            let copied = ipc::encode_request("RunBatch", "w-17", BODY, accepts).unwrap();
            assert_eq!(request.frame(start), &copied[..]);
            assert_eq!(request.body(), BODY);
        }
    }

    #[test]
    fn the_room_is_written_once() {
        let request = body_of(BODY);
        let start = request
            .claim_room("RunBatch", "w-1", true)
            .unwrap()
            .unwrap();
        let first = request.frame(start).to_vec();
        // A retry under another id: no second head over a frame that may still be in flight.
        assert_eq!(request.claim_room("RunBatch", "w-2", true).unwrap(), None);
        assert_eq!(request.frame(start), &first[..]);
    }

    #[test]
    fn a_head_larger_than_the_room_leaves_it_free() {
        let request = body_of(BODY);
        let long = "w".repeat(ENVELOPE_ROOM);
        assert_eq!(request.claim_room("RunBatch", &long, true).unwrap(), None);
        let one_too_long = "r".repeat(ENVELOPE_ROOM - ipc::request_head_len("RunBatch", ""));
        assert!(ipc::request_head_len("RunBatch", &one_too_long) > ENVELOPE_ROOM);
        assert_eq!(
            request.claim_room("RunBatch", &one_too_long, true).unwrap(),
            None
        );
        let fits = "r".repeat(48);
        let start = request
            .claim_room("RunBatch", &fits, true)
            .unwrap()
            .unwrap();
        let copied = ipc::encode_request("RunBatch", &fits, BODY, true).unwrap();
        assert_eq!(request.frame(start), &copied[..]);
    }

    #[test]
    fn an_empty_body_frames_too() {
        let request = body_of(&[]);
        let start = request.claim_room("Ping", "p", false).unwrap().unwrap();
        assert_eq!(
            request.frame(start),
            &ipc::encode_request("Ping", "p", &[], false).unwrap()[..]
        );
    }
}
