//! Zero-copy buffer plumbing: borrow any buffer-protocol object as bytes or typed elements, and
//! hand out Rust-owned bytes to Python as read-only buffers (memoryview slices) without copying.

use std::ffi::{c_int, CStr};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView};
use pyo3::{ffi, IntoPyObjectExt};

/// A held `Py_buffer`, released on drop. Holding it keeps the exporter alive and its memory fixed.
pub struct RawBuffer {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the exporter is kept alive by the view's reference and we only read the memory while
// holding the GIL or a `&[u8]` derived from it within one call.
unsafe impl Send for RawBuffer {}

impl RawBuffer {
    /// Request a C-contiguous buffer; with `typed`, also its format and shape.
    pub fn get(obj: &Bound<'_, PyAny>, typed: bool) -> PyResult<Self> {
        let mut view = Box::new(std::mem::MaybeUninit::<ffi::Py_buffer>::zeroed());
        let flags = if typed {
            ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT
        } else {
            ffi::PyBUF_SIMPLE
        };
        // SAFETY: `obj` is a live object (we hold the GIL) and `view` points to writable memory
        // large enough for a Py_buffer.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags as c_int) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: PyObject_GetBuffer succeeded, so the view is initialised.
        let view = unsafe { Box::from_raw(Box::into_raw(view).cast::<ffi::Py_buffer>()) };
        Ok(Self { view })
    }

    pub fn as_bytes(&self) -> &[u8] {
        if self.view.buf.is_null() || self.view.len <= 0 {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf` while the view is held.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), self.view.len as usize) }
    }

    pub fn itemsize(&self) -> usize {
        self.view.itemsize.max(0) as usize
    }

    /// The struct-module format with any byte-order prefix removed ("B" when unspecified).
    pub fn format_char(&self) -> Option<char> {
        if self.view.format.is_null() {
            return Some('B');
        }
        // SAFETY: a non-null format is a NUL-terminated C string owned by the exporter.
        let fmt = unsafe { CStr::from_ptr(self.view.format) }.to_str().ok()?;
        let fmt = fmt.trim_start_matches(['<', '=', '@']);
        let mut chars = fmt.chars();
        let c = chars.next()?;
        if chars.next().is_some() {
            return None;
        }
        Some(c)
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// Element kinds the framing functions accept.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    I32,
}

impl Elem {
    fn matches(self, buf: &RawBuffer) -> bool {
        matches!(
            (self, buf.format_char(), buf.itemsize()),
            (Elem::F32, Some('f'), 4) | (Elem::I32, Some('i' | 'l'), 4)
        )
    }

    fn numpy_dtype(self) -> &'static str {
        match self {
            Elem::F32 => "<f4",
            Elem::I32 => "<i4",
        }
    }
}

/// Borrow `obj` as little-endian elements of `elem`; anything else (lists, other dtypes,
/// strided arrays) is converted once through numpy.
pub fn typed(obj: &Bound<'_, PyAny>, elem: Elem) -> PyResult<RawBuffer> {
    if let Ok(buf) = RawBuffer::get(obj, true) {
        if elem.matches(&buf) && cfg!(target_endian = "little") {
            return Ok(buf);
        }
    }
    let py = obj.py();
    let converted = py
        .import("numpy")?
        .call_method1("ascontiguousarray", (obj, elem.numpy_dtype()))?
        .call_method0("ravel")?;
    let buf = RawBuffer::get(&converted, true)?;
    if !elem.matches(&buf) {
        return Err(PyBufferError::new_err(
            "could not view the input as the required dtype",
        ));
    }
    Ok(buf)
}

/// Borrow the raw bytes of any buffer (bytes fast path).
pub fn with_bytes<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return f(b.as_bytes());
    }
    let buf = RawBuffer::get(obj, false)?;
    f(buf.as_bytes())
}

/// Fill a read-only `Py_buffer` over `bytes`, owned by `owner`.
///
/// # Safety
/// `view` must be the pointer CPython passed to `__getbuffer__`, and `bytes` must stay valid for
/// as long as `owner` lives (the view keeps a reference to `owner`).
pub unsafe fn fill_readonly(
    owner: &Bound<'_, PyAny>,
    bytes: &[u8],
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    // SAFETY: guaranteed by the caller (see above); the memory is only read through the view.
    unsafe {
        fill_buffer(
            owner,
            bytes.as_ptr().cast_mut(),
            bytes.len(),
            true,
            view,
            flags,
        )
    }
}

/// Fill a `Py_buffer` over `len` bytes at `ptr`, owned by `owner`; writable unless `readonly`.
///
/// # Safety
/// `view` must be the pointer CPython passed to `__getbuffer__`; `ptr..ptr+len` must stay valid
/// for as long as `owner` lives (the view keeps a reference to `owner`) and, when writable, be
/// memory nothing else reads or writes while the view may write it.
pub unsafe fn fill_buffer(
    owner: &Bound<'_, PyAny>,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    // SAFETY: guaranteed by the caller (see above).
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            ptr.cast::<std::ffi::c_void>(),
            len as ffi::Py_ssize_t,
            c_int::from(readonly),
            flags,
        )
    };
    if rc != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// Memory a `SharedBytes` can view: a `Vec`, or a read block that the socket is still writing
/// past the viewed range (so only the viewed range is ever borrowed).
pub trait Backing: Send + Sync {
    fn range(&self, start: usize, end: usize) -> &[u8];
}

impl Backing for Vec<u8> {
    fn range(&self, start: usize, end: usize) -> &[u8] {
        &self[start..end]
    }
}

impl Backing for crate::read_blocks::Block {
    fn range(&self, start: usize, end: usize) -> &[u8] {
        self.slice(start, end)
    }
}

/// Rust-owned bytes exposed read-only through the buffer protocol. Several views can share one
/// allocation (all bodies of one socket read share one block).
#[pyclass(frozen, module = "sie_sidecar._native")]
pub struct SharedBytes {
    data: Arc<dyn Backing>,
    start: usize,
    end: usize,
}

impl SharedBytes {
    pub fn new(data: Arc<dyn Backing>, start: usize, end: usize) -> Self {
        Self { data, start, end }
    }

    pub fn as_slice(&self) -> &[u8] {
        self.data.range(self.start, self.end)
    }
}

#[pymethods]
impl SharedBytes {
    /// # Safety
    /// Called by CPython with a valid `view`; we fill it read-only over memory we keep alive
    /// (the view holds a reference to `slf`).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: forwarded from CPython; `slf` owns the Arc'd bytes for the view's lifetime.
        unsafe { fill_readonly(slf.as_any(), slf.get().as_slice(), view, flags) }
    }

    /// # Safety
    /// Nothing to release: the memory lives as long as the object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.end - self.start
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.as_slice())
    }
}

/// A read-only memoryview of `data[start..end]`.
pub fn shared_view<B: Backing + 'static>(
    py: Python<'_>,
    data: Arc<B>,
    start: usize,
    end: usize,
) -> PyResult<Py<PyAny>> {
    let data: Arc<dyn Backing> = data;
    let owner = Bound::new(py, SharedBytes::new(data, start, end))?;
    Ok(PyMemoryView::from(owner.as_any())?.into_any().unbind())
}

/// `memoryview(obj)[start:end]`: a view into the caller's own buffer, no copy.
pub fn slice_view(obj: &Bound<'_, PyAny>, start: usize, end: usize) -> PyResult<Py<PyAny>> {
    let py = obj.py();
    let mv = PyMemoryView::from(obj)?;
    // Not `PySlice::new`: pyo3 0.30's hands the new references of its three `PyLong_FromSsize_t`
    // calls to `PySlice_New`, which takes references of its own, so each bound outside the
    // small-int cache (here `end`, past 256) leaked one int. `decode_response` slices every IPC
    // response frame, so that was one leaked int per batch (~0.5 B/item in the leak check). The
    // bounds here are owned `Bound`s, released on return; a NULL step is `None` (a step of 1).
    let start = start.into_pyobject(py)?;
    let end = end.into_pyobject(py)?;
    // SAFETY: the GIL is held; `start` and `end` are live ints, which `PySlice_New` only borrows
    // (it takes references of its own); it returns a new reference, or NULL with an exception set.
    let slice = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PySlice_New(start.as_ptr(), end.as_ptr(), std::ptr::null_mut()),
        )?
    };
    mv.get_item(slice)?.into_py_any(py)
}

/// An [`Out`](sie_core::msgpack::Out) that writes through a raw pointer into memory that is not
/// initialised yet, so a new `bytes` is written once instead of zero-filled and then written.
pub struct RawWriter {
    ptr: *mut u8,
    len: usize,
    pos: usize,
    /// A write did not fit (it was cut at `len`): the sizing was wrong, and the object is refused.
    overflowed: bool,
}

impl RawWriter {
    fn room(&mut self, n: usize) -> usize {
        let fits = n.min(self.len - self.pos);
        self.overflowed |= fits < n;
        fits
    }

    /// Why the writes did not fill exactly `len` bytes, if they did not.
    fn sizing_error(&self) -> Option<String> {
        if self.overflowed {
            Some(format!("wrote past the {} bytes sized", self.len))
        } else if self.pos != self.len {
            Some(format!("wrote {} of {} bytes", self.pos, self.len))
        } else {
            None
        }
    }
}

impl sie_core::msgpack::Out for RawWriter {
    fn push(&mut self, byte: u8) {
        if self.room(1) == 1 {
            // SAFETY: `pos < len`, and `ptr..ptr+len` is writable memory owned by the bytes
            // object under construction (see `new_bytes`).
            unsafe { self.ptr.add(self.pos).write(byte) };
            self.pos += 1;
        }
    }

    fn extend_from_slice(&mut self, bytes: &[u8]) {
        let n = self.room(bytes.len());
        // SAFETY: `n` bytes fit in `ptr+pos..ptr+len` (checked by `room`), and the source is a
        // live slice that can not overlap the freshly allocated destination.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(self.pos), n) };
        self.pos += n;
    }
}

/// A new `bytes` of exactly `len` bytes, filled by `fill` without zeroing it first. `fill` must
/// write exactly `len` bytes: a short write, or one past the end (cut there, never written past
/// it), is turned into an error and the object is never exposed.
pub fn new_bytes<'py>(
    py: Python<'py>,
    len: usize,
    fill: impl FnOnce(&mut RawWriter) -> PyResult<()>,
) -> PyResult<Bound<'py, PyBytes>> {
    // SAFETY: a NULL source asks CPython for an uninitialised bytes object of `len` bytes.
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), len as ffi::Py_ssize_t) };
    // SAFETY: `raw` is a new reference or NULL with an exception set.
    let obj = unsafe { Bound::from_owned_ptr_or_err(py, raw)? }.cast_into::<PyBytes>()?;
    // SAFETY: the object is brand new and not shared yet, so writing its buffer is allowed.
    let ptr = unsafe { ffi::PyBytes_AsString(obj.as_ptr()) }.cast::<u8>();
    let mut writer = RawWriter {
        ptr,
        len,
        pos: 0,
        overflowed: false,
    };
    fill(&mut writer)?;
    if let Some(error) = writer.sizing_error() {
        return Err(pyo3::exceptions::PySystemError::new_err(format!(
            "internal sizing error: {error}"
        )));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::RawWriter;
    use sie_core::msgpack::Out;

    fn writer(buf: &mut [u8]) -> RawWriter {
        RawWriter {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            pos: 0,
            overflowed: false,
        }
    }

    #[test]
    fn an_exact_fill_is_accepted() {
        let mut buf = [0u8; 4];
        let mut w = writer(&mut buf);
        w.push(1);
        w.extend_from_slice(&[2, 3, 4]);
        assert_eq!(w.sizing_error(), None);
        assert_eq!(buf, [1, 2, 3, 4]);
    }

    #[test]
    fn a_short_fill_is_refused() {
        let mut buf = [0u8; 4];
        let mut w = writer(&mut buf);
        w.extend_from_slice(&[1, 2]);
        assert_eq!(w.sizing_error().as_deref(), Some("wrote 2 of 4 bytes"));
    }

    #[test]
    fn a_write_past_the_end_is_cut_and_refused() {
        // Before, the extra bytes were dropped silently and a full-looking object came back.
        let mut guard = [0u8; 8];
        let (buf, after) = guard.split_at_mut(4);
        let mut w = writer(buf);
        w.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(w.pos, 4);
        assert_eq!(
            w.sizing_error().as_deref(),
            Some("wrote past the 4 bytes sized")
        );
        w.push(7);
        assert_eq!(after, [0, 0, 0, 0]);
        let mut buf = [0u8; 1];
        let mut w = writer(&mut buf);
        w.push(1);
        w.push(2);
        assert!(w.sizing_error().is_some());
    }
}
