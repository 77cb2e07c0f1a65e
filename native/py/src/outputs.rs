//! Output framing for Python: array data goes from the caller's buffer straight into the
//! output `bytes` (sized exactly by a counting pass first), one copy in all.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use sie_core::msgpack::{Counter, SliceWriter};
use sie_core::outputs::{self as core, Data, MultivectorValues};

use std::sync::Arc;

use pyo3::exceptions::PyIndexError;

use crate::buffers::{new_bytes, shared_view, typed, with_bytes, Elem};
use crate::errors;

/// Run a framing expression twice: once to count, once into the final `bytes`.
macro_rules! framed {
    ($py:expr, |$out:ident| $body:expr) => {{
        let mut counter = Counter::default();
        {
            let $out = &mut counter;
            $body
        }
        .map_err(errors::shape)?;
        new_bytes($py, counter.0, |writer| {
            {
                let $out = writer;
                $body
            }
            .map_err(errors::shape)
        })
    }};
}

/// Dense float32 result (TV-F4, TV-F5).
#[pyfunction]
#[pyo3(signature = (values, *, dims = None, item_id = None, normalize = false))]
pub fn frame_dense<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
    dims: Option<u64>,
    item_id: Option<&str>,
    normalize: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    let buf = typed(values, Elem::F32)?;
    let v = buf.as_bytes();
    framed!(py, |out| core::frame_dense(
        out, v, dims, item_id, normalize
    ))
}

/// The framed results of one batch: a single buffer plus item offsets. Later native stages
/// (WorkResult encoding, publish framing) take slices of it without per-item Python objects;
/// `batch[i]` is a zero-copy memoryview of item `i`.
#[pyclass(frozen, sequence, module = "sie_sidecar._native")]
pub struct FramedBatch {
    data: Arc<Vec<u8>>,
    offsets: Vec<usize>,
}

#[pymethods]
impl FramedBatch {
    fn __len__(&self) -> usize {
        self.offsets.len() - 1
    }

    fn __getitem__(&self, py: Python<'_>, index: isize) -> PyResult<Py<PyAny>> {
        let n = self.__len__() as isize;
        let i = if index < 0 { index + n } else { index };
        if !(0..n).contains(&i) {
            return Err(PyIndexError::new_err("FramedBatch index out of range"));
        }
        let i = i as usize;
        shared_view(
            py,
            Arc::clone(&self.data),
            self.offsets[i],
            self.offsets[i + 1],
        )
    }

    fn __iter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let views = (0..self.__len__())
            .map(|i| {
                shared_view(
                    py,
                    Arc::clone(&self.data),
                    self.offsets[i],
                    self.offsets[i + 1],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, views)?.try_iter()?.into_any().unbind())
    }

    /// The whole buffer (all items back to back).
    #[getter]
    fn buffer(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        shared_view(py, Arc::clone(&self.data), 0, self.data.len())
    }

    /// `len(batch) + 1` offsets: item `i` is `buffer[offsets[i]:offsets[i + 1]]`.
    #[getter]
    fn offsets(&self) -> Vec<usize> {
        self.offsets.clone()
    }

    /// Every item as its own `bytes` (copies; for callers that need owned bytes).
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.offsets
                .windows(2)
                .map(|w| PyBytes::new(py, &self.data[w[0]..w[1]])),
        )
    }
}

/// Dense results for every row of a 2-D float32 matrix: one call and one allocation per batch.
#[pyfunction]
#[pyo3(signature = (matrix, *, item_ids = None, normalize = false))]
pub fn frame_dense_batch(
    matrix: &Bound<'_, PyAny>,
    item_ids: Option<Vec<Option<String>>>,
    normalize: bool,
) -> PyResult<FramedBatch> {
    let shape: Vec<usize> = matrix.getattr("shape")?.extract()?;
    let [rows, dim] = shape[..] else {
        return Err(errors::ShapeError::new_err(
            "frame_dense_batch needs a 2-D array",
        ));
    };
    if let Some(ids) = &item_ids {
        if ids.len() != rows {
            return Err(errors::ShapeError::new_err(format!(
                "{} item ids for {rows} rows",
                ids.len()
            )));
        }
    }
    let buf = typed(matrix, Elem::F32)?;
    let all = buf.as_bytes();
    let row_bytes = dim * 4;
    // Rows without an id share one header, written once and copied in front of each row.
    let mut shared = Vec::new();
    core::write_dense_header(&mut shared, dim as u64, None);
    let header = |i: usize| -> std::borrow::Cow<'_, [u8]> {
        match item_ids.as_ref().and_then(|ids| ids[i].as_deref()) {
            None => std::borrow::Cow::Borrowed(&shared),
            Some(id) => {
                let mut h = Vec::with_capacity(shared.len() + id.len() + 8);
                core::write_dense_header(&mut h, dim as u64, Some(id));
                std::borrow::Cow::Owned(h)
            }
        }
    };
    let headers: Vec<_> = (0..rows).map(header).collect();
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0);
    for h in &headers {
        offsets.push(offsets[offsets.len() - 1] + h.len() + row_bytes);
    }
    let mut data = Vec::with_capacity(offsets[rows]);
    for (i, h) in headers.iter().enumerate() {
        data.extend_from_slice(h);
        core::write_dense_values(
            &mut data,
            &all[i * row_bytes..(i + 1) * row_bytes],
            normalize,
        );
    }
    Ok(FramedBatch {
        data: Arc::new(data),
        offsets,
    })
}

/// Sparse result with int32 indices (TV-F6..TV-F8).
#[pyfunction]
#[pyo3(signature = (indices, values, *, dims = None, item_id = None))]
pub fn frame_sparse<'py>(
    py: Python<'py>,
    indices: &Bound<'py, PyAny>,
    values: &Bound<'py, PyAny>,
    dims: Option<u64>,
    item_id: Option<&str>,
) -> PyResult<Bound<'py, PyBytes>> {
    let ib = typed(indices, Elem::I32)?;
    let vb = typed(values, Elem::F32)?;
    let (i, v) = (ib.as_bytes(), vb.as_bytes());
    framed!(py, |out| core::frame_sparse(out, i, v, dims, item_id))
}

/// Multivector result, float32 or float16 (TV-F9..TV-F11).
#[pyfunction]
#[pyo3(signature = (values, num_tokens, token_dims, *, dtype = "float32", item_id = None, values_f16 = None))]
pub fn frame_multivector<'py>(
    py: Python<'py>,
    values: Option<&Bound<'py, PyAny>>,
    num_tokens: u64,
    token_dims: u64,
    dtype: &str,
    item_id: Option<&str>,
    values_f16: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    if let Some(f16) = values_f16 {
        return with_bytes(f16, |b| {
            framed!(py, |out| core::frame_multivector(
                out,
                MultivectorValues::F16(b),
                num_tokens,
                token_dims,
                dtype,
                item_id
            ))
        });
    }
    let Some(values) = values else {
        return Err(errors::ShapeError::new_err(
            "multivector needs values or values_f16",
        ));
    };
    let buf = typed(values, Elem::F32)?;
    let v = buf.as_bytes();
    framed!(py, |out| core::frame_multivector(
        out,
        MultivectorValues::F32(v),
        num_tokens,
        token_dims,
        dtype,
        item_id
    ))
}

/// Score result: sorted descending, stable, f32 widened to f64 (TV-F12..TV-F14).
#[pyfunction]
pub fn frame_score<'py>(
    py: Python<'py>,
    scores: &Bound<'py, PyAny>,
    item_ids: Vec<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    let buf = typed(scores, Elem::F32)?;
    let scores: Vec<f32> = buf
        .as_bytes()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let ids: Vec<&str> = item_ids.iter().map(String::as_str).collect();
    framed!(py, |out| core::frame_score(out, &scores, &ids))
}

/// float32 → float16 little-endian bytes, round to nearest, ties to even (TV-F15).
#[pyfunction]
pub fn f32_to_f16<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let buf = typed(values, Elem::F32)?;
    let v = buf.as_bytes();
    PyBytes::new_with(py, v.len() / 2, |out| {
        for (dst, src) in out.chunks_exact_mut(2).zip(v.chunks_exact(4)) {
            let bits = core::f32_to_f16_bits(f32::from_le_bytes([src[0], src[1], src[2], src[3]]));
            dst.copy_from_slice(&bits.to_le_bytes());
        }
        Ok(())
    })
}

/// A msgpack-numpy sentinel over raw element bytes (the Python wrapper supplies dtype and shape).
#[pyfunction]
pub fn nd_sentinel_raw<'py>(
    py: Python<'py>,
    type_code: &str,
    shape: Vec<u64>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    with_bytes(data, |bytes| {
        let mut c = Counter::default();
        core::write_sentinel(&mut c, type_code, &shape, &Data::Raw(bytes));
        PyBytes::new_with(py, c.0, |buf| {
            core::write_sentinel(
                &mut SliceWriter::new(buf),
                type_code,
                &shape,
                &Data::Raw(bytes),
            );
            Ok(())
        })
    })
}
