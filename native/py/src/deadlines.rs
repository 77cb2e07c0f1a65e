//! Work deadlines across a whole batch (sidecar-behaviour §15.3, newer than v0.7.1), one call per
//! batch and stage: which items are past their deadline, which still hold a deadline lease, and
//! each item's work-item age (which `columns::run_batch_columns` records). The twins are in
//! `_twins.deadlines`.
//!
//! A deadline is *usable* only if finite, > 0, the item's timestamp > 0, and
//! 0 ≤ deadline − timestamp ≤ the max budget; anything else is ignored (counted, never judged).
//! `generate` items are never judged (§4.4). An item is *expired* when deadline + skew < now.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::columns::is_settled;
use crate::lazy::{LazyDelivery, OPERATION};

/// What a delivery's item says about its deadline: (generate, timestamp, deadline or NaN), or
/// `None` for a delivery without an item (undecodable, malformed subject).
fn fields_of(d: &Bound<'_, PyAny>) -> PyResult<Option<(bool, f64, f64)>> {
    let py = d.py();
    if let Ok(lazy) = d.cast::<LazyDelivery>() {
        let this = lazy.borrow();
        if let Some((data, p)) = this.in_place_ref(py) {
            let generate = p.str(data, OPERATION) == "generate";
            return Ok(Some((generate, p.timestamp, p.deadline)));
        }
    }
    let item = d.getattr(intern!(py, "wire_item"))?;
    if item.is_none() {
        return Ok(None);
    }
    let generate = item.getattr(intern!(py, "operation"))?.eq("generate")?;
    let timestamp: f64 = item.getattr(intern!(py, "timestamp"))?.extract()?;
    let deadline = item.getattr(intern!(py, "deadline"))?;
    let deadline = if deadline.is_none() {
        f64::NAN
    } else {
        deadline.extract()?
    };
    Ok(Some((generate, timestamp, deadline)))
}

/// A delivery's gateway timestamp (what `fields_of` reads, without the operation's string), or
/// `None` for a delivery without an item.
fn timestamp_of(d: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    let py = d.py();
    if let Ok(lazy) = d.cast::<LazyDelivery>() {
        let this = lazy.borrow();
        if !this.decoded() {
            if let Some(parsed) = &this.parsed {
                return Ok(Some(parsed.timestamp)); // read at intake: no view of the buffer needed
            }
        }
    }
    let item = d.getattr(intern!(py, "wire_item"))?;
    if item.is_none() {
        return Ok(None);
    }
    Ok(Some(item.getattr(intern!(py, "timestamp"))?.extract()?))
}

/// §15.3: a deadline the sidecar may judge by.
fn usable(timestamp: f64, deadline: f64, max_budget_s: f64) -> bool {
    deadline.is_finite()
        && deadline > 0.0
        && timestamp > 0.0
        && deadline - timestamp >= 0.0
        && deadline - timestamp <= max_budget_s
}

/// `(live, expired, usable, ignored, ahead, latest)` for one batch at wall-clock `now`: `expired` are the
/// non-generate deliveries whose usable deadline + `skew_s` is before `now`; `live` the others in
/// order (`deliveries` itself when none expired: no new list). `usable` counts the live deliveries
/// with a usable deadline (they hold a lease), `ignored` those whose deadline is present but not
/// usable, `ahead` those with a usable deadline whose timestamp is more than `skew_s` ahead of `now`
/// (the §4.1 row 8 clock observations); `latest` is the latest usable deadline of the live ones
/// (None without one), from which the RunBatch wait is derived.
#[pyfunction]
pub fn deadline_split<'py>(
    py: Python<'py>,
    deliveries: &Bound<'py, PyList>,
    now: f64,
    skew_s: f64,
    max_budget_s: f64,
) -> PyResult<Bound<'py, PyTuple>> {
    let mut expired_at: Vec<usize> = Vec::new();
    let (mut n_usable, mut ignored, mut ahead) = (0usize, 0usize, 0usize);
    let mut latest: Option<f64> = None;
    for (i, d) in deliveries.iter().enumerate() {
        let Some((generate, timestamp, deadline)) = fields_of(&d)? else {
            continue;
        };
        if generate || deadline.is_nan() {
            continue;
        }
        if !usable(timestamp, deadline, max_budget_s) {
            ignored += 1;
            continue;
        }
        if timestamp > now + skew_s {
            ahead += 1;
        }
        if deadline + skew_s < now {
            expired_at.push(i);
        } else {
            n_usable += 1;
            latest = Some(latest.map_or(deadline, |l| l.max(deadline)));
        }
    }
    let expired = PyList::empty(py);
    let live = if expired_at.is_empty() {
        deliveries.clone()
    } else {
        let live = PyList::empty(py);
        let mut next = expired_at.iter().peekable();
        for (i, d) in deliveries.iter().enumerate() {
            if next.peek() == Some(&&i) {
                next.next();
                expired.append(d)?;
            } else {
                live.append(d)?;
            }
        }
        live
    };
    (live, expired, n_usable, ignored, ahead, latest).into_pyobject(py)
}

/// The unsettled non-generate deliveries whose deadline lease still runs at wall-clock `now`
/// (§15.3 lease horizon): until deadline + `skew_s` when enforcing, else until deadline + `skew_s`
/// + `max_budget_s`; never past `cap` (the lease's start plus the tombstone horizon).
#[pyfunction]
#[pyo3(signature = (deliveries, now, skew_s, max_budget_s, enforce, cap))]
pub fn deadline_lease_holders<'py>(
    py: Python<'py>,
    deliveries: &Bound<'py, PyList>,
    now: f64,
    skew_s: f64,
    max_budget_s: f64,
    enforce: bool,
    cap: f64,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for d in deliveries.iter() {
        if is_settled(&d)? {
            continue;
        }
        let Some((generate, timestamp, deadline)) = fields_of(&d)? else {
            continue;
        };
        if generate || !usable(timestamp, deadline, max_budget_s) {
            continue;
        }
        let end = deadline + skew_s + if enforce { 0.0 } else { max_budget_s };
        if now < end.min(cap) {
            out.append(d)?;
        }
    }
    Ok(out)
}

/// One delivery's work-item age at `now` (never negative), or None when its item has no positive
/// timestamp (it is not recorded).
pub(crate) fn work_item_age(d: &Bound<'_, PyAny>, now: f64) -> PyResult<Option<f64>> {
    Ok(timestamp_of(d)?
        .filter(|&t| t > 0.0)
        .map(|t| (now - t).max(0.0)))
}
