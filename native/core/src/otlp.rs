//! OTLP trace export requests (`opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`)
//! for the sidecar's batch spans, encoded by `prost` from the subset of the OTLP schema they use.
//!
//! Why not the SDK's encoder: it builds a protobuf object per span, attribute, event and link in
//! Python, ~30 µs per batch span, ~4% of the sidecar's CPU with every batch traced
//! (docs/benchmarks.md). The SDK keeps the processor and the transport; only the encoding is here.
//! What it writes matches the SDK's encoder field for field (the Python tests parse both and
//! compare): span flags carry the `HAS_IS_REMOTE` mask (and `IS_REMOTE` for a remote parent), every
//! link is a remote context, the status is always present.
//!
//! Field numbers are those of opentelemetry-proto v1 (trace, common, resource); fields the batch
//! spans never set are left out of the structs, which omits them on the wire as proto3 does.

use prost::Message;

/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`.
pub const FLAG_HAS_IS_REMOTE: u32 = 0x100;
/// `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`.
pub const FLAG_IS_REMOTE: u32 = 0x200;
/// `SPAN_KIND_INTERNAL` and `SPAN_KIND_CONSUMER`.
pub const KIND_INTERNAL: i32 = 1;
pub const KIND_CONSUMER: i32 = 5;
/// `STATUS_CODE_ERROR` (unset is 0).
pub const STATUS_ERROR: i32 = 2;
/// Links kept per span; further valid distinct ones are counted in `dropped_links_count`.
pub const MAX_LINKS: usize = 128;

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
    pub value: Option<Value>,
}

/// The attribute values a batch span carries.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
}

#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
    #[prost(message, repeated, tag = "13")]
    pub links: Vec<Link>,
    #[prost(uint32, tag = "14")]
    pub dropped_links_count: u32,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    #[prost(string, tag = "2")]
    pub name: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(fixed32, tag = "6")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

/// Lower-case hex of exactly `2 * N` digits into `N` bytes; anything else is None.
pub fn hex_id<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// A W3C `traceparent`, strictly (as `otel.tracing.parse_traceparent`): version `00`, 32 and 16
/// lower-case hex digits (neither all zero), two hex digits of flags, nothing after. Returns the
/// trace id and span id.
pub fn parse_traceparent(value: &str) -> Option<([u8; 16], [u8; 8])> {
    let b = value.as_bytes();
    if b.len() != 55 || &b[..3] != b"00-" || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let trace: [u8; 16] = hex_id(&value[3..35])?;
    let span: [u8; 8] = hex_id(&value[36..52])?;
    hex_id::<1>(&value[53..55])?;
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some((trace, span))
}

/// A span's links from its items' `traceparent`s: the valid ones, each (trace, span) once, in
/// order, at most MAX_LINKS; and how many valid distinct ones did not fit.
pub fn links_of<'a>(traceparents: impl IntoIterator<Item = &'a str>) -> (Vec<Link>, u32) {
    let mut seen: Vec<([u8; 16], [u8; 8])> = Vec::new();
    let mut dropped = 0u32;
    for value in traceparents {
        let Some(ctx) = parse_traceparent(value) else {
            continue;
        };
        if seen.contains(&ctx) {
            continue;
        }
        if seen.len() < MAX_LINKS {
            seen.push(ctx);
        } else {
            dropped += 1; // as the Python twin counts: each occurrence past the cap
        }
    }
    let links = seen
        .into_iter()
        .map(|(trace, span)| Link {
            trace_id: trace.to_vec(),
            span_id: span.to_vec(),
            flags: FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE,
        })
        .collect();
    (links, dropped)
}

/// The request holding `spans`, all of one resource and one instrumentation scope, encoded.
pub fn encode_request(
    resource: Vec<KeyValue>,
    scope: InstrumentationScope,
    spans: Vec<Span>,
) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource,
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope),
                spans,
            }],
        }],
    }
    .encode_to_vec()
}

/// A string attribute.
pub fn string_attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(Value::String(value.to_owned())),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparents_are_read_strictly() {
        let (trace, span) = parse_traceparent(TP).unwrap();
        assert_eq!(trace[0], 0x0a);
        assert_eq!(span[7], 0x31);
        for bad in [
            "",
            &TP.replace("00-", "01-"),
            &TP.to_uppercase(),
            &format!("{TP}-"),
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",
            "00-0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn links_are_distinct_valid_and_capped() {
        let many: Vec<String> = (1..=130u32)
            .map(|i| format!("00-{:032x}-{:016x}-01", i, i))
            .collect();
        let mut input: Vec<&str> = vec![TP, "junk", TP];
        input.extend(many.iter().map(String::as_str));
        let (links, dropped) = links_of(input);
        assert_eq!(links.len(), MAX_LINKS);
        assert_eq!(dropped, 3); // 131 distinct valid, 128 kept
        assert_eq!(links[0].flags, FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE);
    }

    #[test]
    fn the_request_round_trips() {
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "sidecar.dispatch".into(),
            kind: KIND_CONSUMER,
            start_time_unix_nano: 5,
            end_time_unix_nano: 9,
            attributes: vec![string_attr("lane", "l4")],
            status: Some(Status::default()),
            flags: FLAG_HAS_IS_REMOTE,
            ..Default::default()
        };
        let body = encode_request(
            vec![string_attr("service.name", "x")],
            InstrumentationScope {
                name: "sie".into(),
                version: "1".into(),
            },
            vec![span.clone()],
        );
        let back = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(back.resource_spans[0].scope_spans[0].spans, vec![span]);
        // The empty status is still written (a present message): tag 15, length 0.
        assert!(body.windows(2).any(|w| w == [0x7a, 0x00]));
    }
}
