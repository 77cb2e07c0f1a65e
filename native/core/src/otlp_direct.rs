//! The OTLP trace export request written straight from borrowed span fields, without building
//! `prost` messages: what `otlp::encode_request` writes for the same spans, byte for byte (the
//! tests compare them), for the compiled tracer's batch spans.
//!
//! Why: building the messages cloned every attribute, event name and id into its own allocation
//! (~15 per span), and prost measured each nested message once per level above it; together
//! ~13,000 instructions a span, ~200 an item with every 64-item batch traced (docs/benchmarks.md,
//! "Tracing built by the compiled core"). Here each length is computed once, bottom up, and the
//! bytes are written into one buffer.

use std::borrow::Cow;

use crate::otlp::{
    links_of, AnyValue, Event, KeyValue, Link, Span, Status, Value, FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE, STATUS_ERROR,
};

/// One batch span's fields, borrowed from where they are kept.
pub struct SpanFields<'a> {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub name: &'a str,
    pub kind: i32,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    /// The attributes every span of its lane, operation and model shares (kept once, not per span).
    pub attributes: &'a [(String, Value)],
    /// `sie.batch.size` and `sie.batch.cost`, written as Int attributes after `attributes`.
    pub batch: Option<(i64, i64)>,
    /// Attributes set on this span alone, written last.
    pub more_attributes: &'a [(String, Value)],
    /// Event names are mostly the fixed ones (`ipc.request`, `published`): borrowed, not allocated.
    pub events: &'a [(Cow<'static, str>, u64)],
    /// The items' `traceparent` strings (parsed, deduplicated and capped as `links_of` does).
    pub links: &'a [String],
    /// None: status unset; else the ERROR status' message.
    pub error: Option<&'a str>,
}

/// The attribute keys of `SpanFields::batch`.
pub const BATCH_SIZE_KEY: &str = "sie.batch.size";
pub const BATCH_COST_KEY: &str = "sie.batch.cost";

impl SpanFields<'_> {
    /// Every attribute in its written order: the shared ones, the batch's size and cost, then this
    /// span's own.
    pub fn for_each_attribute(&self, mut f: impl FnMut(&str, &Value)) {
        for (key, value) in self.attributes {
            f(key, value);
        }
        if let Some((size, cost)) = self.batch {
            f(BATCH_SIZE_KEY, &Value::Int(size));
            f(BATCH_COST_KEY, &Value::Int(cost));
        }
        for (key, value) in self.more_attributes {
            f(key, value);
        }
    }

    /// The same span as prost messages, for `otlp::encode_request` (a request mixing these spans
    /// with records of other shapes, and the tests' reference).
    pub fn to_span(&self) -> Span {
        let (links, dropped_links_count) = links_of(self.links.iter().map(String::as_str));
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            parent_span_id: self.parent_span_id.map_or_else(Vec::new, |p| p.to_vec()),
            name: self.name.to_owned(),
            kind: self.kind,
            start_time_unix_nano: self.start_time_unix_nano,
            end_time_unix_nano: self.end_time_unix_nano,
            attributes: {
                let mut kvs = Vec::new();
                self.for_each_attribute(|key, value| {
                    kvs.push(KeyValue {
                        key: key.to_owned(),
                        value: Some(AnyValue {
                            value: Some(value.clone()),
                        }),
                    });
                });
                kvs
            },
            events: self
                .events
                .iter()
                .map(|(name, at)| Event {
                    time_unix_nano: *at,
                    name: name.to_string(),
                })
                .collect(),
            links,
            dropped_links_count,
            status: Some(match self.error {
                None => Status::default(),
                Some(message) => Status {
                    message: message.to_owned(),
                    code: STATUS_ERROR,
                },
            }),
            flags: flags_of(self),
        }
    }
}

pub(crate) const VARINT: u8 = 0;
pub(crate) const FIXED64: u8 = 1;
pub(crate) const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key_len(tag: u32) -> usize {
    varint_len(u64::from(tag) << 3)
}

pub(crate) fn put_key(out: &mut Vec<u8>, tag: u32, wire: u8) {
    put_varint(out, (u64::from(tag) << 3) | u64::from(wire));
}

/// A length-delimited field of `len` bytes, key and length prefix included.
fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + varint_len(len as u64) + len
}

pub(crate) fn put_delimited_header(out: &mut Vec<u8>, tag: u32, len: usize) {
    put_key(out, tag, LEN);
    put_varint(out, len as u64);
}

/// proto3: an empty string or bytes field is not written.
fn bytes_len(tag: u32, b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        delimited_len(tag, b.len())
    }
}

fn put_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    if !b.is_empty() {
        put_delimited_header(out, tag, b.len());
        out.extend_from_slice(b);
    }
}

fn fixed64_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + 8
    }
}

fn put_fixed64(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        put_key(out, tag, FIXED64);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn fixed32_len(tag: u32, v: u32) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + 4
    }
}

fn put_fixed32(out: &mut Vec<u8>, tag: u32, v: u32) {
    if v != 0 {
        put_key(out, tag, FIXED32);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// int32/int64/uint32 as varints (a negative int sign-extended to ten bytes, as protobuf does).
fn int_len(tag: u32, v: i64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + varint_len(v as u64)
    }
}

fn put_int(out: &mut Vec<u8>, tag: u32, v: i64) {
    if v != 0 {
        put_key(out, tag, VARINT);
        put_varint(out, v as u64);
    }
}

/// `AnyValue`: its one set variant, written whatever its value (a oneof).
fn any_value_len(v: &Value) -> usize {
    match v {
        Value::String(s) => delimited_len(1, s.len()),
        Value::Bool(_) => key_len(2) + 1,
        Value::Int(i) => key_len(3) + varint_len(*i as u64),
        Value::Double(_) => key_len(4) + 8,
    }
}

fn put_any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::String(s) => {
            put_delimited_header(out, 1, s.len());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bool(b) => {
            put_key(out, 2, VARINT);
            out.push(u8::from(*b));
        }
        Value::Int(i) => {
            put_key(out, 3, VARINT);
            put_varint(out, *i as u64);
        }
        Value::Double(d) => {
            put_key(out, 4, FIXED64);
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
}

/// `KeyValue { key, value: AnyValue }` (the value always present).
fn key_value_len(key: &str, v: &Value) -> usize {
    bytes_len(1, key.as_bytes()) + delimited_len(2, any_value_len(v))
}

fn put_key_value(out: &mut Vec<u8>, tag: u32, key: &str, v: &Value) {
    put_delimited_header(out, tag, key_value_len(key, v));
    put_bytes(out, 1, key.as_bytes());
    put_delimited_header(out, 2, any_value_len(v));
    put_any_value(out, v);
}

fn event_len(name: &str, at: u64) -> usize {
    fixed64_len(1, at) + bytes_len(2, name.as_bytes())
}

fn link_len(link: &Link) -> usize {
    bytes_len(1, &link.trace_id) + bytes_len(2, &link.span_id) + fixed32_len(6, link.flags)
}

fn status_len(error: Option<&str>) -> usize {
    match error {
        None => 0,
        Some(message) => bytes_len(2, message.as_bytes()) + int_len(3, i64::from(STATUS_ERROR)),
    }
}

/// A span's length and its parsed links (parsed once, for the length and the bytes).
fn span_len(span: &SpanFields<'_>, links: &[Link], dropped: u32) -> usize {
    let parent = span.parent_span_id.as_ref().map_or(&[][..], |p| &p[..]);
    let mut n = bytes_len(1, &span.trace_id)
        + bytes_len(2, &span.span_id)
        + bytes_len(4, parent)
        + bytes_len(5, span.name.as_bytes())
        + int_len(6, i64::from(span.kind))
        + fixed64_len(7, span.start_time_unix_nano)
        + fixed64_len(8, span.end_time_unix_nano);
    span.for_each_attribute(|key, value| n += delimited_len(9, key_value_len(key, value)));
    for (name, at) in span.events {
        n += delimited_len(11, event_len(name, *at));
    }
    for link in links {
        n += delimited_len(13, link_len(link));
    }
    n += int_len(14, i64::from(dropped));
    n += delimited_len(15, status_len(span.error));
    n + fixed32_len(16, flags_of(span))
}

fn flags_of(span: &SpanFields<'_>) -> u32 {
    if span.parent_span_id.is_some() {
        FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE
    } else {
        FLAG_HAS_IS_REMOTE
    }
}

fn put_span(out: &mut Vec<u8>, span: &SpanFields<'_>, links: &[Link], dropped: u32) {
    let parent = span.parent_span_id.as_ref().map_or(&[][..], |p| &p[..]);
    put_bytes(out, 1, &span.trace_id);
    put_bytes(out, 2, &span.span_id);
    put_bytes(out, 4, parent);
    put_bytes(out, 5, span.name.as_bytes());
    put_int(out, 6, i64::from(span.kind));
    put_fixed64(out, 7, span.start_time_unix_nano);
    put_fixed64(out, 8, span.end_time_unix_nano);
    span.for_each_attribute(|key, value| put_key_value(out, 9, key, value));
    for (name, at) in span.events {
        put_delimited_header(out, 11, event_len(name, *at));
        put_fixed64(out, 1, *at);
        put_bytes(out, 2, name.as_bytes());
    }
    for link in links {
        put_delimited_header(out, 13, link_len(link));
        put_bytes(out, 1, &link.trace_id);
        put_bytes(out, 2, &link.span_id);
        put_fixed32(out, 6, link.flags);
    }
    put_int(out, 14, i64::from(dropped));
    put_delimited_header(out, 15, status_len(span.error));
    if let Some(message) = span.error {
        put_bytes(out, 2, message.as_bytes());
        put_int(out, 3, i64::from(STATUS_ERROR));
    }
    put_fixed32(out, 16, flags_of(span));
}

/// One `ExportTraceServiceRequest` holding `spans`, all of one resource (its attributes, string
/// valued, in order) and one instrumentation scope: the bytes `otlp::encode_request` writes.
pub fn encode_spans_request(
    resource: &[(String, String)],
    scope_name: &str,
    scope_version: &str,
    spans: &[SpanFields<'_>],
) -> Vec<u8> {
    let parsed: Vec<(Vec<Link>, u32)> = spans
        .iter()
        .map(|s| links_of(s.links.iter().map(String::as_str)))
        .collect();
    let span_lens: Vec<usize> = spans
        .iter()
        .zip(&parsed)
        .map(|(s, (links, dropped))| span_len(s, links, *dropped))
        .collect();
    let resource_len: usize = resource
        .iter()
        .map(|(k, v)| delimited_len(1, string_kv_len(k, v)))
        .sum();
    let scope_len = bytes_len(1, scope_name.as_bytes()) + bytes_len(2, scope_version.as_bytes());
    let scope_spans_len = delimited_len(1, scope_len)
        + span_lens
            .iter()
            .map(|&n| delimited_len(2, n))
            .sum::<usize>();
    let resource_spans_len = delimited_len(1, resource_len) + delimited_len(2, scope_spans_len);
    let mut out = Vec::with_capacity(delimited_len(1, resource_spans_len));
    put_delimited_header(&mut out, 1, resource_spans_len);
    put_delimited_header(&mut out, 1, resource_len);
    for (k, v) in resource {
        put_delimited_header(&mut out, 1, string_kv_len(k, v));
        put_bytes(&mut out, 1, k.as_bytes());
        put_delimited_header(&mut out, 2, delimited_len(1, v.len()));
        put_delimited_header(&mut out, 1, v.len());
        out.extend_from_slice(v.as_bytes());
    }
    put_delimited_header(&mut out, 2, scope_spans_len);
    put_delimited_header(&mut out, 1, scope_len);
    put_bytes(&mut out, 1, scope_name.as_bytes());
    put_bytes(&mut out, 2, scope_version.as_bytes());
    for ((span, (links, dropped)), len) in spans.iter().zip(&parsed).zip(&span_lens) {
        put_delimited_header(&mut out, 2, *len);
        put_span(&mut out, span, links, *dropped);
    }
    out
}

/// A string-valued resource attribute (`KeyValue { key, AnyValue { string_value } }`).
fn string_kv_len(key: &str, value: &str) -> usize {
    bytes_len(1, key.as_bytes()) + delimited_len(2, delimited_len(1, value.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{encode_request, string_attr, InstrumentationScope, KIND_CONSUMER};

    #[test]
    fn the_direct_writer_writes_what_prost_writes() {
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 17
        };
        let values = [
            Value::String(String::new()),
            Value::String("x".repeat(200)),
            Value::Bool(false),
            Value::Bool(true),
            Value::Int(0),
            Value::Int(-1),
            Value::Int(i64::MAX),
            Value::Double(0.0),
            Value::Double(-2.5),
        ];
        let contexts: Vec<String> = (1..=140u32)
            .map(|i| format!("00-{i:032x}-{i:016x}-01"))
            .chain(["junk".to_owned(), String::new()])
            .collect();
        for round in 0..300 {
            let mut owned = Vec::new();
            for s in 0..(round % 4) {
                let attributes: Vec<(String, Value)> = (0..next() % 8)
                    .map(|i| {
                        let key = if i == 0 {
                            String::new()
                        } else {
                            format!("k{i}")
                        };
                        (key, values[(next() as usize) % values.len()].clone())
                    })
                    .collect();
                let events: Vec<(Cow<'static, str>, u64)> = (0..next() % 4)
                    .map(|i| {
                        (
                            match i {
                                1 => Cow::Borrowed(""),
                                2 => Cow::Borrowed("published"),
                                _ => Cow::Owned(format!("e{i}")),
                            },
                            next() % 3 * next(),
                        )
                    })
                    .collect();
                let links: Vec<String> = (0..next() % 150)
                    .map(|_| contexts[(next() as usize) % contexts.len()].clone())
                    .collect();
                let split = (next() as usize) % (attributes.len() + 1);
                let batch = (next() % 2 == 0).then(|| (next() as i64, -((next() % 5) as i64)));
                owned.push((s, attributes, split, batch, events, links));
            }
            let fields: Vec<SpanFields<'_>> = owned
                .iter()
                .map(|(s, attributes, split, batch, events, links)| SpanFields {
                    trace_id: [(*s as u8) + 1; 16],
                    span_id: [7; 8],
                    parent_span_id: if s % 2 == 0 { None } else { Some([3; 8]) },
                    name: if round % 5 == 0 {
                        ""
                    } else {
                        "sidecar.dispatch"
                    },
                    kind: if round % 3 == 0 { 0 } else { KIND_CONSUMER },
                    start_time_unix_nano: round as u64 * 1_000_000_007,
                    end_time_unix_nano: if round % 7 == 0 {
                        0
                    } else {
                        u64::MAX - round as u64
                    },
                    attributes: &attributes[..*split],
                    batch: *batch,
                    more_attributes: &attributes[*split..],
                    events,
                    links,
                    error: match round % 3 {
                        0 => None,
                        1 => Some(""),
                        _ => Some("transport: gone"),
                    },
                })
                .collect();
            let resource: Vec<(String, String)> = (0..round % 3)
                .map(|i| (format!("r{i}"), "v".repeat(i * 70)))
                .collect();
            let (name, version) = if round % 2 == 0 {
                ("sie_sidecar", "1.2")
            } else {
                ("", "")
            };
            let want = encode_request(
                resource.iter().map(|(k, v)| string_attr(k, v)).collect(),
                InstrumentationScope {
                    name: name.to_owned(),
                    version: version.to_owned(),
                },
                fields.iter().map(SpanFields::to_span).collect(),
            );
            assert_eq!(
                encode_spans_request(&resource, name, version, &fields),
                want,
                "round {round}"
            );
        }
    }
}
