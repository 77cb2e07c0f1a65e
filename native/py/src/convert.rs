//! Generic msgpack → Python objects, equivalent to `msgpack.unpackb(raw=False,
//! strict_map_key=False)`: str → str, bin → bytes, ext → msgpack.ExtType.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3::IntoPyObjectExt;

use sie_core::msgpack::{DecodeError, Reader, Token, MAX_DEPTH};

use crate::errors;

/// Decode one value at the reader's position.
pub fn value(py: Python<'_>, r: &mut Reader<'_>) -> PyResult<Py<PyAny>> {
    value_at(py, r, 0)
}

fn value_at(py: Python<'_>, r: &mut Reader<'_>, depth: usize) -> PyResult<Py<PyAny>> {
    if depth > MAX_DEPTH {
        return Err(errors::decode(DecodeError::new(
            r.position(),
            "msgpack nesting too deep",
        )));
    }
    let at = r.position();
    let token = r.next_token().map_err(errors::decode)?;
    Ok(match token {
        Token::Nil => py.None(),
        Token::Bool(b) => b.into_py_any(py)?,
        Token::UInt(v) => v.into_py_any(py)?,
        Token::Int(v) => v.into_py_any(py)?,
        Token::F32(v) => f64::from(v).into_py_any(py)?,
        Token::F64(v) => v.into_py_any(py)?,
        Token::Str(s) => std::str::from_utf8(s)
            .map_err(|_| errors::decode(DecodeError::new(at, "str is not valid UTF-8")))?
            .into_py_any(py)?,
        Token::Bin(b) => PyBytes::new(py, b).into_any().unbind(),
        Token::Array(n) => {
            let list = PyList::empty(py);
            for _ in 0..n {
                list.append(value_at(py, r, depth + 1)?)?;
            }
            list.into_any().unbind()
        }
        Token::Map(n) => {
            let dict = PyDict::new(py);
            for _ in 0..n {
                let key_at = r.position();
                let key = value_at(py, r, depth + 1)?;
                let val = value_at(py, r, depth + 1)?;
                dict.set_item(key, val).map_err(|_| {
                    errors::decode(DecodeError::new(key_at, "map key is not hashable"))
                })?;
            }
            dict.into_any().unbind()
        }
        Token::Ext(code, data) => ext(py, code, data).map_err(|e| {
            errors::decode(DecodeError::new(at, format!("bad msgpack ext value: {e}")))
        })?,
    })
}

/// Decode a whole buffer holding exactly one value.
pub fn whole(py: Python<'_>, bytes: &[u8]) -> PyResult<Py<PyAny>> {
    let mut r = Reader::new(bytes);
    let v = value(py, &mut r)?;
    r.finish().map_err(errors::decode)?;
    Ok(v)
}

/// Ext values as msgpack-python gives them: -1 is a Timestamp, 0..=127 an ExtType, the rest
/// (reserved negative codes) are errors.
fn ext(py: Python<'_>, code: i8, data: &[u8]) -> PyResult<Py<PyAny>> {
    let msgpack = py.import("msgpack")?;
    let data = PyBytes::new(py, data);
    let value = if code == -1 {
        msgpack
            .getattr("Timestamp")?
            .call_method1("from_bytes", (data,))?
    } else {
        msgpack.getattr("ExtType")?.call1((code, data))?
    };
    Ok(value.unbind())
}
