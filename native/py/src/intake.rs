//! The §4.1 intake of a whole pulled batch in one call (sidecar-behaviour §4.1): for every message
//! its delivery, the unsafe-reply and malformed-subject verdicts, and the accepted deliveries
//! grouped by model. A `LazyDelivery` the inbound scanner made is itself the delivery; any other
//! message becomes a `LazyDelivery` when its payload can be read in place, else the `Delivery`
//! dataclass (filled straight into its slots) with its WorkItem decoded.
//!
//! The twin is the loop of `pipeline.intake.Intake.verdicts`; this runs only while both tombstone
//! sets are empty (no cancellation lookup per item), which is the common case. Nothing is logged
//! here: what deserves a warning comes back as a note, and Python logs it (rate-limited).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::IntoPyObjectExt;

use crate::lazy::{parse, LazyDelivery, ADMISSION_POOL, MODEL_ID, REPLY_SUBJECT};
use crate::slots::SlotLayout;
use crate::workitem::{decode_work_item, WorkItemError};

/// The `Delivery` dataclass's fields, in the order the slots are filled.
const DELIVERY_FIELDS: [&str; 9] = [
    "msg",
    "worker_direct",
    "item",
    "model",
    "settled",
    "payload_fetch_ms",
    "prepared_tokens",
    "prepared_audio",
    "release",
];
const MSG: usize = 0;
const DIRECT: usize = 1;
const ITEM: usize = 2;
const MODEL: usize = 3;
const SETTLED: usize = 4;
const FETCH_MS: usize = 5;
const TOKENS: usize = 6;
const AUDIO: usize = 7;
const RELEASE: usize = 8;

/// The slot layout of the first class filled (`pipeline.delivery.Delivery`); `None` inside when
/// that class is not a plain `__slots__` class with exactly these fields.
static LAYOUT: PyOnceLock<Option<SlotLayout>> = PyOnceLock::new();

fn layout_of(cls: &Bound<'_, PyType>) -> PyResult<Option<SlotLayout>> {
    let py = cls.py();
    // Exactly the fields above: a slot this did not know of would stay unset (an AttributeError later).
    let Ok(slots) = cls.getattr(intern!(py, "__slots__")) else {
        return Ok(None);
    };
    let Ok(slots) = slots.extract::<Vec<String>>() else {
        return Ok(None);
    };
    let mut expected: Vec<&str> = DELIVERY_FIELDS.to_vec();
    let mut got: Vec<&str> = slots.iter().map(String::as_str).collect();
    expected.sort_unstable();
    got.sort_unstable();
    if expected != got {
        return Ok(None);
    }
    let names: Vec<Py<PyString>> = DELIVERY_FIELDS
        .iter()
        .map(|f| PyString::intern(py, f).unbind())
        .collect();
    SlotLayout::of(cls, &names)
}

/// `wire.is_safe_reply_subject`: empty (fire-and-forget), or a gateway inbox (`_INBOX.`) with no
/// space or control character (either would split the `PUB` line the reply is framed into).
pub fn safe_reply_subject(subject: &str) -> bool {
    subject.is_empty()
        || (subject.starts_with("_INBOX.") && subject.chars().all(|c| c > ' ' && c != '\x7f'))
}

/// What `intake_batch` found for one batch.
struct Verdicts<'py> {
    groups: Bound<'py, PyDict>,
    naks: Bound<'py, PyList>,
    drops: Bound<'py, PyList>,
    notes: Bound<'py, PyList>,
}

/// Whether a model's accepted deliveries so far are all "plain": one operation, encode or score,
/// no options and no offloaded payload (the dispatcher then skips its per-item checks).
enum Plain {
    /// "" while the group has no delivery yet.
    Op(&'static str),
    Mixed,
}

fn static_op(op: &str) -> &'static str {
    match op {
        "encode" => "encode",
        "score" => "score",
        _ => "",
    }
}

/// What every slotted `Delivery` of a batch shares.
struct Shared<'a, 'py> {
    layout: &'a SlotLayout,
    release: &'a Bound<'py, PyAny>,
    no: Py<PyAny>,
    zero: Py<PyAny>,
}

impl<'py> Shared<'_, 'py> {
    /// A `Delivery` filled straight into its slots (the decoded path).
    fn delivery(
        &self,
        msg: &Bound<'py, PyAny>,
        direct: &Py<PyAny>,
        item: Py<PyAny>,
        model: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = msg.py();
        let layout = self.layout;
        let d = layout.alloc(py)?;
        layout.put(&d, MSG, msg.clone().unbind());
        layout.put(&d, DIRECT, direct.clone_ref(py));
        layout.put(&d, ITEM, item);
        layout.put(&d, MODEL, model.clone().unbind());
        layout.put(&d, SETTLED, self.no.clone_ref(py));
        layout.put(&d, FETCH_MS, self.zero.clone_ref(py));
        layout.put(&d, TOKENS, py.None());
        layout.put(&d, AUDIO, py.None());
        layout.put(&d, RELEASE, self.release.clone().unbind());
        Ok(d)
    }
}

/// sidecar-behaviour §4.1 row 1: a header beginning `Nats-` (case-insensitive) other than
/// `Nats-Msg-Id` marks a message the server copied (`pipeline.intake.server_copied` is the twin).
pub fn server_copied(headers: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !headers.is_truthy()? {
        return Ok(false);
    }
    for name in headers.try_iter()? {
        let name = name?;
        let Ok(name) = name.cast::<PyString>() else {
            continue;
        };
        let lowered = name.call_method0(intern!(name.py(), "lower"))?;
        let lowered = lowered.cast::<PyString>()?.to_str()?;
        if lowered.starts_with("nats-") && lowered != "nats-msg-id" {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How pool names compare (§8): trimmed of Unicode White_Space (what `str::trim` strips; the twin
/// strips the same set), lowercase.
fn pool_key(name: &str) -> String {
    name.trim().to_lowercase()
}

/// The pool admission rule of §4.1 row 11 (`pipeline.admission.Admission.item_rule`): the
/// physical decision, the own pool's key, and the logical pools' keys (a frozenset).
pub struct AdmissionRule<'py> {
    physical: bool,
    own: String,
    logical: Bound<'py, PyAny>,
}

impl<'py> AdmissionRule<'py> {
    /// §8 per item: an empty or own-pool `admission_pool` takes the physical decision; any other
    /// must be one of the logical pools (twin: `pipeline.admission.item_admitted`).
    fn admits(&self, admission_pool: &str) -> PyResult<bool> {
        if admission_pool.is_empty() {
            return Ok(self.physical); // the usual item: no allocation
        }
        let key = pool_key(admission_pool);
        if key.is_empty() || key == self.own {
            return Ok(self.physical);
        }
        self.logical.contains(key)
    }

    /// The pool an item read in place names, when it is not admitted (the note's detail).
    fn refuses(
        &self,
        py: Python<'py>,
        admission_pool: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok((!self.admits(admission_pool)?).then(|| PyString::new(py, admission_pool).into_any()))
    }

    /// The same for a decoded WorkItem (its `admission_pool` str is the detail).
    fn refuses_item(&self, item: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let pool = item.getattr(intern!(item.py(), "admission_pool"))?;
        let ok = self.admits(pool.cast::<PyString>()?.to_str()?)?;
        Ok((!ok).then_some(pool))
    }
}

impl<'py> Verdicts<'py> {
    /// §4.1 rows 5 and 11 for a decoded delivery, and the subject-wins note: false when it was
    /// ACK-dropped (unsafe reply subject) or NAKed (`unadmitted`: the pool not admitted).
    fn accepts(
        &self,
        d: &Bound<'py, PyAny>,
        reply_ok: bool,
        unadmitted: Option<Bound<'py, PyAny>>,
        mismatch: bool,
    ) -> PyResult<bool> {
        let py = d.py();
        if !reply_ok {
            self.drops.append(d)?;
            self.notes.append(("unsafe", d, py.None()))?;
            return Ok(false);
        }
        if let Some(pool) = unadmitted {
            self.naks.append(d)?;
            self.notes.append(("unadmitted", d, pool))?;
            return Ok(false);
        }
        if mismatch {
            self.notes.append(("mismatch", d, py.None()))?;
        }
        Ok(true)
    }
}

/// A decoded WorkItem's verdict parts: reply subject safe, payload names another model than the
/// subject's, and its plain operation.
fn checked(
    item: &Bound<'_, PyAny>,
    model: &Bound<'_, PyString>,
) -> PyResult<(bool, bool, Option<&'static str>)> {
    let py = item.py();
    let reply = item.getattr(intern!(py, "reply_subject"))?;
    let reply_ok = safe_reply_subject(reply.cast::<PyString>()?.to_str()?);
    let named = item.getattr(intern!(py, "model_id"))?;
    let mismatch = !(named.is(model) || named.eq(model)?);
    let op = plain_op(item)?.and_then(|op| op.to_str().ok().map(static_op));
    Ok((reply_ok, mismatch, op))
}

/// The operation of a plain item (`None`: not plain).
fn plain_op<'py>(item: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyString>>> {
    let py = item.py();
    let op = item
        .getattr(intern!(py, "operation"))?
        .cast_into::<PyString>()?;
    let ref_field = match op.to_str()? {
        "encode" => intern!(py, "payload_ref"),
        "score" => intern!(py, "query_payload_ref"),
        _ => return Ok(None),
    };
    if !item.getattr(ref_field)?.is_none() {
        return Ok(None);
    }
    let options = item.getattr(intern!(py, "options"))?;
    if !(options.is_none() || (options.cast::<PyDict>().is_ok_and(|d| d.is_empty()))) {
        return Ok(None);
    }
    Ok(Some(op))
}

/// The verdicts of a pulled batch whose tombstone sets are empty: `(groups, naks, drops, notes,
/// plain)`, or `None` when `delivery_cls` is not the slot class this fills (the caller's loop
/// decides). `lazy=False` decodes every payload (the parity tests compare both).
///
/// `subject_info(subject) -> (model | None, worker_direct)` is called once per run of equal
/// subjects. `groups` maps each model to its accepted deliveries in arrival order. `notes` are
/// `(kind, delivery, detail)` for Python to log: `"undecodable"` (NAKed; detail: the error),
/// `"unsafe"` (dropped) and `"mismatch"` (accepted, but the payload names another model than the
/// subject: the caller makes the subject's model win). `plain` maps each model whose accepted
/// deliveries are all of one operation, encode or score, with no options and no offloaded
/// payload, to that operation.
///
/// `admission` (the pool admission rule, `None` without a gateway) NAKs an accepted item whose
/// `admission_pool` is not admitted (§4.1 row 11), with the note `"unadmitted"` (detail: the pool).
#[pyfunction]
#[pyo3(signature = (messages, subject_info, delivery_cls, item_cls, release, lazy = true, admission = None))]
#[allow(clippy::too_many_arguments)]
pub fn intake_batch<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    subject_info: &Bound<'py, PyAny>,
    delivery_cls: &Bound<'py, PyType>,
    item_cls: &Bound<'py, PyType>,
    release: &Bound<'py, PyAny>,
    lazy: bool,
    admission: Option<(bool, String, Bound<'py, PyAny>)>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let admission = admission.map(|(physical, own, logical)| AdmissionRule {
        physical,
        own,
        logical,
    });
    let layout = LAYOUT
        .get_or_try_init(py, || layout_of(delivery_cls))?
        .as_ref()
        .filter(|l| l.is_for(delivery_cls));
    let Some(layout) = layout else {
        return Ok(None);
    };
    let out = Verdicts {
        groups: PyDict::new(py),
        naks: PyList::empty(py),
        drops: PyList::empty(py),
        notes: PyList::empty(py),
    };
    let (k_subject, k_data) = (intern!(py, "subject"), intern!(py, "data"));
    let k_headers = intern!(py, "headers");
    let empty = PyString::intern(py, "");
    let no = false.into_py_any(py)?;
    let shared = Shared {
        layout,
        release,
        no: no.clone_ref(py),
        zero: 0.0f64.into_py_any(py)?,
    };
    let mut direct_flag = false;
    let mut last_subject: Option<Bound<'py, PyAny>> = None;
    let mut model: Option<Bound<'py, PyString>> = None;
    let mut direct = no.clone_ref(py);
    let mut group: Option<(Bound<'py, PyString>, Bound<'py, PyList>, usize)> = None;
    let mut plain: Vec<(Bound<'py, PyString>, Plain)> = Vec::new();
    for msg in messages.try_iter()? {
        let msg = msg?;
        let scanned = msg.cast::<LazyDelivery>().ok().cloned();
        let subject = match scanned.as_ref().and_then(|d| d.borrow().origin_subject(py)) {
            Some(subject) => subject.into_any(),
            None => msg.getattr(k_subject)?,
        };
        let same = match &last_subject {
            Some(last) => last.is(&subject) || last.eq(&subject)?,
            None => false,
        };
        if !same {
            let info = subject_info.call1((&subject,))?;
            let (m, d): (Option<Bound<'py, PyString>>, Bound<'py, PyAny>) = info.extract()?;
            model = m;
            direct_flag = d.is_truthy()?;
            direct = d.unbind();
            last_subject = Some(subject);
        }
        let (d, op): (Bound<'py, PyAny>, Option<&'static str>) = if let Some(ld) = scanned {
            // A delivery the inbound scanner made (payload parsed there): this object is the delivery.
            {
                let mut this = ld.borrow_mut();
                this.worker_direct = direct_flag;
                this.release = release.clone().unbind();
                this.model = empty.clone().into_any().unbind();
            }
            let Some(m) = &model else {
                ld.borrow_mut().clear_item(py);
                out.naks.append(&ld)?;
                continue;
            };
            let view = ld.borrow().in_place(py);
            let mut unadmitted: Option<Bound<'py, PyAny>> = None;
            let verdict = match view {
                Some(view) => {
                    let raw = view.data();
                    let reply_ok = safe_reply_subject(view.parsed.str(raw, REPLY_SUBJECT));
                    if let (Some(rule), true) = (&admission, reply_ok) {
                        unadmitted = rule.refuses(py, view.parsed.str(raw, ADMISSION_POOL))?;
                    }
                    let mismatch = view.parsed.str(raw, MODEL_ID) != m.to_str()?;
                    (reply_ok, mismatch, view.parsed.plain_op(raw).map(static_op))
                }
                None => {
                    let decoded = ld.borrow_mut().decode(py);
                    match decoded {
                        Ok(item) => {
                            let item = item.bind(py);
                            let verdict = checked(item, m)?;
                            if let (Some(rule), true) = (&admission, verdict.0) {
                                unadmitted = rule.refuses_item(item)?;
                            }
                            verdict
                        }
                        Err(e) if e.is_instance_of::<WorkItemError>(py) => {
                            ld.borrow_mut().clear_item(py);
                            out.naks.append(&ld)?;
                            let detail = e.value(py).str()?;
                            out.notes.append(("undecodable", &ld, detail))?;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            let (reply_ok, mismatch, op) = verdict;
            if !out.accepts(ld.as_any(), reply_ok, unadmitted, mismatch)? {
                continue;
            }
            ld.borrow_mut().model = m.clone().into_any().unbind();
            (ld.into_any(), op)
        } else {
            // §4.1 row 1 first: a server-copied message is not work for this worker.
            if let Some(headers) = msg.getattr_opt(k_headers)? {
                if server_copied(&headers)? {
                    let d = shared.delivery(&msg, &direct, py.None(), empty.as_any())?;
                    out.drops.append(&d)?;
                    out.notes.append(("copied", &d, py.None()))?;
                    continue;
                }
            }
            let Some(m) = &model else {
                let d = shared.delivery(&msg, &direct, py.None(), empty.as_any())?;
                out.naks.append(&d)?;
                continue;
            };
            let data = msg.getattr(k_data)?;
            let parsed = match data.cast::<PyBytes>() {
                Ok(bytes) if lazy => parse(bytes.as_bytes()).map(|p| (bytes.clone(), p)),
                _ => None,
            };
            if let Some((bytes, p)) = parsed {
                // The WorkItem stays in its payload (LazyDelivery): same checks, no object per field.
                let raw = bytes.as_bytes();
                let reply_ok = safe_reply_subject(p.str(raw, REPLY_SUBJECT));
                let mismatch = reply_ok && p.str(raw, MODEL_ID) != m.to_str()?;
                let op = p.plain_op(raw).map(static_op);
                let unadmitted = match &admission {
                    Some(rule) if reply_ok => rule.refuses(py, p.str(raw, ADMISSION_POOL))?,
                    _ => None,
                };
                let model_of = if reply_ok && unadmitted.is_none() {
                    m.as_any()
                } else {
                    empty.as_any()
                };
                let d = Bound::new(
                    py,
                    LazyDelivery::of_message(
                        py,
                        msg.clone().unbind(),
                        direct_flag,
                        model_of.clone().unbind(),
                        release.clone().unbind(),
                        bytes,
                        p,
                        item_cls.clone().unbind(),
                    ),
                )?
                .into_any();
                if !out.accepts(&d, reply_ok, unadmitted, mismatch)? {
                    continue;
                }
                (d, op)
            } else {
                let item = match decode_work_item(py, &data, item_cls) {
                    Ok(item) => item.into_bound(py),
                    Err(e) if e.is_instance_of::<WorkItemError>(py) => {
                        let d = shared.delivery(&msg, &direct, py.None(), empty.as_any())?;
                        out.naks.append(&d)?;
                        let detail = e.value(py).str()?;
                        out.notes.append(("undecodable", &d, detail))?;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let (reply_ok, mismatch, op) = checked(&item, m)?;
                let unadmitted = match &admission {
                    Some(rule) if reply_ok => rule.refuses_item(&item)?,
                    _ => None,
                };
                let model_of = if reply_ok && unadmitted.is_none() {
                    m.as_any()
                } else {
                    empty.as_any()
                };
                let d = shared.delivery(&msg, &direct, item.unbind(), model_of)?;
                if !out.accepts(&d, reply_ok, unadmitted, mismatch)? {
                    continue;
                }
                (d, op)
            }
        };
        let Some(m) = &model else {
            unreachable!("a delivery without a model was NAKed above")
        };
        // Consecutive deliveries of one model (the usual pull) reuse the group found last.
        let same_group = match &group {
            Some((gm, _, _)) => gm.is(m) || gm.as_any().eq(m)?,
            None => false,
        };
        if !same_group {
            let list = match out.groups.get_item(m)? {
                Some(list) => list.cast_into::<PyList>()?,
                None => {
                    let list = PyList::empty(py);
                    out.groups.set_item(m, &list)?;
                    list
                }
            };
            let mut at = None;
            for (i, (pm, _)) in plain.iter().enumerate() {
                if pm.as_any().eq(m)? {
                    at = Some(i);
                    break;
                }
            }
            let at = at.unwrap_or_else(|| {
                plain.push((m.clone(), Plain::Op(""))); // "": its first item decides
                plain.len() - 1
            });
            group = Some((m.clone(), list, at));
        }
        let Some((_, list, at)) = &group else {
            unreachable!("a group was just chosen")
        };
        list.append(&d)?;
        let state = &mut plain[*at].1;
        if let Plain::Op(current) = *state {
            *state = match op {
                Some(item_op) if current.is_empty() || current == item_op => Plain::Op(item_op),
                _ => Plain::Mixed,
            };
        }
    }
    let plain_models = PyDict::new(py);
    for (m, state) in plain {
        if let Plain::Op(op) = state {
            if !op.is_empty() {
                plain_models.set_item(m, op)?;
            }
        }
    }
    Ok(Some(PyTuple::new(
        py,
        [
            out.groups.into_any(),
            out.naks.into_any(),
            out.drops.into_any(),
            out.notes.into_any(),
            plain_models.into_any(),
        ],
    )?))
}

#[cfg(test)]
mod tests {
    use super::safe_reply_subject;

    #[test]
    fn reply_subjects_are_gateway_inboxes_without_spaces_or_controls() {
        assert!(safe_reply_subject(""));
        assert!(safe_reply_subject("_INBOX.gw.r1"));
        assert!(safe_reply_subject("_INBOX.gw.é"));
        assert!(!safe_reply_subject("_INBOX"));
        assert!(!safe_reply_subject("sie.config.models.x"));
        assert!(!safe_reply_subject("_INBOX.gw.x y"));
        assert!(!safe_reply_subject("_INBOX.gw.x\r\nPUB a 1"));
        assert!(!safe_reply_subject("_INBOX.gw.\x7f"));
        assert!(!safe_reply_subject("_INBOX.gw.\t"));
    }
}
