//! IpcResponseChunkV1 reassembly (wire-protocol §6.5) under one process-wide memory budget.
//!
//! The digest is computed by the caller's [`Sha256Sink`] (Python's hashlib in production), so this
//! crate stays free of a second SHA-256 implementation.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::ipc::{ChunkFrame, DIGEST_LEN, IPC_VERSION};

pub const MIB: u64 = 1024 * 1024;
pub const RESERVATION_OVERHEAD: u64 = 4096;
pub const DEFAULT_BUDGET: u64 = 2 * 128 * MIB + RESERVATION_OVERHEAD;

/// The pinned v1 limits; tests may relax them (TV-I6/TV-I7 only work under relaxed limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLimits {
    pub legacy_ceiling: u64,
    pub max_chunk_payload: u64,
    pub max_chunk_frame: u64,
    pub max_total: u64,
    pub max_chunks: u64,
}

impl ChunkLimits {
    pub const PRODUCTION: ChunkLimits = ChunkLimits {
        legacy_ceiling: 32 * MIB,
        max_chunk_payload: 4 * MIB,
        max_chunk_frame: 4 * MIB + 4096,
        max_total: 128 * MIB,
        max_chunks: 64,
    };
}

/// Why a transfer failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkError {
    Protocol(String),
    Budget {
        requested: u64,
        reserved: u64,
        capacity: u64,
    },
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkError::Protocol(m) => f.write_str(m),
            ChunkError::Budget {
                requested,
                reserved,
                capacity,
            } => write!(
                f,
                "response reassembly budget exceeded: {requested} bytes requested, {reserved} of {capacity} reserved"
            ),
        }
    }
}

impl std::error::Error for ChunkError {}

fn protocol(message: impl Into<String>) -> ChunkError {
    ChunkError::Protocol(message.into())
}

/// Process-wide reservation budget with outcome counters. Lock-free; shared by every connection.
#[derive(Debug)]
pub struct Budget {
    capacity: u64,
    reserved: AtomicU64,
    /// One spare reassembly buffer, already faulted in: a fresh 128 MiB allocation costs as much
    /// as hashing it (the kernel zeroes and maps every page), so repeated large responses reuse
    /// it. At most one buffer of at most the largest transfer seen is kept.
    spare: Mutex<Option<Vec<u8>>>,
    pub completed: AtomicU64,
    pub protocol_error: AtomicU64,
    pub budget_rejected: AtomicU64,
}

impl Budget {
    pub fn new(capacity: u64) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            reserved: AtomicU64::new(0),
            spare: Mutex::new(None),
            completed: AtomicU64::new(0),
            protocol_error: AtomicU64::new(0),
            budget_rejected: AtomicU64::new(0),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// An empty buffer with room for `len` bytes: the spare one when it is big enough.
    pub fn take_buffer(&self, len: usize) -> Vec<u8> {
        let spare = self.spare.lock().ok().and_then(|mut s| s.take());
        match spare {
            Some(mut buf) if buf.capacity() >= len => {
                buf.clear();
                buf
            }
            other => {
                drop(other);
                Vec::with_capacity(len)
            }
        }
    }

    /// Keep `buf` as the spare if it is larger than the current one.
    pub fn give_back(&self, buf: Vec<u8>) {
        if let Ok(mut spare) = self.spare.lock() {
            if spare.as_ref().is_none_or(|s| s.capacity() < buf.capacity()) {
                *spare = Some(buf);
            }
        }
    }

    /// Capacity of the retained spare buffer (for telemetry and tests).
    pub fn spare_capacity(&self) -> usize {
        self.spare
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(Vec::capacity))
            .unwrap_or(0)
    }

    fn try_reserve(self: &Arc<Self>, amount: u64) -> Result<Reservation, ChunkError> {
        let mut current = self.reserved.load(Ordering::Acquire);
        loop {
            let next = current.saturating_add(amount);
            if next > self.capacity {
                self.budget_rejected.fetch_add(1, Ordering::Relaxed);
                return Err(ChunkError::Budget {
                    requested: amount,
                    reserved: current,
                    capacity: self.capacity,
                });
            }
            match self.reserved.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Reservation {
                        budget: Arc::clone(self),
                        amount,
                    })
                }
                Err(actual) => current = actual,
            }
        }
    }
}

/// Bytes held against a [`Budget`]; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    amount: u64,
}

impl Reservation {
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The budget these bytes are held against (where reassembly buffers are recycled).
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Give the bytes back, counting the transfer as a protocol error (its bytes did not decode).
    pub fn fail(self) {
        self.budget.protocol_error.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .reserved
            .fetch_sub(self.amount, Ordering::AcqRel);
    }
}

/// Incremental SHA-256 supplied by the caller.
pub trait Sha256Sink {
    fn update(&mut self, data: &[u8]) -> Result<(), String>;
    fn finalize(&mut self) -> Result<[u8; DIGEST_LEN], String>;
}

/// A verified response: its bytes and the reservation that must be held until it is decoded.
#[derive(Debug)]
pub struct Assembled {
    pub bytes: Vec<u8>,
    pub reservation: Reservation,
}

struct Transfer<H> {
    digest: [u8; DIGEST_LEN],
    count: u64,
    total: u64,
    next_index: u64,
    buf: Vec<u8>,
    hasher: H,
    reservation: Reservation,
}

/// Payloads at least this large are copied on a scoped thread while the caller's thread hashes
/// them: hashlib releases the GIL, so the copy (and its page faults) hides behind the hash.
pub const PARALLEL_COPY_MIN: usize = 1 << 20;

/// Append `payload` to `buf` and feed it to `hasher`, overlapping the two for large payloads.
fn copy_and_hash<H: Sha256Sink>(
    buf: &mut Vec<u8>,
    hasher: &mut H,
    payload: &[u8],
) -> Result<(), String> {
    if payload.len() < PARALLEL_COPY_MIN {
        buf.extend_from_slice(payload);
        return hasher.update(payload);
    }
    let copied = std::thread::scope(|scope| -> Result<bool, String> {
        let copier = std::thread::Builder::new()
            .name("sie-chunk-copy".into())
            .spawn_scoped(scope, || buf.extend_from_slice(payload));
        match copier {
            Ok(handle) => {
                let hashed = hasher.update(payload);
                handle
                    .join()
                    .map_err(|_| "chunk copy thread panicked".to_owned())?;
                hashed.map(|()| true)
            }
            // No thread to be had (resource limits): hash here, copy below.
            Err(_) => hasher.update(payload).map(|()| false),
        }
    })?;
    if !copied {
        buf.extend_from_slice(payload);
    }
    Ok(())
}

/// Reassembles one chunked response (one RPC) on the pool transport.
pub struct Assembler<H: Sha256Sink> {
    request_id: String,
    budget: Arc<Budget>,
    limits: ChunkLimits,
    transfer: Option<Transfer<H>>,
    dead: bool,
}

impl<H: Sha256Sink> Assembler<H> {
    pub fn new(request_id: String, budget: Arc<Budget>, limits: ChunkLimits) -> Self {
        Self {
            request_id,
            budget,
            limits,
            transfer: None,
            dead: false,
        }
    }

    pub fn in_progress(&self) -> bool {
        self.transfer.is_some()
    }

    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Drop any partial transfer and its reservation.
    pub fn abort(&mut self) {
        self.recycle();
    }

    fn recycle(&mut self) {
        if let Some(t) = self.transfer.take() {
            self.budget.give_back(t.buf);
        }
    }

    /// An ordinary envelope arrived: legal only when no transfer is under way.
    pub fn accept_envelope(&mut self) -> Result<(), ChunkError> {
        if self.dead {
            return Err(protocol("response chunk assembler already failed"));
        }
        if self.transfer.is_some() {
            return Err(self.fail(protocol(
                "non-chunk frame arrived in the middle of a chunked response",
            )));
        }
        Ok(())
    }

    fn fail(&mut self, err: ChunkError) -> ChunkError {
        self.recycle();
        self.dead = true;
        if matches!(err, ChunkError::Protocol(_)) {
            self.budget.protocol_error.fetch_add(1, Ordering::Relaxed);
        }
        err
    }

    /// Feed one decoded chunk frame whose payload is `payload`. `new_hasher` is called once, on
    /// frame 0. Returns the whole response after the last frame verified.
    pub fn feed(
        &mut self,
        chunk: &ChunkFrame<'_>,
        payload: &[u8],
        new_hasher: impl FnOnce() -> Result<H, String>,
    ) -> Result<Option<Assembled>, ChunkError> {
        if self.dead {
            return Err(protocol("response chunk assembler already failed"));
        }
        match self.step(chunk, payload, new_hasher) {
            Ok(done) => Ok(done),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn check_bounds(&self, c: &ChunkFrame<'_>, payload: &[u8]) -> Result<(), ChunkError> {
        let l = &self.limits;
        if c.frame_len as u64 > l.max_chunk_frame {
            return Err(protocol(format!(
                "response chunk frame of {} bytes exceeds {}",
                c.frame_len, l.max_chunk_frame
            )));
        }
        if c.version != IPC_VERSION {
            return Err(protocol(format!(
                "response chunk version {} is not 1",
                c.version
            )));
        }
        if c.request_id != self.request_id {
            return Err(protocol(format!(
                "response chunk for request {:?} while waiting for {:?}",
                c.request_id, self.request_id
            )));
        }
        if c.chunk_count == 0 || c.chunk_count > l.max_chunks {
            return Err(protocol(format!(
                "response chunk count {} outside 1..={}",
                c.chunk_count, l.max_chunks
            )));
        }
        if c.chunk_count > c.total_bytes {
            return Err(protocol("response chunk count exceeds total bytes"));
        }
        if c.total_bytes <= l.legacy_ceiling {
            return Err(protocol(format!(
                "chunked response of {} bytes is not above the {} byte legacy ceiling",
                c.total_bytes, l.legacy_ceiling
            )));
        }
        if c.total_bytes > l.max_total {
            return Err(protocol(format!(
                "chunked response of {} bytes exceeds {}",
                c.total_bytes, l.max_total
            )));
        }
        let len = payload.len() as u64;
        if len == 0 || len > l.max_chunk_payload {
            return Err(protocol(format!(
                "response chunk payload of {len} bytes outside 1..={}",
                l.max_chunk_payload
            )));
        }
        if len > c.total_bytes {
            return Err(protocol("response chunk payload exceeds total bytes"));
        }
        if c.transfer_digest.len() != DIGEST_LEN {
            return Err(protocol(format!(
                "transfer digest is {} bytes, not 32",
                c.transfer_digest.len()
            )));
        }
        if c.chunk_index >= c.chunk_count {
            return Err(protocol(format!(
                "response chunk index {} out of range for count {}",
                c.chunk_index, c.chunk_count
            )));
        }
        Ok(())
    }

    fn step(
        &mut self,
        c: &ChunkFrame<'_>,
        payload: &[u8],
        new_hasher: impl FnOnce() -> Result<H, String>,
    ) -> Result<Option<Assembled>, ChunkError> {
        self.check_bounds(c, payload)?;
        if self.transfer.is_none() {
            if c.chunk_index != 0 {
                return Err(protocol(format!(
                    "chunked response must start at index 0, got {}",
                    c.chunk_index
                )));
            }
            let reservation = self
                .budget
                .try_reserve(2 * c.total_bytes + RESERVATION_OVERHEAD)?;
            let mut digest = [0u8; DIGEST_LEN];
            digest.copy_from_slice(c.transfer_digest);
            self.transfer = Some(Transfer {
                digest,
                count: c.chunk_count,
                total: c.total_bytes,
                next_index: 0,
                buf: self.budget.take_buffer(c.total_bytes as usize),
                hasher: new_hasher().map_err(protocol)?,
                reservation,
            });
        }
        let t = self
            .transfer
            .as_mut()
            .ok_or_else(|| protocol("no transfer"))?;
        if c.chunk_index != t.next_index {
            return Err(protocol(format!(
                "response chunk out of order: expected index {}, got {}",
                t.next_index, c.chunk_index
            )));
        }
        if c.chunk_count != t.count || c.total_bytes != t.total || c.transfer_digest != t.digest {
            return Err(protocol("response chunk layout changed mid-transfer"));
        }
        let accumulated = t.buf.len() as u64 + payload.len() as u64;
        let last = c.chunk_index + 1 == t.count;
        if accumulated > t.total {
            return Err(protocol("response chunks exceed total bytes"));
        }
        if !last && accumulated == t.total {
            return Err(protocol(
                "response chunks reached total bytes before the last index",
            ));
        }
        if last && accumulated != t.total {
            return Err(protocol(format!(
                "response chunks hold {accumulated} bytes, expected {}",
                t.total
            )));
        }
        copy_and_hash(&mut t.buf, &mut t.hasher, payload).map_err(protocol)?;
        t.next_index += 1;
        if !last {
            return Ok(None);
        }
        let mut t = self
            .transfer
            .take()
            .ok_or_else(|| protocol("no transfer"))?;
        let digest = t.hasher.finalize().map_err(protocol)?;
        if digest != t.digest {
            self.budget.give_back(t.buf);
            return Err(protocol("response transfer digest mismatch"));
        }
        self.budget.completed.fetch_add(1, Ordering::Relaxed);
        // Back to idle: the assembler can take the next transfer of a reused request id.
        Ok(Some(Assembled {
            bytes: t.buf,
            reservation: t.reservation,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    struct TestSha(Sha256);
    impl Sha256Sink for TestSha {
        fn update(&mut self, data: &[u8]) -> Result<(), String> {
            self.0.update(data);
            Ok(())
        }
        fn finalize(&mut self) -> Result<[u8; DIGEST_LEN], String> {
            Ok(self.0.clone().finalize().into())
        }
    }

    const RELAXED: ChunkLimits = ChunkLimits {
        legacy_ceiling: 4,
        max_chunk_payload: 8,
        max_chunk_frame: 4096,
        max_total: 64,
        max_chunks: 64,
    };

    fn chunk<'a>(
        digest: &'a [u8],
        index: u64,
        count: u64,
        total: u64,
        payload: &[u8],
    ) -> ChunkFrame<'a> {
        ChunkFrame {
            version: 1,
            request_id: "r1",
            transfer_digest: digest,
            chunk_index: index,
            chunk_count: count,
            total_bytes: total,
            payload: (0, payload.len()),
            frame_len: 100,
        }
    }

    fn sha() -> Result<TestSha, String> {
        Ok(TestSha(Sha256::new()))
    }

    #[test]
    fn two_chunks_reassemble_and_hold_the_reservation() {
        let data = b"0123456789";
        let digest: [u8; 32] = Sha256::digest(data).into();
        let budget = Budget::new(DEFAULT_BUDGET);
        let mut a = Assembler::new("r1".into(), Arc::clone(&budget), RELAXED);
        assert!(a
            .feed(&chunk(&digest, 0, 2, 10, &data[..5]), &data[..5], sha)
            .unwrap()
            .is_none());
        assert_eq!(budget.reserved(), 2 * 10 + 4096);
        let done = a
            .feed(&chunk(&digest, 1, 2, 10, &data[5..]), &data[5..], sha)
            .unwrap()
            .unwrap();
        assert_eq!(done.bytes, data);
        assert_eq!(budget.reserved(), 2 * 10 + 4096);
        drop(done);
        assert_eq!(budget.reserved(), 0);
        assert_eq!(budget.completed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn duplicate_index_fails_and_releases() {
        let data = b"0123456789";
        let digest: [u8; 32] = Sha256::digest(data).into();
        let budget = Budget::new(DEFAULT_BUDGET);
        let mut a = Assembler::new("r1".into(), Arc::clone(&budget), RELAXED);
        a.feed(&chunk(&digest, 0, 2, 10, &data[..5]), &data[..5], sha)
            .unwrap();
        assert!(a
            .feed(&chunk(&digest, 0, 2, 10, &data[..5]), &data[..5], sha)
            .is_err());
        assert_eq!(budget.reserved(), 0);
        assert_eq!(budget.protocol_error.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn spare_buffer_is_reused_only_when_big_enough() {
        let budget = Budget::new(DEFAULT_BUDGET);
        let mut big = budget.take_buffer(1000);
        big.extend_from_slice(&[1; 1000]);
        budget.give_back(big);
        assert!(budget.spare_capacity() >= 1000);
        let reused = budget.take_buffer(500);
        assert!(reused.is_empty() && reused.capacity() >= 1000);
        assert_eq!(budget.spare_capacity(), 0);
        budget.give_back(reused);
        budget.give_back(Vec::with_capacity(10)); // a smaller one never replaces the spare
        assert!(budget.spare_capacity() >= 1000);
        let fresh = budget.take_buffer(5000); // too small a spare: a new buffer, spare dropped
        assert!(fresh.capacity() >= 5000);
        assert_eq!(budget.spare_capacity(), 0);
    }

    #[test]
    fn bad_digest_fails() {
        let zero = [0u8; 32];
        let budget = Budget::new(DEFAULT_BUDGET);
        let mut a = Assembler::new("r1".into(), Arc::clone(&budget), RELAXED);
        assert!(a
            .feed(&chunk(&zero, 0, 1, 10, b"0123456789"), b"0123456789", sha)
            .is_err());
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn budget_for_one_refuses_the_second() {
        let data = b"0123456789";
        let digest: [u8; 32] = Sha256::digest(data).into();
        let budget = Budget::new(2 * 10 + 4096);
        let mut a = Assembler::new("r1".into(), Arc::clone(&budget), RELAXED);
        let mut b = Assembler::new("r1".into(), Arc::clone(&budget), RELAXED);
        a.feed(&chunk(&digest, 0, 2, 10, &data[..5]), &data[..5], sha)
            .unwrap();
        assert!(matches!(
            b.feed(&chunk(&digest, 0, 2, 10, &data[..5]), &data[..5], sha),
            Err(ChunkError::Budget { .. })
        ));
        assert_eq!(budget.budget_rejected.load(Ordering::Relaxed), 1);
        a.abort();
        let mut c = Assembler::new("r1".into(), Arc::clone(&budget), RELAXED);
        assert!(c
            .feed(&chunk(&digest, 0, 2, 10, &data[..5]), &data[..5], sha)
            .is_ok());
    }

    #[test]
    fn production_bounds_are_checked_before_reserving() {
        let zero = [0u8; 32];
        let budget = Budget::new(DEFAULT_BUDGET);
        let p = ChunkLimits::PRODUCTION;
        for (count, total, len) in [
            (1u64, 32 * MIB, 1usize),               // at the legacy ceiling
            (9, 128 * MIB + 1, 1),                  // over the total
            (65, 64 * MIB, 1),                      // over the count
            (9, 32 * MIB + 1, 4 * 1024 * 1024 + 1), // payload too large
        ] {
            let payload = vec![0u8; len];
            let mut a = Assembler::new("r1".into(), Arc::clone(&budget), p);
            assert!(a
                .feed(&chunk(&zero, 0, count, total, &payload), &payload, sha)
                .is_err());
            assert_eq!(budget.reserved(), 0);
        }
    }
}
