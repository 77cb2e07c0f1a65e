//! Loads the Cython module that build.rs linked into this cdylib and registers it under its
//! qualified name, so `import sie_sidecar._native.wire` works like an ordinary extension.
use pyo3::{ffi, prelude::*, types::PyDict, types::PyModule};

extern "C" {
    /// Module init of `cython/wire.pyx`, compiled by build.rs into libsie_cython.a.
    pub fn PyInit_wire() -> *mut ffi::PyObject;
}

/// Run a Cython module's init and return the module, registered in `sys.modules` as `qualname`.
pub fn load<'py>(
    py: Python<'py>,
    qualname: &str,
    origin: Option<&str>,
    init: unsafe extern "C" fn() -> *mut ffi::PyObject,
) -> PyResult<Bound<'py, PyModule>> {
    // SAFETY: we hold the GIL (`py`), and each init is called once, from our own module init.
    let raw = unsafe { init() };
    if raw.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a valid object pointer; PyModuleDef_Type is a static type object.
    let is_def =
        unsafe { ffi::PyObject_TypeCheck(raw, std::ptr::addr_of_mut!(ffi::PyModuleDef_Type)) } != 0;
    let module = if is_def {
        // PEP 489 multi-phase init (Cython's default): `raw` is a static PyModuleDef, not owned.
        let def = raw.cast::<ffi::PyModuleDef>();
        let machinery = py.import("importlib.machinery")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("origin", origin)?;
        let spec = machinery
            .getattr("ModuleSpec")?
            .call((qualname, py.None()), Some(&kwargs))?;
        // SAFETY: `def` lives for the whole process; `spec` is alive for this call.
        let module = unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyModule_FromDefAndSpec(def, spec.as_ptr()))?
        };
        // SAFETY: `module` was created from `def` just above and is executed exactly once.
        if unsafe { ffi::PyModule_ExecDef(module.as_ptr(), def) } != 0 {
            return Err(PyErr::fetch(py));
        }
        module.setattr("__spec__", spec)?;
        if let Some(path) = origin {
            module.setattr("__file__", path)?;
        }
        module
    } else {
        // SAFETY: single-phase init returns a new reference to the module.
        unsafe { Bound::from_owned_ptr(py, raw) }
    };
    py.import("sys")?
        .getattr("modules")?
        .set_item(qualname, &module)?;
    Ok(module.cast_into::<PyModule>()?)
}
