//! The OTLP metrics export request (`ExportMetricsServiceRequest`) written from the registry's
//! points as `otel.metrics.MetricsBridge` shapes them, for the SDK's OTLP/HTTP metric exporter to
//! send: the same message the SDK's encoder builds from the bridge's `MetricsData` (the tests
//! parse both and compare).
//!
//! Why: the SDK's encoder builds a protobuf object per metric, point and attribute in Python,
//! ~0.7 ms of the ~1.3 ms an export of the sidecar's ~40 series costs the export thread in a quiet
//! process, 3-6 ms in a busy one, where that thread shares the interpreter with the serving loop
//! (docs/benchmarks.md, issue 32's eighth session). Each nested message is written into its own
//! buffer and copied into its parent's once: a few kilobytes, well under the Python encoder's cost.

use crate::otlp_direct::{put_delimited_header, put_key, put_varint, FIXED64, LEN, VARINT};

/// One number point: a gauge's (no start time) or a sum's.
#[derive(Debug, Clone, PartialEq)]
pub struct NumberPoint {
    pub attributes: Vec<(String, String)>,
    pub start_time_unix_nano: u64,
    pub time_unix_nano: u64,
    pub value: f64,
}

/// One explicit-bucket histogram point.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramPoint {
    pub attributes: Vec<(String, String)>,
    pub start_time_unix_nano: u64,
    pub time_unix_nano: u64,
    pub count: u64,
    pub sum: f64,
    pub bucket_counts: Vec<u64>,
    pub explicit_bounds: Vec<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// A metric's data, as the bridge makes it: counters are monotonic sums.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricData {
    Gauge(Vec<NumberPoint>),
    Sum {
        points: Vec<NumberPoint>,
        temporality: i32,
        monotonic: bool,
    },
    Histogram {
        points: Vec<HistogramPoint>,
        temporality: i32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: String,
    pub unit: String,
    pub data: MetricData,
}

fn put_str(out: &mut Vec<u8>, tag: u32, s: &str) {
    if !s.is_empty() {
        put_delimited_header(out, tag, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

/// A nested message, written into its own buffer and copied in after its length (always present: a
/// message field that is set is written even when empty).
fn put_message(out: &mut Vec<u8>, tag: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    put_delimited_header(out, tag, inner.len());
    out.extend_from_slice(&inner);
}

fn put_fixed64(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        put_key(out, tag, FIXED64);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// A double with presence (a oneof member or `optional`): written whatever its value.
fn put_double(out: &mut Vec<u8>, tag: u32, v: f64) {
    put_key(out, tag, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_enum(out: &mut Vec<u8>, tag: u32, v: i32) {
    if v != 0 {
        put_key(out, tag, VARINT);
        put_varint(out, i64::from(v) as u64);
    }
}

/// `KeyValue { key, value: AnyValue { string_value } }`.
fn put_string_attribute(out: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    put_message(out, tag, |kv| {
        put_str(kv, 1, key);
        put_message(kv, 2, |any| {
            // A oneof member: written even when empty.
            put_delimited_header(any, 1, value.len());
            any.extend_from_slice(value.as_bytes());
        });
    });
}

fn put_packed_fixed64(out: &mut Vec<u8>, tag: u32, values: impl ExactSizeIterator<Item = [u8; 8]>) {
    if values.len() > 0 {
        put_key(out, tag, LEN);
        put_varint(out, (values.len() * 8) as u64);
        for v in values {
            out.extend_from_slice(&v);
        }
    }
}

fn put_number_point(out: &mut Vec<u8>, point: &NumberPoint) {
    put_fixed64(out, 2, point.start_time_unix_nano);
    put_fixed64(out, 3, point.time_unix_nano);
    put_double(out, 4, point.value);
    for (key, value) in &point.attributes {
        put_string_attribute(out, 7, key, value);
    }
}

fn put_histogram_point(out: &mut Vec<u8>, point: &HistogramPoint) {
    put_fixed64(out, 2, point.start_time_unix_nano);
    put_fixed64(out, 3, point.time_unix_nano);
    put_fixed64(out, 4, point.count);
    put_double(out, 5, point.sum);
    put_packed_fixed64(out, 6, point.bucket_counts.iter().map(|c| c.to_le_bytes()));
    put_packed_fixed64(
        out,
        7,
        point.explicit_bounds.iter().map(|b| b.to_le_bytes()),
    );
    for (key, value) in &point.attributes {
        put_string_attribute(out, 9, key, value);
    }
    if let Some(min) = point.min {
        put_double(out, 11, min);
    }
    if let Some(max) = point.max {
        put_double(out, 12, max);
    }
}

fn put_metric(out: &mut Vec<u8>, metric: &Metric) {
    put_str(out, 1, &metric.name);
    put_str(out, 3, &metric.unit);
    match &metric.data {
        MetricData::Gauge(points) => put_message(out, 5, |gauge| {
            for point in points {
                put_message(gauge, 1, |p| put_number_point(p, point));
            }
        }),
        MetricData::Sum {
            points,
            temporality,
            monotonic,
        } => put_message(out, 7, |sum| {
            for point in points {
                put_message(sum, 1, |p| put_number_point(p, point));
            }
            put_enum(sum, 2, *temporality);
            if *monotonic {
                put_key(sum, 3, VARINT);
                sum.push(1);
            }
        }),
        MetricData::Histogram {
            points,
            temporality,
        } => put_message(out, 9, |histogram| {
            for point in points {
                put_message(histogram, 1, |p| put_histogram_point(p, point));
            }
            put_enum(histogram, 2, *temporality);
        }),
    }
}

/// One `ExportMetricsServiceRequest`: one resource (string attributes, in order), one
/// instrumentation scope, `metrics` in order.
pub fn encode_metrics_request(
    resource: &[(String, String)],
    scope_name: &str,
    scope_version: &str,
    metrics: &[Metric],
) -> Vec<u8> {
    let mut out = Vec::new();
    put_message(&mut out, 1, |resource_metrics| {
        put_message(resource_metrics, 1, |r| {
            for (key, value) in resource {
                put_string_attribute(r, 1, key, value);
            }
        });
        put_message(resource_metrics, 2, |scope_metrics| {
            put_message(scope_metrics, 1, |scope| {
                put_str(scope, 1, scope_name);
                put_str(scope, 2, scope_version);
            });
            for metric in metrics {
                put_message(scope_metrics, 2, |m| put_metric(m, metric));
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_request_still_carries_its_resource_and_scope() {
        let body = encode_metrics_request(&[], "", "", &[]);
        // resource_metrics { resource {} scope_metrics { scope {} } }
        assert_eq!(body, vec![0x0a, 0x06, 0x0a, 0x00, 0x12, 0x02, 0x0a, 0x00]);
    }

    #[test]
    fn a_sum_point_is_written_field_by_field() {
        let metric = Metric {
            name: "n".to_owned(),
            unit: "1".to_owned(),
            data: MetricData::Sum {
                points: vec![NumberPoint {
                    attributes: vec![("k".to_owned(), "v".to_owned())],
                    start_time_unix_nano: 1,
                    time_unix_nano: 2,
                    value: 0.0,
                }],
                temporality: 2,
                monotonic: true,
            },
        };
        let mut out = Vec::new();
        put_metric(&mut out, &metric);
        let point: Vec<u8> = [
            vec![0x11],
            1u64.to_le_bytes().to_vec(),
            vec![0x19],
            2u64.to_le_bytes().to_vec(),
            vec![0x21],
            0f64.to_le_bytes().to_vec(),
            vec![0x3a, 0x08, 0x0a, 0x01, b'k', 0x12, 0x03, 0x0a, 0x01, b'v'],
        ]
        .concat();
        let mut sum = vec![0x0a, point.len() as u8];
        sum.extend_from_slice(&point);
        sum.extend_from_slice(&[0x10, 0x02, 0x18, 0x01]);
        let mut want = vec![0x0a, 0x01, b'n', 0x1a, 0x01, b'1', 0x3a, sum.len() as u8];
        want.extend_from_slice(&sum);
        assert_eq!(out, want);
    }
}
