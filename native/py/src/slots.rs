//! Filling a fresh instance of a `__slots__` class (the `WorkItem` dataclass) without `setattr`.
//!
//! `setattr` looks the name up along the type's MRO and calls the slot's descriptor for every
//! field: for a 29-field WorkItem that was a third of the decoder's time. A slot is a
//! `member_descriptor` of type `Py_T_OBJECT_EX` at a fixed offset in the instance, so once the
//! offsets are read off the class, a fresh instance (all slots NULL) is filled by storing each
//! value's pointer at its offset. The layout is checked when it is built; any class that does not
//! match it exactly (another class, a field that is not a plain object slot) gets `setattr`.

use std::ffi::c_char;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

/// The slot offsets of `cls` for a list of field names.
pub struct SlotLayout {
    cls: Py<PyType>,
    offsets: Vec<ffi::Py_ssize_t>,
}

impl SlotLayout {
    /// The layout of `cls`, or `None` when any field is not a writable object slot defined on
    /// `cls` itself (then the caller sets attributes the slow way).
    pub fn of(cls: &Bound<'_, PyType>, names: &[Py<PyString>]) -> PyResult<Option<Self>> {
        let py = cls.py();
        let dict = cls.getattr(pyo3::intern!(py, "__dict__"))?;
        let mut offsets = Vec::with_capacity(names.len());
        for name in names {
            let Ok(descr) = dict.get_item(name.bind(py)) else {
                return Ok(None);
            };
            // SAFETY: the GIL is held; `descr` is a live object, and its type is compared with
            // the interpreter's member-descriptor type before it is read as a PyMemberDescrObject.
            let offset = unsafe {
                let raw = descr.as_ptr();
                if ffi::Py_TYPE(raw) != std::ptr::addr_of_mut!(ffi::PyMemberDescr_Type) {
                    return Ok(None);
                }
                let member = (*raw.cast::<ffi::PyMemberDescrObject>()).d_member;
                if member.is_null()
                    || (*member).type_code != ffi::Py_T_OBJECT_EX
                    || (*member).flags & ffi::Py_READONLY != 0
                    || (*member).name.is_null()
                    || !same_name(name.bind(py), (*member).name)
                {
                    return Ok(None);
                }
                (*member).offset
            };
            offsets.push(offset);
        }
        // Every offset must lie inside the instance and past the object header.
        // SAFETY: `cls` is a live type object; reading its basic size.
        let basic = unsafe { (*cls.as_type_ptr()).tp_basicsize };
        let header = std::mem::size_of::<ffi::PyObject>() as ffi::Py_ssize_t;
        let ptr_size = std::mem::size_of::<*mut ffi::PyObject>() as ffi::Py_ssize_t;
        if offsets.iter().any(|&o| o < header || o + ptr_size > basic) {
            return Ok(None);
        }
        Ok(Some(Self {
            cls: cls.clone().unbind(),
            offsets,
        }))
    }

    /// Whether this layout was read off `cls`.
    pub fn is_for(&self, cls: &Bound<'_, PyType>) -> bool {
        self.cls.bind(cls.py()).is(cls)
    }

    /// A fresh instance of the class (`tp_alloc`, as `object.__new__` does), every slot NULL.
    pub fn alloc<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let tp = self.cls.bind(py).as_type_ptr();
        // SAFETY: the GIL is held and `tp` is a live heap type; `tp_alloc` returns a new
        // reference (or NULL with an exception set), and zero-fills the instance, so every slot
        // starts NULL ("unset", as after `object.__new__`).
        unsafe {
            let alloc = (*tp).tp_alloc.unwrap_or(ffi::PyType_GenericAlloc);
            Bound::from_owned_ptr_or_err(py, alloc(tp, 0))
        }
    }

    /// Store `value` in slot `i` of an instance made by `alloc` whose slot `i` is still NULL.
    pub fn put(&self, obj: &Bound<'_, PyAny>, i: usize, value: Py<PyAny>) {
        let offset = self.offsets[i];
        // SAFETY: `obj` is an instance of `cls` made by `alloc` (the caller's contract), the
        // offset was validated against the class's member descriptor and basic size, and the slot
        // is NULL, so the instance takes over the reference `value` owned (no leak, no double
        // reference); a slot written twice would leak one reference, never free one early.
        unsafe {
            let slot = obj
                .as_ptr()
                .cast::<u8>()
                .offset(offset)
                .cast::<*mut ffi::PyObject>();
            let old = std::mem::replace(&mut *slot, value.into_ptr());
            if !old.is_null() {
                ffi::Py_DECREF(old);
            }
        }
    }
}

/// Whether the descriptor's C name equals `name`.
///
/// # Safety
/// `c_name` must be a valid NUL-terminated string (a member definition's name).
unsafe fn same_name(name: &Bound<'_, PyString>, c_name: *const c_char) -> bool {
    let Ok(expected) = name.to_str() else {
        return false;
    };
    // SAFETY: the caller guarantees a NUL-terminated C string.
    let got = unsafe { std::ffi::CStr::from_ptr(c_name) };
    got.to_bytes() == expected.as_bytes()
}
