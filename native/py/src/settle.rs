//! Settlement of a batch of deliveries in one call (`pipeline.delivery.Settler._finish_many`):
//! each is marked settled exactly once, and the pull capacity goes back with one `release(n)` per
//! run of deliveries from one source.
//!
//! The twin is `Settler._finish_many_py`. Both kinds of delivery are taken: a `LazyDelivery` is
//! read and written in place, anything else (the `Delivery` dataclass) through its attributes.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::lazy::LazyDelivery;

/// `(done, twice, releases)`: the deliveries settled now, in order; those already settled (a bug
/// the caller logs); and `(release, count)` per run of equal `release` callables (None skipped).
#[pyfunction]
pub fn finish_deliveries<'py>(
    py: Python<'py>,
    deliveries: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let done = PyList::empty(py);
    let twice = PyList::empty(py);
    let releases = PyList::empty(py);
    let mut current: Option<Bound<'py, PyAny>> = None;
    let mut count = 0usize;
    let (k_settled, k_release) = (intern!(py, "settled"), intern!(py, "release"));
    for d in deliveries.try_iter()? {
        let d = d?;
        let release = if let Ok(lazy) = d.cast::<LazyDelivery>() {
            let mut this = lazy.borrow_mut();
            if this.settled {
                drop(this);
                twice.append(&d)?;
                continue;
            }
            this.settled = true;
            this.release.bind(py).clone()
        } else {
            if d.getattr(k_settled)?.is_truthy()? {
                twice.append(&d)?;
                continue;
            }
            d.setattr(k_settled, true)?;
            d.getattr(k_release)?
        };
        done.append(&d)?;
        // Equal bound methods are one source (`is` alone would split every run).
        let same = match &current {
            Some(c) => c.is(&release) || c.eq(&release)?,
            None => false,
        };
        if !same {
            if let Some(c) = current.take() {
                if count > 0 && !c.is_none() {
                    releases.append((c, count))?;
                }
            }
            current = Some(release);
            count = 0;
        }
        count += 1;
    }
    if let Some(c) = current {
        if count > 0 && !c.is_none() {
            releases.append((c, count))?;
        }
    }
    PyTuple::new(py, [done.into_any(), twice.into_any(), releases.into_any()])
}
