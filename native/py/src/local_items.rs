//! `check_local_items`: the §11 item rules of a local-ingest request in one call per request
//! (sie_core::local_items), so the socket layer never builds a Python value per field.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use sie_core::local_items::{check_items, Rules};

use crate::buffers::with_bytes;

/// The checked items of one request: `(datas, indexes, admitted)`, one entry per slot, each data
/// the item's bytes with `reply_subject` set to `{reply_prefix}{slot}` (`reply_prefix` alone when not
/// `numbered`). `ValueError` names the rule.
#[pyfunction]
#[pyo3(signature = (items, *, request_id, endpoint, model, engine, bundle_config_hash, admission_pool, lane_pool, reply_prefix, numbered = true))]
#[allow(clippy::too_many_arguments)]
pub fn check_local_items<'py>(
    py: Python<'py>,
    items: &Bound<'py, PyAny>,
    request_id: &str,
    endpoint: &str,
    model: &str,
    engine: &str,
    bundle_config_hash: &str,
    admission_pool: &str,
    lane_pool: &str,
    reply_prefix: &str,
    numbered: bool,
) -> PyResult<(Bound<'py, PyList>, Vec<u64>, Vec<bool>)> {
    let rules = Rules {
        request_id,
        endpoint,
        model,
        engine,
        bundle_config_hash,
        admission_pool,
        lane_pool,
    };
    let slots = with_bytes(items, |b| {
        check_items(b, &rules, reply_prefix, numbered).map_err(PyValueError::new_err)
    })?;
    let datas = PyList::empty(py);
    let mut indexes = Vec::with_capacity(slots.len());
    let mut admitted = Vec::with_capacity(slots.len());
    for slot in slots {
        datas.append(PyBytes::new(py, &slot.data))?;
        indexes.push(slot.item_index);
        admitted.push(slot.admitted);
    }
    Ok((datas, indexes, admitted))
}
