//! Python values → msgpack, byte for byte what `msgpack.packb(value, use_bin_type=True)` writes.
//!
//! The exact builtin types (None, bool, int, float, str, bytes, list, tuple, dict) are written
//! here; for anything else (subclasses, ExtType, bytearray, an int beyond 64 bits, a str with lone
//! surrogates, deep nesting) the whole value is handed to msgpack itself, so its output and its
//! errors are msgpack's by construction, not by imitation.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use sie_core::msgpack::{
    write_array_header, write_bin, write_bool, write_f64, write_int, write_map_header, write_nil,
    write_str, write_uint,
};

/// Nesting followed here before msgpack takes over (its own limit is far deeper).
const FAST_DEPTH: usize = 64;

/// Append the msgpack encoding of `obj` to `out`.
pub fn pack(out: &mut Vec<u8>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    let start = out.len();
    if fast(out, obj, 0) {
        return Ok(());
    }
    out.truncate(start);
    let packed = packb(obj)?;
    out.extend_from_slice(packed.as_bytes());
    Ok(())
}

/// `float(obj)`, as the Python body builders write timestamps and fetch times.
pub fn float_of(obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        return Ok(f.value());
    }
    obj.py()
        .get_type::<PyFloat>()
        .call1((obj,))?
        .cast_into::<PyFloat>()
        .map(|f| f.value())
        .map_err(PyErr::from)
}

static PACKB: PyOnceLock<(Py<PyAny>, Py<PyDict>)> = PyOnceLock::new();

fn packb<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let py = obj.py();
    let (func, kwargs) = PACKB.get_or_try_init(py, || -> PyResult<_> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("use_bin_type", true)?;
        Ok((
            py.import("msgpack")?.getattr("packb")?.unbind(),
            kwargs.unbind(),
        ))
    })?;
    Ok(func
        .bind(py)
        .call((obj,), Some(kwargs.bind(py)))?
        .cast_into::<PyBytes>()?)
}

/// Write `obj` if it is made of exact builtins only; false (with `out` partly written) otherwise.
fn fast(out: &mut Vec<u8>, obj: &Bound<'_, PyAny>, depth: usize) -> bool {
    if depth > FAST_DEPTH {
        return false;
    }
    if obj.is_none() {
        write_nil(out);
        return true;
    }
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        write_bool(out, b.is_true());
        return true;
    }
    if obj.is_exact_instance_of::<PyInt>() {
        // Beyond 64 bits msgpack raises; the failed extractions are that rare path.
        if let Ok(v) = obj.extract::<i64>() {
            write_int(out, v);
            return true;
        }
        if let Ok(v) = obj.extract::<u64>() {
            write_uint(out, v);
            return true;
        }
        return false;
    }
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return match s.to_str() {
            Ok(text) => {
                write_str(out, text);
                true
            }
            Err(_) => false, // lone surrogates: msgpack raises the error
        };
    }
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        write_f64(out, f.value());
        return true;
    }
    if let Ok(b) = obj.cast_exact::<PyBytes>() {
        let bytes = b.as_bytes();
        if u32::try_from(bytes.len()).is_err() {
            return false;
        }
        write_bin(out, bytes);
        return true;
    }
    if let Ok(d) = obj.cast_exact::<PyDict>() {
        write_map_header(out, d.len());
        return d
            .iter()
            .all(|(k, v)| fast(out, &k, depth + 1) && fast(out, &v, depth + 1));
    }
    if let Ok(l) = obj.cast_exact::<PyList>() {
        write_array_header(out, l.len());
        return l.iter().all(|v| fast(out, &v, depth + 1));
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        write_array_header(out, t.len());
        return t.iter().all(|v| fast(out, &v, depth + 1));
    }
    false
}
