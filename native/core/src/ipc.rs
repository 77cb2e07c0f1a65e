//! IPC envelopes (wire-protocol §2) and IpcResponseChunkV1 frames (§6.2): encoding and a
//! key-order independent, zero-copy classification of response frames.

use crate::frame::{check_len, FrameTooLarge, HEADER_LEN};
use crate::msgpack::{self as mp, DecodeError, DecodeResult, Out, Reader, Token};

pub const IPC_VERSION: u64 = 1;
pub const IPC_CHUNK_KIND: &str = "ipc_response_chunk_v1";
pub const DIGEST_LEN: usize = 32;

/// Size of the request envelope (without the 4-byte prefix); `FrameTooLarge` over 32 MiB.
pub fn request_len(
    method: &str,
    request_id: &str,
    body_len: usize,
) -> Result<usize, FrameTooLarge> {
    let len = envelope_head_len(method, request_id) + body_len;
    check_len(len)?;
    Ok(len)
}

/// The envelope's bytes other than the body's value.
fn envelope_head_len(method: &str, request_id: &str) -> usize {
    1 + 8 // "version" key
        + 1
        + 7 // "method"
        + mp::str_header_len(method.len())
        + method.len()
        + 11 // "request_id"
        + mp::str_header_len(request_id.len())
        + request_id.len()
        + 31 // "accepts_ipc_response_chunks_v1"
        + 1
        + 5 // "body"
}

/// Write a whole request frame (length prefix included) with keys in spec order; `body` is an
/// already-encoded msgpack map spliced in verbatim. `envelope_len` comes from [`request_len`].
pub fn write_request(
    out: &mut impl Out,
    envelope_len: usize,
    method: &str,
    request_id: &str,
    body: &[u8],
    accepts_chunks: bool,
) {
    write_request_head(out, envelope_len, method, request_id, accepts_chunks);
    out.extend_from_slice(body);
}

/// How many bytes of a request frame come before its body: the length prefix and every envelope
/// field but the body's value (what [`write_request_head`] writes).
pub fn request_head_len(method: &str, request_id: &str) -> usize {
    HEADER_LEN + envelope_head_len(method, request_id)
}

/// A request frame up to its body, which the caller places right after it: the frame of a body
/// that was written with room in front of it is its own memory (no copy of the body).
pub fn write_request_head(
    out: &mut impl Out,
    envelope_len: usize,
    method: &str,
    request_id: &str,
    accepts_chunks: bool,
) {
    out.extend_from_slice(&(envelope_len as u32).to_be_bytes());
    mp::write_map_header(out, 5);
    mp::write_str(out, "version");
    mp::write_uint(out, IPC_VERSION);
    mp::write_str(out, "method");
    mp::write_str(out, method);
    mp::write_str(out, "request_id");
    mp::write_str(out, request_id);
    mp::write_str(out, "accepts_ipc_response_chunks_v1");
    mp::write_bool(out, accepts_chunks);
    mp::write_str(out, "body");
}

/// [`write_request`] into a new `Vec`.
pub fn encode_request(
    method: &str,
    request_id: &str,
    body: &[u8],
    accepts_chunks: bool,
) -> Result<Vec<u8>, FrameTooLarge> {
    let envelope_len = request_len(method, request_id, body.len())?;
    let mut out = Vec::with_capacity(HEADER_LEN + envelope_len);
    write_request(
        &mut out,
        envelope_len,
        method,
        request_id,
        body,
        accepts_chunks,
    );
    debug_assert_eq!(out.len(), HEADER_LEN + envelope_len);
    Ok(out)
}

/// A decoded ordinary response envelope. `body` is the byte range of the body map in the frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<'a> {
    pub version: u64,
    pub request_id: &'a str,
    pub ok: bool,
    pub body: Option<(usize, usize)>,
    pub error: Option<&'a str>,
}

/// A decoded IpcResponseChunkV1 frame; `payload` is a byte range of the frame.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkFrame<'a> {
    pub version: u64,
    pub request_id: &'a str,
    pub transfer_digest: &'a [u8],
    pub chunk_index: u64,
    pub chunk_count: u64,
    pub total_bytes: u64,
    pub payload: (usize, usize),
    pub frame_len: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Response<'a> {
    Envelope(Envelope<'a>),
    Chunk(ChunkFrame<'a>),
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseError {
    /// Not msgpack, not a map, a wrong field type or a missing envelope key.
    Decode(DecodeError),
    /// The frame says it is a v1 chunk but is not a well-formed one.
    Chunk(String),
}

impl From<DecodeError> for ResponseError {
    fn from(e: DecodeError) -> Self {
        ResponseError::Decode(e)
    }
}

#[derive(Default)]
struct Slots {
    version: Option<usize>,
    request_id: Option<usize>,
    ok: Option<usize>,
    body: Option<usize>,
    error: Option<usize>,
    kind: Option<usize>,
    transfer_digest: Option<usize>,
    chunk_index: Option<usize>,
    chunk_count: Option<usize>,
    total_bytes: Option<usize>,
    payload: Option<usize>,
}

/// Decode a response frame body: a chunk iff its `kind` is exactly the v1 discriminator.
pub fn decode_response(frame: &[u8]) -> Result<Response<'_>, ResponseError> {
    let mut r = Reader::new(frame);
    let n = r.read_map_len("IPC response")?;
    let mut slots = Slots::default();
    for _ in 0..n {
        let key = r.read_key()?;
        let at = r.position();
        let slot = match key {
            b"version" => &mut slots.version,
            b"request_id" => &mut slots.request_id,
            b"ok" => &mut slots.ok,
            b"body" => &mut slots.body,
            b"error" => &mut slots.error,
            b"kind" => &mut slots.kind,
            b"transfer_digest" => &mut slots.transfer_digest,
            b"chunk_index" => &mut slots.chunk_index,
            b"chunk_count" => &mut slots.chunk_count,
            b"total_bytes" => &mut slots.total_bytes,
            b"payload" => &mut slots.payload,
            _ => {
                r.skip_value()?;
                continue;
            }
        };
        *slot = Some(at);
        r.skip_value()?;
    }
    r.finish()?;

    let is_chunk = match slots.kind {
        Some(at) => {
            matches!(Reader::new(&frame[at..]).next_token()?, Token::Str(s) if s == IPC_CHUNK_KIND.as_bytes())
        }
        None => false,
    };
    if is_chunk {
        decode_chunk(frame, &slots).map(Response::Chunk)
    } else {
        decode_envelope(frame, &slots).map(Response::Envelope)
    }
}

fn at<'a>(frame: &'a [u8], slot: Option<usize>, field: &str) -> DecodeResult<Reader<'a>> {
    match slot {
        Some(pos) => {
            let mut r = Reader::new(frame);
            // Positions come from our own scan, so they are in range.
            r.skip_to(pos);
            Ok(r)
        }
        None => Err(DecodeError::new(
            0,
            format!("IPC response is missing `{field}`"),
        )),
    }
}

fn decode_envelope<'a>(frame: &'a [u8], slots: &Slots) -> Result<Envelope<'a>, ResponseError> {
    let version = at(frame, slots.version, "version")?.read_uint("version")?;
    let request_id = at(frame, slots.request_id, "request_id")?.read_str("request_id")?;
    let ok = at(frame, slots.ok, "ok")?.read_bool("ok")?;
    let body = match slots.body {
        None => None,
        Some(pos) => {
            let mut r = at(frame, Some(pos), "body")?;
            if r.peek_nil() {
                None
            } else {
                let start = r.position();
                r.read_map_len("body")?;
                let mut r = at(frame, Some(pos), "body")?;
                let span = r.skip_value()?;
                Some((start, start + span.len()))
            }
        }
    };
    let error = match slots.error {
        None => None,
        Some(pos) => at(frame, Some(pos), "error")?.read_opt_str("error")?,
    };
    Ok(Envelope {
        version,
        request_id,
        ok,
        body,
        error,
    })
}

/// Read one chunk field at its recorded position; any failure is a malformed chunk.
fn chunk_field<'a, T>(
    frame: &'a [u8],
    slot: Option<usize>,
    field: &str,
    read: impl FnOnce(&mut Reader<'a>, &str) -> DecodeResult<T>,
) -> Result<T, ResponseError> {
    at(frame, slot, field)
        .and_then(|mut r| read(&mut r, field))
        .map_err(|e| ResponseError::Chunk(format!("malformed response chunk: {}", e.message)))
}

fn decode_chunk<'a>(frame: &'a [u8], slots: &Slots) -> Result<ChunkFrame<'a>, ResponseError> {
    let version = chunk_field(frame, slots.version, "version", Reader::read_uint)?;
    let request_id = chunk_field(frame, slots.request_id, "request_id", Reader::read_str)?;
    let transfer_digest = chunk_field(
        frame,
        slots.transfer_digest,
        "transfer_digest",
        Reader::read_bin,
    )?;
    if transfer_digest.len() != DIGEST_LEN {
        return Err(ResponseError::Chunk(format!(
            "malformed response chunk: transfer_digest is {} bytes, not 32",
            transfer_digest.len()
        )));
    }
    let chunk_index = chunk_field(frame, slots.chunk_index, "chunk_index", Reader::read_uint)?;
    let chunk_count = chunk_field(frame, slots.chunk_count, "chunk_count", Reader::read_uint)?;
    let total_bytes = chunk_field(frame, slots.total_bytes, "total_bytes", Reader::read_uint)?;
    // The payload's span in the frame: its bin value ends where the reader stops.
    let (payload, end) = chunk_field(frame, slots.payload, "payload", |r, f| {
        let bytes = r.read_bin(f)?;
        Ok((bytes, r.position()))
    })?;
    Ok(ChunkFrame {
        version,
        request_id,
        transfer_digest,
        chunk_index,
        chunk_count,
        total_bytes,
        payload: (end - payload.len(), end),
        frame_len: frame.len(),
    })
}

/// Write an IpcResponseChunkV1 frame body (the backend side). Keys in spec order, `kind` last.
pub fn write_chunk_frame(
    out: &mut impl Out,
    request_id: &str,
    transfer_digest: &[u8],
    chunk_index: u64,
    chunk_count: u64,
    total_bytes: u64,
    payload: &[u8],
) {
    mp::write_map_header(out, 8);
    mp::write_str(out, "version");
    mp::write_uint(out, IPC_VERSION);
    mp::write_str(out, "request_id");
    mp::write_str(out, request_id);
    mp::write_str(out, "transfer_digest");
    mp::write_bin(out, transfer_digest);
    mp::write_str(out, "chunk_index");
    mp::write_uint(out, chunk_index);
    mp::write_str(out, "chunk_count");
    mp::write_uint(out, chunk_count);
    mp::write_str(out, "total_bytes");
    mp::write_uint(out, total_bytes);
    mp::write_str(out, "payload");
    mp::write_bin(out, payload);
    mp::write_str(out, "kind");
    mp::write_str(out, IPC_CHUNK_KIND);
}

/// [`write_chunk_frame`] into a new `Vec`.
pub fn encode_chunk_frame(
    request_id: &str,
    transfer_digest: &[u8],
    chunk_index: u64,
    chunk_count: u64,
    total_bytes: u64,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 160 + request_id.len());
    write_chunk_frame(
        &mut out,
        request_id,
        transfer_digest,
        chunk_index,
        chunk_count,
        total_bytes,
        payload,
    );
    out
}

/// How a backend must send a serialized response (wire-protocol §6.1, §6.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponsePlan {
    /// One legacy frame, byte-for-byte the serialized response.
    Legacy,
    /// `count` chunk frames of fixed `slice` bytes (the last one shorter).
    Chunked { count: u64, slice: u64 },
}

/// Decide how to send `total` bytes; `Err` carries the backend's error string.
pub fn plan_response(
    total: u64,
    accepts_chunks: bool,
    legacy_ceiling: u64,
    max_chunk_payload: u64,
    max_total: u64,
    max_chunks: u64,
) -> Result<ResponsePlan, &'static str> {
    if total <= legacy_ceiling {
        return Ok(ResponsePlan::Legacy);
    }
    if !accepts_chunks {
        return Err(
            "IPC response exceeds the legacy frame limit; response chunking v1 was not negotiated",
        );
    }
    let count = total.div_ceil(max_chunk_payload.max(1));
    if total > max_total || count > max_chunks {
        return Err("IPC response exceeds the negotiated response chunking v1 bounds");
    }
    Ok(ResponsePlan::Chunked {
        count,
        slice: max_chunk_payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::unhex;

    #[test]
    fn tv_i3_first_ping_request() {
        let mut body = Vec::new();
        mp::write_map_header(&mut body, 1);
        mp::write_str(&mut body, "timestamp_ms");
        mp::write_f64(&mut body, 42.0);
        let frame = encode_request("Ping", "w-1", &body, true).unwrap();
        assert_eq!(frame, unhex("0000006185a776657273696f6e01a66d6574686f64a450696e67aa726571756573745f6964a3772d31be616363657074735f6970635f726573706f6e73655f6368756e6b735f7631c3a4626f647981ac74696d657374616d705f6d73cb4045000000000000"));
    }

    #[test]
    fn tv_i1_envelope_with_body_span() {
        let body = unhex("85a776657273696f6e01aa726571756573745f6964a7722d736d616c6ca26f6bc3a4626f647981a576616c756593010203a56572726f72c0");
        match decode_response(&body).unwrap() {
            Response::Envelope(e) => {
                assert_eq!(e.version, 1);
                assert_eq!(e.request_id, "r-small");
                assert!(e.ok);
                let (a, b) = e.body.unwrap();
                assert_eq!(&body[a..b], &unhex("81a576616c756593010203")[..]);
                assert_eq!(e.error, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tv_i6_chunk_frame_round_trip() {
        let digest = unhex("c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225");
        let frame = encode_chunk_frame("r1", &digest, 0, 2, 28, b"an exact s");
        assert_eq!(frame, unhex("88a776657273696f6e01aa726571756573745f6964a27231af7472616e736665725f646967657374c420c1c1e9aadc00fa81aa8c14f75ad9d5f25e50fb30291dfd0d44966c10a3c2e225ab6368756e6b5f696e64657800ab6368756e6b5f636f756e7402ab746f74616c5f62797465731ca77061796c6f6164c40a616e2065786163742073a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631"));
        match decode_response(&frame).unwrap() {
            Response::Chunk(c) => {
                assert_eq!(c.chunk_count, 2);
                assert_eq!(&frame[c.payload.0..c.payload.1], b"an exact s");
                assert_eq!(c.transfer_digest, &digest[..]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_head_is_the_frame_up_to_its_body() {
        let body = unhex("81a576616c756593010203");
        for (method, rid) in [
            ("RunBatch", "w-1"),
            ("Ping", ""),
            ("M", &"r".repeat(300)[..]),
        ] {
            for accepts in [true, false] {
                let whole = encode_request(method, rid, &body, accepts).unwrap();
                let head_len = request_head_len(method, rid);
                let envelope_len = request_len(method, rid, body.len()).unwrap();
                let mut head = Vec::new();
                write_request_head(&mut head, envelope_len, method, rid, accepts);
                assert_eq!(head.len(), head_len);
                assert_eq!(&whole[..head_len], &head[..]);
                assert_eq!(&whole[head_len..], &body[..]);
            }
        }
    }

    #[test]
    fn tv_i9_kind_decides() {
        let chunky = unhex("86a776657273696f6e01aa726571756573745f6964a7722d6368756e6ba26f6bc3a4626f647981a576616c756501a56572726f72c0a46b696e64b56970635f726573706f6e73655f6368756e6b5f7631");
        assert!(matches!(
            decode_response(&chunky),
            Err(ResponseError::Chunk(_))
        ));
        let mut future = chunky.clone();
        let at = future.len() - 21;
        future.truncate(at - 1);
        mp::write_str(&mut future, "future_response_v2");
        assert!(matches!(
            decode_response(&future),
            Ok(Response::Envelope(_))
        ));
    }

    #[test]
    fn non_map_and_trailing_bytes_are_decode_errors() {
        assert!(matches!(
            decode_response(&[0x91, 0x01]),
            Err(ResponseError::Decode(_))
        ));
        assert!(matches!(
            decode_response(&[0x80, 0x00]),
            Err(ResponseError::Decode(_))
        ));
        assert!(matches!(
            decode_response(&[]),
            Err(ResponseError::Decode(_))
        ));
        assert!(matches!(
            decode_response(&[0xff, 0xff, 0xff]),
            Err(ResponseError::Decode(_))
        ));
    }
}
