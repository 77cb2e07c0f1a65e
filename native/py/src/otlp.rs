//! `encode_trace_request`: finished batch spans (`otel.tracing.SpanRecord`) into one OTLP
//! `ExportTraceServiceRequest` (the compiled tracer's `BatchSpan`s read in place), encoded by sie-core's `otlp` (the SDK's exporter sends it). The
//! twin is the SDK's own encoder over `otel.traces.BatchSpanData`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};

use crate::tracing::BatchSpan;
use sie_core::otlp::{
    encode_request, hex_id, links_of, string_attr, AnyValue, Event, InstrumentationScope, KeyValue,
    Span, Status, Value, FLAG_HAS_IS_REMOTE, FLAG_IS_REMOTE, KIND_CONSUMER, KIND_INTERNAL,
    STATUS_ERROR,
};
use sie_core::otlp_direct::encode_spans_request;
use sie_core::otlp_metrics::{
    encode_metrics_request as encode_metrics_request_bytes, HistogramPoint, Metric, MetricData,
    NumberPoint,
};

fn id<const N: usize>(value: &str, what: &str) -> PyResult<[u8; N]> {
    hex_id::<N>(value).ok_or_else(|| {
        PyValueError::new_err(format!("{what} is not {} lower-case hex digits", 2 * N))
    })
}

/// A span attribute's value (str, bool, int or float), as OTLP types it.
pub(crate) fn value_of(v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if v.is_instance_of::<PyBool>() {
        Ok(Value::Bool(v.extract()?))
    } else if v.is_instance_of::<PyInt>() {
        Ok(Value::Int(v.extract()?))
    } else if v.is_instance_of::<PyFloat>() {
        Ok(Value::Double(v.extract()?))
    } else if let Ok(s) = v.cast::<PyString>() {
        Ok(Value::String(s.to_str()?.to_owned()))
    } else {
        Err(PyTypeError::new_err(format!(
            "span attribute values are str, bool, int or float, not {}",
            v.get_type().name()?
        )))
    }
}

fn span_of<'py>(record: &Bound<'py, PyAny>) -> PyResult<Span> {
    let py = record.py();
    let get = |name: &Bound<'py, PyString>| record.getattr(name);
    let trace_id: String = get(intern!(py, "trace_id"))?.extract()?;
    let span_id: String = get(intern!(py, "span_id"))?.extract()?;
    let parent: String = get(intern!(py, "parent_span_id"))?.extract()?;
    let kind: String = get(intern!(py, "kind"))?.extract()?;
    let mut attributes = Vec::new();
    for pair in get(intern!(py, "attributes"))?.try_iter()? {
        let (key, value): (String, Bound<'_, PyAny>) = pair?.extract()?;
        let value = Some(AnyValue {
            value: Some(value_of(&value)?),
        });
        // A mapping, as the SDK reads a span's attributes: a repeated key keeps its first place
        // and takes its last value.
        match attributes
            .iter_mut()
            .find(|kv: &&mut KeyValue| kv.key == key)
        {
            Some(kv) => kv.value = value,
            None => attributes.push(KeyValue { key, value }),
        }
    }
    let mut events = Vec::new();
    for pair in get(intern!(py, "events"))?.try_iter()? {
        let (name, time_unix_nano): (String, u64) = pair?.extract()?;
        events.push(Event {
            time_unix_nano,
            name,
        });
    }
    let contexts: Vec<String> = get(intern!(py, "links"))?.extract()?;
    let (links, dropped_links_count) = links_of(contexts.iter().map(String::as_str));
    let error: Option<String> = get(intern!(py, "error"))?.extract()?;
    let parent_span_id = if parent.is_empty() {
        Vec::new()
    } else {
        id::<8>(&parent, "parent_span_id")?.to_vec()
    };
    let flags = if parent.is_empty() {
        FLAG_HAS_IS_REMOTE
    } else {
        FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE
    };
    Ok(Span {
        trace_id: id::<16>(&trace_id, "trace_id")?.to_vec(),
        span_id: id::<8>(&span_id, "span_id")?.to_vec(),
        parent_span_id,
        name: get(intern!(py, "name"))?.extract()?,
        kind: if kind == "consumer" {
            KIND_CONSUMER
        } else {
            KIND_INTERNAL
        },
        start_time_unix_nano: get(intern!(py, "start_ns"))?.extract()?,
        end_time_unix_nano: get(intern!(py, "end_ns"))?.extract()?,
        attributes,
        events,
        links,
        dropped_links_count,
        status: Some(match error {
            None => Status::default(),
            Some(message) => Status {
                message,
                code: STATUS_ERROR,
            },
        }),
        flags,
    })
}

/// One OTLP trace export request: `records` (span records), under one resource (`resource`:
/// its attributes as string pairs, in order) and the instrumentation scope `scope_name` /
/// `scope_version`. Raises ValueError for an id that is not lower-case hex of its length,
/// TypeError for an attribute value that is not str, bool, int or float.
#[pyfunction]
pub fn encode_trace_request<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    resource: Vec<(String, String)>,
    scope_name: String,
    scope_version: String,
) -> PyResult<Bound<'py, PyBytes>> {
    // The compiled tracer's spans (every record, as the sidecar's exporters send them): written
    // straight from their fields, no messages built.
    let items: Vec<Bound<'py, PyAny>> = records.try_iter()?.collect::<PyResult<_>>()?;
    if !items.is_empty() && items.iter().all(|r| r.cast::<BatchSpan>().is_ok()) {
        let borrowed: Vec<PyRef<'py, BatchSpan>> = items
            .iter()
            .map(|r| r.cast::<BatchSpan>().map(|s| s.borrow()))
            .collect::<Result<_, _>>()?;
        let fields: Vec<_> = borrowed.iter().map(|s| s.fields()).collect();
        let body = encode_spans_request(&resource, &scope_name, &scope_version, &fields);
        return Ok(PyBytes::new(py, &body));
    }
    let mut spans = Vec::new();
    for record in items {
        // The compiled tracer's spans are read as they are; other records field by field.
        match record.cast::<BatchSpan>() {
            Ok(span) => spans.push(span.borrow().fields().to_span()),
            Err(_) => spans.push(span_of(&record)?),
        }
    }
    let resource = resource.iter().map(|(k, v)| string_attr(k, v)).collect();
    let scope = InstrumentationScope {
        name: scope_name,
        version: scope_version,
    };
    let body = encode_request(resource, scope, spans);
    Ok(PyBytes::new(py, &body))
}

/// A point's attributes: a dict of str to str, in its order.
fn string_attributes(attributes: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    let dict = attributes.cast::<PyDict>()?;
    dict.iter()
        .map(
            |(k, v)| match (k.cast::<PyString>(), v.cast::<PyString>()) {
                (Ok(k), Ok(v)) => Ok((k.to_str()?.to_owned(), v.to_str()?.to_owned())),
                _ => Err(PyTypeError::new_err(
                    "metric attributes are str keys and str values",
                )),
            },
        )
        .collect()
}

/// A histogram point as Python passes it: attributes (read apart, by `string_attributes`), then
/// start, time, count, sum, bucket counts, bounds, min and max.
type HistogramTuple<'py> = (
    Bound<'py, PyAny>,
    u64,
    u64,
    u64,
    f64,
    Vec<u64>,
    Vec<f64>,
    Option<f64>,
    Option<f64>,
);

fn number_point(p: &Bound<'_, PyAny>) -> PyResult<NumberPoint> {
    let (attributes, start, time, value): (Bound<'_, PyAny>, u64, u64, f64) = p.extract()?;
    Ok(NumberPoint {
        attributes: string_attributes(&attributes)?,
        start_time_unix_nano: start,
        time_unix_nano: time,
        value,
    })
}

fn histogram_point(p: &Bound<'_, PyAny>) -> PyResult<HistogramPoint> {
    let (attributes, start, time, count, sum, bucket_counts, explicit_bounds, min, max): HistogramTuple<'_> =
        p.extract()?;
    Ok(HistogramPoint {
        attributes: string_attributes(&attributes)?,
        start_time_unix_nano: start,
        time_unix_nano: time,
        count,
        sum,
        bucket_counts,
        explicit_bounds,
        min,
        max,
    })
}

/// The metrics export request for `metrics` as `otel.metrics.MetricsBridge.shapes` makes them:
/// `(name, unit, kind, temporality, points)`, kind `gauge`, `counter` (a monotonic sum) or
/// `histogram`; a number point `(attributes, start_ns, time_ns, value)`, a histogram point
/// `(attributes, start_ns, time_ns, count, sum, bucket_counts, bounds, min, max)`; attributes a
/// dict of str to str. TypeError for anything else (the caller falls back to the SDK's encoder).
#[pyfunction]
pub fn encode_metrics_request<'py>(
    py: Python<'py>,
    resource: Vec<(String, String)>,
    scope_name: &str,
    scope_version: &str,
    metrics: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out: Vec<Metric> = Vec::new();
    for metric in metrics.try_iter()? {
        let (name, unit, kind, temporality, points): (
            String,
            String,
            String,
            i32,
            Bound<'py, PyAny>,
        ) = metric?.extract()?;
        let data = match kind.as_str() {
            "histogram" => MetricData::Histogram {
                points: points
                    .try_iter()?
                    .map(|p| histogram_point(&p?))
                    .collect::<PyResult<_>>()?,
                temporality,
            },
            "gauge" | "counter" => {
                let points = points
                    .try_iter()?
                    .map(|p| number_point(&p?))
                    .collect::<PyResult<_>>()?;
                if kind == "gauge" {
                    MetricData::Gauge(points)
                } else {
                    MetricData::Sum {
                        points,
                        temporality,
                        monotonic: true,
                    }
                }
            }
            _ => {
                return Err(PyValueError::new_err(format!(
                    "unknown metric kind {kind:?}"
                )))
            }
        };
        out.push(Metric { name, unit, data });
    }
    let body = encode_metrics_request_bytes(&resource, scope_name, scope_version, &out);
    Ok(PyBytes::new(py, &body))
}
