//! What the dispatcher reads across a whole batch of deliveries, one call per batch (issue 30: no
//! Python loop over a batch's items on the common path).
//!
//! The twins are the `_py` functions of `pipeline.columns`. Both kinds of delivery are taken: a
//! `LazyDelivery` still read in place is read from its payload's spans, anything else (a decoded
//! `LazyDelivery`, the `Delivery` dataclass) through its attributes, exactly as the twin does.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::clock::unix_now_s;
use crate::deadlines::work_item_age;
use crate::histogram::Histogram;
use crate::lazy::{LazyDelivery, BUNDLE_CONFIG_HASH};
use crate::run_batch::traceparent_of;
use crate::tracing::add_distinct;

/// The distinct non-empty `bundle_config_hash` values of the deliveries' items, in first-seen
/// order (a delivery whose `wire_item` is None has none). The config gate's one pass (§5.5).
#[pyfunction]
pub fn config_hashes<'py>(
    py: Python<'py>,
    deliveries: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let found = PyList::empty(py);
    let mut in_place: Vec<Vec<u8>> = Vec::new();
    let (k_wire_item, k_hash) = (intern!(py, "wire_item"), intern!(py, "bundle_config_hash"));
    for d in deliveries.try_iter()? {
        let d = d?;
        if let Ok(lazy) = d.cast::<LazyDelivery>() {
            let this = lazy.borrow();
            if let Some((data, parsed)) = this.in_place_ref(py) {
                let hash = parsed.str(data, BUNDLE_CONFIG_HASH);
                if !hash.is_empty() && !in_place.iter().any(|h| h.as_slice() == hash.as_bytes()) {
                    let value = PyString::new(py, hash);
                    in_place.push(hash.as_bytes().to_vec());
                    if !found.contains(&value)? {
                        found.append(value)?;
                    }
                }
                continue;
            }
        }
        let item = d.getattr(k_wire_item)?;
        if item.is_none() {
            continue;
        }
        let hash = item.getattr(k_hash)?;
        if hash.is_truthy()? && !found.contains(&hash)? {
            found.append(hash)?;
        }
    }
    Ok(found)
}

/// Whether a delivery (a `LazyDelivery`, or anything with a `settled` attribute) is settled.
pub fn is_settled(d: &Bound<'_, PyAny>) -> PyResult<bool> {
    match d.cast::<LazyDelivery>() {
        Ok(lazy) => Ok(lazy.borrow().settled),
        Err(_) => d.getattr(intern!(d.py(), "settled"))?.is_truthy(),
    }
}

/// The deliveries not yet settled, in order: `deliveries` itself when none is (no new list).
#[pyfunction]
pub fn unsettled<'py>(deliveries: &Bound<'py, PyList>) -> PyResult<Bound<'py, PyList>> {
    let py = deliveries.py();
    let mut first_settled = None;
    for (i, d) in deliveries.iter().enumerate() {
        if is_settled(&d)? {
            first_settled = Some(i);
            break;
        }
    }
    let Some(first) = first_settled else {
        return Ok(deliveries.clone());
    };
    let out = PyList::empty(py);
    for (i, d) in deliveries.iter().enumerate() {
        if i != first && (i < first || !is_settled(&d)?) {
            out.append(d)?;
        }
    }
    Ok(out)
}

/// What the RunBatch writer takes from a batch: `(items, payload_fetch_ms, prepared_tokens,
/// prepared_audio)`. `items`: each delivery's `wire_item` that is not None. The other three have
/// one entry per delivery, or are None when every entry would be 0.0 / None (the writer reads None
/// as exactly that); tokens only for `encode`, audio only for `extract`.
///
/// With `ages` (metrics on), each item's work-item age at this moment (§5.6, the execution commit)
/// is recorded into it: seconds from its gateway timestamp, never negative, items without a positive
/// timestamp skipped (`deadlines::work_item_age`). With `contexts` (tracing on), the items'
/// distinct non-empty `traceparent`s are appended to it in order, as the batch tracer reads them
/// (its `start_batch` takes that list). Both in the one pass that reads the items: each was a pass
/// of its own over the batch, ~100 est an item together (docs/benchmarks.md, issue 32).
#[pyfunction]
#[pyo3(signature = (deliveries, op, ages = None, contexts = None))]
pub fn run_batch_columns<'py>(
    py: Python<'py>,
    deliveries: &Bound<'py, PyList>,
    op: &str,
    ages: Option<&Bound<'py, Histogram>>,
    contexts: Option<&Bound<'py, PyList>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let now = if ages.is_some() { unix_now_s() } else { 0.0 };
    let mut aged: Vec<f64> = Vec::new();
    let mut distinct: Vec<String> = Vec::new();
    let n = deliveries.len();
    let items = PyList::empty(py);
    let mut fetch_ms: Vec<f64> = Vec::with_capacity(n);
    let mut tokens: Vec<Bound<'py, PyAny>> = Vec::with_capacity(n);
    let mut audio: Vec<Bound<'py, PyAny>> = Vec::with_capacity(n);
    let (want_tokens, want_audio) = (op == "encode", op == "extract");
    let (mut any_ms, mut any_tokens, mut any_audio) = (false, false, false);
    let k = (
        intern!(py, "wire_item"),
        intern!(py, "payload_fetch_ms"),
        intern!(py, "prepared_tokens"),
        intern!(py, "prepared_audio"),
    );
    for d in deliveries.iter() {
        let (item, ms, t, a) = match d.cast::<LazyDelivery>() {
            Ok(lazy) => {
                let item = d.getattr(k.0)?; // the delivery itself while undecoded: no copy
                let this = lazy.borrow();
                (
                    item,
                    this.payload_fetch_ms,
                    this.prepared_tokens.bind(py).clone(),
                    this.prepared_audio.bind(py).clone(),
                )
            }
            Err(_) => (
                d.getattr(k.0)?,
                d.getattr(k.1)?.extract::<f64>()?,
                if want_tokens {
                    d.getattr(k.2)?
                } else {
                    py.None().into_bound(py)
                },
                if want_audio {
                    d.getattr(k.3)?
                } else {
                    py.None().into_bound(py)
                },
            ),
        };
        if ages.is_some() {
            if let Some(age) = work_item_age(&d, now)? {
                aged.push(age);
            }
        }
        if !item.is_none() {
            if contexts.is_some() {
                traceparent_of(py, &item, &mut |s: &str| add_distinct(&mut distinct, s))?;
            }
            items.append(item)?;
        }
        any_ms |= ms != 0.0;
        fetch_ms.push(ms);
        if want_tokens {
            any_tokens |= !t.is_none();
            tokens.push(t);
        }
        if want_audio {
            any_audio |= !a.is_none();
            audio.push(a);
        }
    }
    if let Some(ages) = ages {
        if !aged.is_empty() {
            ages.borrow_mut().record_values(aged);
        }
    }
    if let Some(contexts) = contexts {
        for c in distinct {
            contexts.append(c)?;
        }
    }
    let none = || py.None().into_bound(py);
    let fetch_ms = if any_ms {
        PyList::new(py, fetch_ms)?.into_any()
    } else {
        none()
    };
    let tokens = if any_tokens {
        PyList::new(py, tokens)?.into_any()
    } else {
        none()
    };
    let audio = if any_audio {
        PyList::new(py, audio)?.into_any()
    } else {
        none()
    };
    PyTuple::new(py, [items.into_any(), fetch_ms, tokens, audio])
}

/// One latency (ms) per request of `succeeded` (request ids, in order): from the enqueue of the
/// request's first item in the batch (`request_ids[i]` was enqueued at `enqueued_at[i]`) to
/// `finished`. A request not in the batch, or enqueued at or after `finished`, gives none.
#[pyfunction]
pub fn request_latencies_ms(
    request_ids: &Bound<'_, PyList>,
    enqueued_at: Vec<f64>,
    succeeded: &Bound<'_, PyAny>,
    finished: f64,
) -> PyResult<Vec<f64>> {
    if request_ids.len() != enqueued_at.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "request_ids and enqueued_at must have the same length",
        ));
    }
    // Keyed by each str's own hash (cached in the object: no string is hashed twice); equal hashes
    // are chained and told apart by comparing the strs. A request keeps its first item's enqueue.
    let mut heads: HashMap<isize, usize, BuildHasherDefault<PyHashKey>> =
        HashMap::with_capacity_and_hasher(enqueued_at.len(), BuildHasherDefault::default());
    let mut entries: Vec<(Bound<'_, PyString>, f64, Option<usize>)> =
        Vec::with_capacity(enqueued_at.len());
    let find = |entries: &[(Bound<'_, PyString>, f64, Option<usize>)],
                mut at: Option<usize>,
                rid: &Bound<'_, PyString>| {
        while let Some(i) = at {
            if same_str(&entries[i].0, rid) {
                return Some(entries[i].1);
            }
            at = entries[i].2;
        }
        None
    };
    for (rid, at) in request_ids.iter().zip(&enqueued_at) {
        let rid = rid.cast_into::<PyString>().map_err(PyErr::from)?;
        let hash = rid.hash()?;
        let head = heads.get(&hash).copied();
        if find(&entries, head, &rid).is_none() {
            heads.insert(hash, entries.len());
            entries.push((rid, *at, head));
        }
    }
    let mut out = Vec::with_capacity(entries.len());
    for rid in succeeded.try_iter()? {
        let rid = rid?;
        let Ok(rid) = rid.cast::<PyString>() else {
            continue; // not a request id of this batch
        };
        if let Some(since) = find(&entries, heads.get(&rid.hash()?).copied(), rid) {
            if finished > since {
                out.push((finished - since) * 1000.0);
            }
        }
    }
    Ok(out)
}

/// A `Hasher` for keys that are already hashes (a Python str's cached hash): taken as they are.
#[derive(Default)]
struct PyHashKey(u64);

impl Hasher for PyHashKey {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_isize(&mut self, i: isize) {
        self.0 = i as u64;
    }
}

/// The same str: the same object, or equal text.
fn same_str(a: &Bound<'_, PyString>, b: &Bound<'_, PyString>) -> bool {
    a.is(b) || matches!((a.to_str(), b.to_str()), (Ok(x), Ok(y)) if x == y)
}
