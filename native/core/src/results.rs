//! WorkResult encoding (wire-protocol §8.1) and ResultChunkV1 planning, encoding and
//! reassembly (§9).

use std::collections::HashMap;

use crate::chunks::Sha256Sink;
use crate::ipc::DIGEST_LEN;
use crate::msgpack::{self as mp, DecodeError, Out, Reader};

pub const RESULT_CHUNK_KIND: &str = "result_chunk_v1";
pub const RESULT_CHUNK_TARGET: u64 = 768 * 1024;
pub const MAX_CHUNKED_RESULT: u64 = 16 * 1024 * 1024;
pub const MAX_RESULT_CHUNKS: u64 = 64;
/// UnitCounts' named keys: the five v0.7.1 writes (always, nil for an absent count), then the ones
/// newer than v0.7.1 (`content_input_tokens`, the sidecar-side `output_tokens`), written only when
/// present (wire-protocol §4.6).
pub const UNIT_KEYS: [&str; 7] = [
    "input_tokens",
    "pages",
    "images",
    "audio_ms",
    "pairs",
    "content_input_tokens",
    "output_tokens",
];
/// How many of `UNIT_KEYS` v0.7.1 knows (and a positional UnitCounts array can carry).
pub const LEGACY_UNIT_KEYS: usize = 5;
/// A UnitCounts value: one optional count per `UNIT_KEYS` entry.
pub type Units = [Option<u64>; 7];

/// The fields of one WorkResult, borrowed from the caller.
#[derive(Debug, Clone, Default)]
pub struct WorkResultRef<'a> {
    pub work_item_id: &'a str,
    pub request_id: &'a str,
    pub item_index: u64,
    pub success: bool,
    pub result_msgpack: &'a [u8],
    pub error: Option<&'a str>,
    pub error_code: Option<&'a str>,
    pub inference_ms: Option<f64>,
    pub queue_ms: Option<f64>,
    pub processing_ms: Option<f64>,
    pub worker_id: Option<&'a str>,
    pub tokenization_ms: Option<f64>,
    pub postprocessing_ms: Option<f64>,
    pub payload_fetch_ms: Option<f64>,
    pub units: Option<Units>,
    pub worker_direct: bool,
    pub executed_bundle_config_hash: Option<&'a str>,
    pub retry_after_s: Option<u64>,
}

/// Encode a WorkResult as the v0.7.1 sidecar does: 15 keys always, `units`,
/// `executed_bundle_config_hash` and `retry_after_s` only when present.
pub fn encode_work_result(out: &mut impl Out, r: &WorkResultRef<'_>) {
    let executed = r.executed_bundle_config_hash.filter(|h| !h.is_empty());
    let n = 15
        + usize::from(r.units.is_some())
        + usize::from(executed.is_some())
        + usize::from(r.retry_after_s.is_some());
    mp::write_map_header(out, n);
    mp::write_str(out, "work_item_id");
    mp::write_str(out, r.work_item_id);
    mp::write_str(out, "request_id");
    mp::write_str(out, r.request_id);
    mp::write_str(out, "item_index");
    mp::write_uint(out, r.item_index);
    mp::write_str(out, "success");
    mp::write_bool(out, r.success);
    mp::write_str(out, "result_msgpack");
    mp::write_bin(out, r.result_msgpack);
    mp::write_str(out, "error");
    mp::write_opt_str(out, r.error);
    mp::write_str(out, "error_code");
    mp::write_opt_str(out, r.error_code);
    mp::write_str(out, "inference_ms");
    mp::write_opt_f64(out, r.inference_ms);
    mp::write_str(out, "queue_ms");
    mp::write_opt_f64(out, r.queue_ms);
    mp::write_str(out, "processing_ms");
    mp::write_opt_f64(out, r.processing_ms);
    mp::write_str(out, "worker_id");
    mp::write_opt_str(out, r.worker_id);
    mp::write_str(out, "tokenization_ms");
    mp::write_opt_f64(out, r.tokenization_ms);
    mp::write_str(out, "postprocessing_ms");
    mp::write_opt_f64(out, r.postprocessing_ms);
    mp::write_str(out, "payload_fetch_ms");
    mp::write_opt_f64(out, r.payload_fetch_ms);
    if let Some(units) = &r.units {
        mp::write_str(out, "units");
        let newer = units[LEGACY_UNIT_KEYS..]
            .iter()
            .filter(|v| v.is_some())
            .count();
        mp::write_map_header(out, LEGACY_UNIT_KEYS + newer);
        for (i, (key, value)) in UNIT_KEYS.iter().zip(units).enumerate() {
            if i < LEGACY_UNIT_KEYS || value.is_some() {
                mp::write_str(out, key);
                mp::write_opt_uint(out, *value);
            }
        }
    }
    mp::write_str(out, "worker_direct");
    mp::write_bool(out, r.worker_direct);
    if let Some(h) = executed {
        mp::write_str(out, "executed_bundle_config_hash");
        mp::write_str(out, h);
    }
    if let Some(s) = r.retry_after_s {
        mp::write_str(out, "retry_after_s");
        mp::write_uint(out, s);
    }
}

/// Identity of a chunked transfer.
#[derive(Debug, Clone, Copy)]
pub struct ChunkIdentity<'a> {
    pub work_item_id: &'a str,
    pub request_id: &'a str,
    pub item_index: u64,
}

/// Everything of a chunk envelope before the payload's bin header.
fn write_chunk_prefix(
    out: &mut impl Out,
    id: &ChunkIdentity<'_>,
    digest: &[u8],
    chunk_index: u64,
    chunk_count: u64,
    total_bytes: u64,
) {
    mp::write_map_header(out, 9);
    mp::write_str(out, "kind");
    mp::write_str(out, RESULT_CHUNK_KIND);
    mp::write_str(out, "work_item_id");
    mp::write_str(out, id.work_item_id);
    mp::write_str(out, "request_id");
    mp::write_str(out, id.request_id);
    mp::write_str(out, "item_index");
    mp::write_uint(out, id.item_index);
    mp::write_str(out, "transfer_digest");
    mp::write_bin(out, digest);
    mp::write_str(out, "chunk_index");
    mp::write_uint(out, chunk_index);
    mp::write_str(out, "chunk_count");
    mp::write_uint(out, chunk_count);
    mp::write_str(out, "total_bytes");
    mp::write_uint(out, total_bytes);
    mp::write_str(out, "payload");
}

/// Encode one ResultChunkV1 envelope (kind first).
pub fn encode_result_chunk(
    out: &mut impl Out,
    id: &ChunkIdentity<'_>,
    digest: &[u8],
    chunk_index: u64,
    chunk_count: u64,
    total_bytes: u64,
    payload: &[u8],
) {
    write_chunk_prefix(out, id, digest, chunk_index, chunk_count, total_bytes);
    mp::write_bin(out, payload);
}

/// Exact encoded size of a chunk envelope with a payload of `payload_len` bytes.
pub fn chunk_envelope_len(
    id: &ChunkIdentity<'_>,
    chunk_index: u64,
    chunk_count: u64,
    total_bytes: u64,
    payload_len: usize,
) -> usize {
    let mut c = mp::Counter::default();
    write_chunk_prefix(
        &mut c,
        id,
        &[0u8; DIGEST_LEN],
        chunk_index,
        chunk_count,
        total_bytes,
    );
    c.0 + mp::bin_header_len(payload_len) + payload_len
}

/// Slice `i` of `n` balanced slices of `total` bytes.
pub fn chunk_range(total: u64, i: u64, n: u64) -> (usize, usize) {
    let start = (u128::from(total) * u128::from(i) / u128::from(n)) as usize;
    let end = (u128::from(total) * u128::from(i + 1) / u128::from(n)) as usize;
    (start, end)
}

/// The smallest chunk count whose largest envelope fits `max_payload`, or `None`.
pub fn plan_chunk_count(id: &ChunkIdentity<'_>, total: u64, max_payload: u64) -> Option<u64> {
    if total == 0 || total > MAX_CHUNKED_RESULT {
        return None;
    }
    let first = total.div_ceil(RESULT_CHUNK_TARGET).max(1);
    let last = MAX_RESULT_CHUNKS.min(total);
    (first..=last).find(|&n| {
        let largest = total.div_ceil(n) as usize;
        // Index and count are < 128 here, so every envelope shares one prefix length.
        chunk_envelope_len(id, n - 1, n, total, largest) as u64 <= max_payload
    })
}

/// Why a ResultChunkV1 envelope was refused by the assembler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultChunkError(pub String);

impl From<DecodeError> for ResultChunkError {
    fn from(e: DecodeError) -> Self {
        ResultChunkError(format!("malformed result chunk: {e}"))
    }
}

fn reject<T>(message: impl Into<String>) -> Result<T, ResultChunkError> {
    Err(ResultChunkError(message.into()))
}

/// A parsed ResultChunkV1 envelope.
#[derive(Debug, Clone)]
pub struct ResultChunk<'a> {
    pub work_item_id: &'a str,
    pub request_id: &'a str,
    pub item_index: u64,
    pub transfer_digest: &'a [u8],
    pub chunk_index: u64,
    pub chunk_count: u64,
    pub total_bytes: u64,
    pub payload: &'a [u8],
}

/// Parse and validate the self-contained rules of one envelope.
pub fn parse_result_chunk(
    envelope: &[u8],
    max_total: u64,
) -> Result<ResultChunk<'_>, ResultChunkError> {
    let mut r = Reader::new(envelope);
    let n = r.read_map_len("result chunk")?;
    let (mut kind, mut wid, mut rid, mut idx, mut digest) = (None, None, None, None, None);
    let (mut ci, mut cc, mut total, mut payload) = (None, None, None, None);
    for _ in 0..n {
        match r.read_key()? {
            b"kind" => kind = Some(r.read_str("kind")?),
            b"work_item_id" => wid = Some(r.read_str("work_item_id")?),
            b"request_id" => rid = Some(r.read_str("request_id")?),
            b"item_index" => idx = Some(r.read_uint("item_index")?),
            b"transfer_digest" => digest = Some(r.read_bin("transfer_digest")?),
            b"chunk_index" => ci = Some(r.read_uint("chunk_index")?),
            b"chunk_count" => cc = Some(r.read_uint("chunk_count")?),
            b"total_bytes" => total = Some(r.read_uint("total_bytes")?),
            b"payload" => payload = Some(r.read_bin("payload")?),
            _ => {
                r.skip_value()?;
            }
        }
    }
    r.finish()?;
    if kind != Some(RESULT_CHUNK_KIND) {
        return reject("not a result_chunk_v1 envelope");
    }
    let (Some(work_item_id), Some(request_id), Some(item_index), Some(transfer_digest)) =
        (wid, rid, idx, digest)
    else {
        return reject("result chunk is missing its identity or digest");
    };
    let (Some(chunk_index), Some(chunk_count), Some(total_bytes), Some(payload)) =
        (ci, cc, total, payload)
    else {
        return reject("result chunk is missing its layout or payload");
    };
    if work_item_id.is_empty() || request_id.is_empty() {
        return reject("result chunk has an empty id");
    }
    if work_item_id != format!("{request_id}.{item_index}") {
        return reject(format!(
            "result chunk work_item_id {work_item_id:?} does not match {request_id:?}.{item_index}"
        ));
    }
    if item_index > u64::from(u32::MAX) {
        return reject(format!("item index {item_index} does not fit u32"));
    }
    if transfer_digest.len() != DIGEST_LEN {
        return reject(format!(
            "transfer digest is {} bytes, not 32",
            transfer_digest.len()
        ));
    }
    if chunk_count == 0 || chunk_count > MAX_RESULT_CHUNKS {
        return reject(format!("chunk count {chunk_count} outside 1..=64"));
    }
    if chunk_index >= chunk_count {
        return reject(format!(
            "chunk index {chunk_index} out of range for count {chunk_count}"
        ));
    }
    if total_bytes == 0 || total_bytes > max_total {
        return reject(format!("total bytes {total_bytes} outside 1..={max_total}"));
    }
    if payload.len() as u64 > total_bytes {
        return reject("chunk payload longer than total bytes");
    }
    Ok(ResultChunk {
        work_item_id,
        request_id,
        item_index,
        transfer_digest,
        chunk_index,
        chunk_count,
        total_bytes,
        payload,
    })
}

/// Digests and layouts remembered per item, and completed items remembered per assembler.
pub const RETIRED_PER_ITEM: usize = 8;
pub const COMPLETED_REMEMBERED: usize = 65_536;

struct Pending {
    digest: [u8; DIGEST_LEN],
    count: u64,
    total: u64,
    parts: Vec<Option<Vec<u8>>>,
    received: u64,
    bytes: u64,
    retired_digests: std::collections::VecDeque<[u8; DIGEST_LEN]>,
    retired_layouts: std::collections::VecDeque<(u64, u64)>,
}

impl Pending {
    fn new(c: &ResultChunk<'_>) -> Self {
        let mut p = Pending {
            digest: [0; DIGEST_LEN],
            count: 0,
            total: 0,
            parts: Vec::new(),
            received: 0,
            bytes: 0,
            retired_digests: std::collections::VecDeque::new(),
            retired_layouts: std::collections::VecDeque::new(),
        };
        p.start(c);
        p
    }

    /// Begin (or restart) the transfer with this chunk's digest and layout, no parts yet.
    fn start(&mut self, c: &ResultChunk<'_>) {
        self.digest.copy_from_slice(c.transfer_digest);
        self.count = c.chunk_count;
        self.total = c.total_bytes;
        self.parts = vec![None; c.chunk_count as usize];
        self.received = 0;
        self.bytes = 0;
    }

    fn retire_digest(&mut self) {
        if self.retired_digests.len() == RETIRED_PER_ITEM {
            self.retired_digests.pop_front();
        }
        self.retired_digests.push_back(self.digest);
    }

    fn retire_layout(&mut self) {
        if self.retired_layouts.len() == RETIRED_PER_ITEM {
            self.retired_layouts.pop_front();
        }
        self.retired_layouts.push_back((self.count, self.total));
    }
}

/// Gateway-side reassembly of ResultChunkV1 transfers, keyed by work item (wire-protocol §9.4).
///
/// Out-of-order and byte-identical duplicate chunks are accepted. A redelivered item is chunked
/// again with a new digest: a chunk with a new digest replaces the active transfer only at
/// index 0 and when that digest is not retired; otherwise it is stale and ignored. The same digest
/// with another layout restarts at index 0, a retired layout is ignored, and anything else is a
/// conflict. Once an item completed, later chunks for it are ignored (the first result wins).
pub struct ResultAssembler {
    max_total: u64,
    pending: HashMap<String, Pending>,
    completed: std::collections::HashSet<String>,
    completed_order: std::collections::VecDeque<String>,
}

impl ResultAssembler {
    pub fn new(max_total: u64) -> Self {
        Self {
            max_total,
            pending: HashMap::new(),
            completed: std::collections::HashSet::new(),
            completed_order: std::collections::VecDeque::new(),
        }
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Feed one envelope; returns `(work_item_id, WorkResult bytes)` when the transfer is whole
    /// and its digest verified. Any violation drops that item's state.
    pub fn feed<H: Sha256Sink>(
        &mut self,
        envelope: &[u8],
        hasher: impl FnOnce() -> Result<H, String>,
    ) -> Result<Option<(String, Vec<u8>)>, ResultChunkError> {
        let c = parse_result_chunk(envelope, self.max_total)?;
        if self.completed.contains(c.work_item_id) {
            return Ok(None);
        }
        let key = c.work_item_id.to_owned();
        match self.accept(&c, hasher) {
            Ok(Some(done)) => {
                self.remember_completed(key);
                Ok(Some(done))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.pending.remove(&key);
                Err(e)
            }
        }
    }

    fn remember_completed(&mut self, key: String) {
        if self.completed_order.len() == COMPLETED_REMEMBERED {
            if let Some(old) = self.completed_order.pop_front() {
                self.completed.remove(&old);
            }
        }
        self.completed.insert(key.clone());
        self.completed_order.push_back(key);
    }

    fn accept<H: Sha256Sink>(
        &mut self,
        c: &ResultChunk<'_>,
        hasher: impl FnOnce() -> Result<H, String>,
    ) -> Result<Option<(String, Vec<u8>)>, ResultChunkError> {
        let p = self
            .pending
            .entry(c.work_item_id.to_owned())
            .or_insert_with(|| Pending::new(c));
        if p.digest != c.transfer_digest {
            let retired = p.retired_digests.iter().any(|d| d == c.transfer_digest);
            if c.chunk_index != 0 || retired {
                return Ok(None); // a stale chunk of an older attempt
            }
            p.retire_digest();
            p.start(c);
        } else if p.count != c.chunk_count || p.total != c.total_bytes {
            if p.retired_layouts.contains(&(c.chunk_count, c.total_bytes)) {
                return Ok(None);
            }
            if c.chunk_index != 0 {
                return reject("result chunk metadata conflicts with the transfer in progress");
            }
            p.retire_layout();
            p.start(c);
        }
        let slot = &mut p.parts[c.chunk_index as usize];
        match slot {
            Some(existing) if existing.as_slice() == c.payload => return Ok(None),
            Some(_) => return reject("a different payload for an already received chunk index"),
            None => {}
        }
        p.bytes += c.payload.len() as u64;
        if p.bytes > p.total {
            return reject("result chunks exceed total bytes");
        }
        *slot = Some(c.payload.to_vec());
        p.received += 1;
        if p.received < p.count {
            return Ok(None);
        }
        let p = self
            .pending
            .remove(c.work_item_id)
            .ok_or_else(|| ResultChunkError("transfer vanished".into()))?;
        if p.bytes != p.total {
            return reject(format!(
                "result chunks hold {} bytes, expected {}",
                p.bytes, p.total
            ));
        }
        let mut whole = Vec::with_capacity(p.total as usize);
        for part in p.parts.into_iter().flatten() {
            whole.extend_from_slice(&part);
        }
        let mut h = hasher().map_err(ResultChunkError)?;
        h.update(&whole).map_err(ResultChunkError)?;
        if h.finalize().map_err(ResultChunkError)? != p.digest {
            return reject("result transfer digest mismatch");
        }
        Ok(Some((c.work_item_id.to_owned(), whole)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::unhex;

    const ID: ChunkIdentity<'static> = ChunkIdentity {
        work_item_id: "req-1.0",
        request_id: "req-1",
        item_index: 0,
    };

    #[test]
    fn tv_r1_chunk_envelope() {
        let mut out = Vec::new();
        encode_result_chunk(&mut out, &ID, &[7u8; 32], 1, 3, 1234, &[0, 1, 2, 0xff]);
        assert_eq!(out, unhex("89a46b696e64af726573756c745f6368756e6b5f7631ac776f726b5f6974656d5f6964a77265712d312e30aa726571756573745f6964a57265712d31aa6974656d5f696e64657800af7472616e736665725f646967657374c4200707070707070707070707070707070707070707070707070707070707070707ab6368756e6b5f696e64657801ab6368756e6b5f636f756e7403ab746f74616c5f6279746573cd04d2a77061796c6f6164c404000102ff"));
        assert_eq!(chunk_envelope_len(&ID, 1, 3, 1234, 4), out.len());
    }

    #[test]
    fn tv_r3_boundaries() {
        let id = ChunkIdentity {
            work_item_id: "req.0",
            request_id: "req",
            item_index: 0,
        };
        for (n, len) in [
            (255usize, 423usize),
            (256, 426),
            (65_535, 65_705),
            (65_536, 65_710),
        ] {
            let mut out = Vec::new();
            encode_result_chunk(&mut out, &id, &[9u8; 32], 0, 1, n as u64, &vec![7u8; n]);
            assert_eq!(out.len(), len, "N={n}");
            assert_eq!(chunk_envelope_len(&id, 0, 1, n as u64, n), len);
        }
    }

    #[test]
    fn tv_r2_work_result() {
        let r = WorkResultRef {
            work_item_id: "req-1.2",
            request_id: "req-1",
            item_index: 2,
            success: true,
            result_msgpack: &unhex("81a568656c6c6f05"),
            inference_ms: Some(12.5),
            processing_ms: Some(14.0),
            worker_id: Some("w-1"),
            worker_direct: true,
            ..Default::default()
        };
        let mut out = Vec::new();
        encode_work_result(&mut out, &r);
        assert_eq!(out, unhex("8fac776f726b5f6974656d5f6964a77265712d312e32aa726571756573745f6964a57265712d31aa6974656d5f696e64657802a773756363657373c3ae726573756c745f6d73677061636bc40881a568656c6c6f05a56572726f72c0aa6572726f725f636f6465c0ac696e666572656e63655f6d73cb4029000000000000a871756575655f6d73c0ad70726f63657373696e675f6d73cb402c000000000000a9776f726b65725f6964a3772d31af746f6b656e697a6174696f6e5f6d73c0b1706f737470726f63657373696e675f6d73c0b07061796c6f61645f66657463685f6d73c0ad776f726b65725f646972656374c3"));
    }

    #[test]
    fn plan_picks_the_smallest_fitting_count() {
        let total = 2 * 1024 * 1024;
        let n = plan_chunk_count(&ID, total, 1024 * 1024).unwrap();
        assert_eq!(n, 3);
        let n = plan_chunk_count(&ID, total, 300 * 1024).unwrap();
        assert!(chunk_envelope_len(&ID, n - 1, n, total, total.div_ceil(n) as usize) <= 300 * 1024);
        assert!(
            chunk_envelope_len(&ID, n - 2, n - 1, total, total.div_ceil(n - 1) as usize)
                > 300 * 1024
        );
        assert_eq!(plan_chunk_count(&ID, total, 100), None);
        assert_eq!(
            plan_chunk_count(&ID, MAX_CHUNKED_RESULT + 1, u64::MAX),
            None
        );
    }

    #[test]
    fn balanced_ranges_cover_everything() {
        for (total, n) in [(10u64, 3u64), (786_433, 2), (64, 64)] {
            let mut next = 0;
            for i in 0..n {
                let (a, b) = chunk_range(total, i, n);
                assert_eq!(a, next);
                assert!(b > a);
                next = b;
            }
            assert_eq!(next as u64, total);
        }
    }
}
