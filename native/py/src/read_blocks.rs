//! Zero-copy IPC receive: the socket is read straight into blocks, and each complete frame body
//! is handed out as a view of the block it arrived in.
//!
//! Why: `FrameSplitter.feed` copies every body out of the connection's read buffer. A 64-item
//! RunBatch response is ~120 KB, so that was ~120 KB of copying and cache a batch, with or without
//! telemetry (docs/benchmarks.md, "Fewer copies"). Here the kernel's copy is the only one.
//!
//! A block is written only where no view can see: at and after `filled`, or anywhere once no
//! view of it is left (its `Arc` is unique). A frame still arriving when its block runs out of
//! room moves (its received part only) to a block with room, which is a spare whose views are all
//! gone when there is one. A frame larger than a block gets a block of its own, made to measure,
//! and the read after it goes to a regular block again.

use std::ptr::NonNull;
use std::sync::Arc;

use sie_core::frame::{declared_len, FrameTooLarge, HEADER_LEN};

/// Bytes a block holds; a 64-item response and the start of the next fit in one.
pub const BLOCK_SIZE: usize = 256 << 10;
/// Retired blocks kept for reuse once their views are gone (memory bound: this many blocks).
const SPARES: usize = 4;

/// A fixed allocation that a writer (the kernel through a writable buffer, or a request's envelope
/// in `request_body`) and views share, each on its own bytes: see the module docs for who may
/// write where.
pub struct Block {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: the memory is owned by the block and freed once, in `drop`; concurrent access is only
// ever to disjoint ranges (views read completed bytes; writes go past `filled`), under the GIL.
unsafe impl Send for Block {}
// SAFETY: as above: shared references only read ranges that are no longer written.
unsafe impl Sync for Block {}

impl Block {
    fn new(cap: usize) -> Self {
        // Zeroed (calloc: the kernel hands out zero pages lazily), so no byte is ever uninitialised.
        Self::from_vec(vec![0u8; cap])
    }

    /// A block of `bytes`, written before it is shared (`request_body`: a body with room for its
    /// envelope in front). The allocation is trimmed to their length, in place.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let cap = boxed.len();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).unwrap_or(NonNull::dangling());
        Self { ptr, cap }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Bytes `start..end`, which must be complete and never written again while this borrow lives.
    pub fn slice(&self, start: usize, end: usize) -> &[u8] {
        assert!(start <= end && end <= self.cap, "block range out of bounds");
        // SAFETY: in bounds (checked); the reader never writes a range it has handed out.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), end - start) }
    }

    /// Where a writer may write `start..start+len` (the reader's window).
    pub fn window_ptr(&self, start: usize, len: usize) -> *mut u8 {
        assert!(start + len <= self.cap, "block window out of bounds");
        // SAFETY: in bounds (checked).
        unsafe { self.ptr.as_ptr().add(start) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.cap);
        // SAFETY: `ptr`/`cap` came from `Box::into_raw` of a boxed slice of this length.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// What `BlockReader` refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// A declared body over the ceiling: the stream is out of step, for good.
    TooLarge(FrameTooLarge),
    /// `filled` without a window handed out before it.
    NoWindow,
    /// `filled` with more bytes than the window held.
    Overfilled { filled: usize, window: usize },
}

/// Hands out windows for socket reads and finds the frames in what was read.
pub struct BlockReader {
    max_body: usize,
    block_size: usize,
    block: Arc<Block>,
    /// Start of the first byte not yet part of a returned frame.
    parsed: usize,
    /// End of the bytes read into `block`.
    filled: usize,
    /// Length of the window last handed out, until `filled` consumes it.
    window: Option<usize>,
    spare: Vec<Arc<Block>>,
    failed: Option<FrameTooLarge>,
    stats: ReaderStats,
}

/// What a reader did, for tests and the operator's view: how often the frame in progress had to
/// move (and how many bytes that copied) and how many blocks were made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReaderStats {
    pub windows: u64,
    pub moves: u64,
    pub moved_bytes: u64,
    pub blocks_made: u64,
}

impl BlockReader {
    pub fn new(max_body: usize, block_size: usize) -> Self {
        let block_size = block_size.max(2 * HEADER_LEN);
        Self {
            max_body,
            block_size,
            block: Arc::new(Block::new(block_size)),
            parsed: 0,
            filled: 0,
            window: None,
            spare: Vec::new(),
            failed: None,
            stats: ReaderStats {
                blocks_made: 1,
                ..ReaderStats::default()
            },
        }
    }

    pub fn stats(&self) -> ReaderStats {
        self.stats
    }

    /// Bytes read but not yet part of a returned frame.
    pub fn buffered(&self) -> usize {
        self.filled - self.parsed
    }

    pub fn block(&self) -> &Arc<Block> {
        &self.block
    }

    /// The block, start and length the next read may write (never empty).
    pub fn window(&mut self) -> Result<(Arc<Block>, usize, usize), ReadError> {
        if let Some(err) = self.failed {
            return Err(ReadError::TooLarge(err));
        }
        self.make_room();
        self.stats.windows += 1;
        let len = self.block.cap - self.filled;
        debug_assert!(len > 0);
        self.window = Some(len);
        Ok((Arc::clone(&self.block), self.filled, len))
    }

    /// `n` bytes were read into the window: append the frame bodies they complete to `out`, as
    /// ranges of `block()`, in stream order.
    pub fn filled(&mut self, n: usize, out: &mut Vec<(usize, usize)>) -> Result<(), ReadError> {
        let window = self.window.take().ok_or(ReadError::NoWindow)?;
        if n > window {
            return Err(ReadError::Overfilled { filled: n, window });
        }
        self.filled += n;
        while self.filled - self.parsed >= HEADER_LEN {
            let declared = match declared_len(self.header_at(self.parsed), self.max_body) {
                Ok(len) => len,
                Err(err) => {
                    self.failed = Some(err);
                    return Err(ReadError::TooLarge(err));
                }
            };
            let start = self.parsed + HEADER_LEN;
            if self.filled - start < declared {
                break;
            }
            out.push((start, start + declared));
            self.parsed = start + declared;
        }
        Ok(())
    }

    fn header_at(&self, at: usize) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(self.block.slice(at, at + HEADER_LEN));
        header
    }

    /// Make the room the next read needs: the rest of the frame in progress, else a useful
    /// window (a quarter block).
    fn make_room(&mut self) {
        let pending = self.filled - self.parsed;
        if pending == 0 && self.block.cap != self.block_size {
            // A block made to measure for one large frame: back to a regular one, else up to
            // `max_body` would stay in use for the life of the connection.
            self.move_pending(self.block_size);
            return;
        }
        if pending == 0 && Arc::strong_count(&self.block) == 1 {
            // No view of this block is left: start again at its (warm) beginning.
            self.parsed = 0;
            self.filled = 0;
        }
        let room = self.block.cap - self.filled;
        // The header was checked against `max_body` when it was read (`filled`).
        let total = (pending >= HEADER_LEN)
            .then(|| declared_len(self.header_at(self.parsed), self.max_body).ok())
            .flatten()
            .map(|len| HEADER_LEN + len);
        let enough = match total {
            Some(total) => room >= total - pending,
            None => room >= (self.block_size / 4).max(HEADER_LEN),
        };
        if !enough {
            self.move_pending(total.unwrap_or(0).max(self.block_size));
        }
    }

    /// Move the bytes of the frame in progress to the start of a block of at least `want` bytes.
    fn move_pending(&mut self, want: usize) {
        let pending = self.filled - self.parsed;
        if pending > 0 {
            self.stats.moves += 1;
            self.stats.moved_bytes += pending as u64;
        }
        // In place only when no view is left, and into a regular block or for a frame that
        // needs a large one (a large block is not kept for regular frames).
        let fits = self.block.cap == self.block_size || want > self.block_size;
        if Arc::strong_count(&self.block) == 1 && self.block.cap >= want && fits {
            let base = self.block.ptr.as_ptr();
            // SAFETY: no view of the block exists (its Arc is unique), both ranges are in bounds,
            // and `ptr::copy` allows overlap.
            unsafe { std::ptr::copy(base.add(self.parsed), base, pending) };
        } else {
            let next = match self
                .spare
                .iter()
                .position(|b| Arc::strong_count(b) == 1 && b.cap >= want)
            {
                Some(i) => self.spare.swap_remove(i),
                None => {
                    self.stats.blocks_made += 1;
                    Arc::new(Block::new(want))
                }
            };
            // SAFETY: `next` is unique (a new block, or a spare nothing else refers to), the
            // source range is complete bytes of the current block, and the two blocks differ.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.block.ptr.as_ptr().add(self.parsed),
                    next.ptr.as_ptr(),
                    pending,
                )
            };
            let old = std::mem::replace(&mut self.block, next);
            if old.cap == self.block_size && self.spare.len() < SPARES {
                self.spare.push(old);
            }
        }
        self.parsed = 0;
        self.filled = pending;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    /// Feed `stream` in reads of at most the given sizes (cycled); keep every frame's view.
    fn read_all(
        r: &mut BlockReader,
        stream: &[u8],
        sizes: &[usize],
    ) -> Vec<(Arc<Block>, usize, usize)> {
        let mut views = Vec::new();
        let mut pos = 0;
        let mut k = 0;
        while pos < stream.len() {
            let (block, start, len) = r.window().unwrap();
            let n = sizes[k % sizes.len()]
                .min(len)
                .min(stream.len() - pos)
                .max(1);
            k += 1;
            // SAFETY: the window is writable and `n <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    stream[pos..].as_ptr(),
                    block.window_ptr(start, len),
                    n,
                )
            };
            pos += n;
            let mut out = Vec::new();
            r.filled(n, &mut out).unwrap();
            for (a, b) in out {
                views.push((Arc::clone(r.block()), a, b));
            }
        }
        views
    }

    fn bodies(n: usize, seed: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let len = (i * 7919 + seed * 104_729) % 40_000 % (1 + (i % 5) * 9_000);
                (0..len).map(|j| (j + i + seed) as u8).collect()
            })
            .collect()
    }

    #[test]
    fn every_read_pattern_gives_the_bodies_and_held_views_stay_intact() {
        for seed in 0..6 {
            let want = bodies(40, seed);
            let stream: Vec<u8> = want.iter().flat_map(|b| frame(b)).collect();
            for sizes in [
                &[1usize, 3, 7][..],
                &[4096],
                &[65_536, 100, 300_000],
                &[usize::MAX],
            ] {
                let mut r = BlockReader::new(1 << 20, 8 << 10);
                let views = read_all(&mut r, &stream, sizes);
                let got: Vec<Vec<u8>> = views
                    .iter()
                    .map(|(b, s, e)| b.slice(*s, *e).to_vec())
                    .collect();
                assert_eq!(got, want, "seed {seed} sizes {sizes:?}");
                assert_eq!(r.buffered(), 0);
            }
        }
    }

    #[test]
    fn a_block_whose_views_are_gone_is_read_into_again_from_its_start() {
        let mut r = BlockReader::new(1 << 20, 1024);
        let first = Arc::as_ptr(r.block());
        for _ in 0..10 {
            drop(read_all(&mut r, &frame(&[7u8; 600]), &[usize::MAX]));
            assert_eq!(Arc::as_ptr(r.block()), first);
            assert_eq!(r.window().unwrap().1, 0);
            r.window = None;
        }
    }

    #[test]
    fn held_views_move_reads_to_another_block_and_spares_are_bounded() {
        let mut r = BlockReader::new(1 << 20, 1024);
        let mut held = Vec::new();
        for i in 0..40u8 {
            let views = read_all(&mut r, &frame(&[i; 600]), &[usize::MAX]);
            held.extend(views);
        }
        assert!(r.spare.len() <= SPARES);
        for (i, (b, s, e)) in held.iter().enumerate() {
            assert_eq!(b.slice(*s, *e), &[i as u8; 600][..]);
        }
        drop(held);
        let spares: Vec<*const Block> = r.spare.iter().map(Arc::as_ptr).collect();
        assert!(!spares.is_empty());
        // Pin the current block with a view and fill it: the next block is a spare, not a new one.
        let pin = read_all(&mut r, &frame(&[1u8; 600]), &[usize::MAX]);
        let views = read_all(&mut r, &frame(&[2u8; 600]), &[usize::MAX]);
        assert_ne!(Arc::as_ptr(&views[0].0), Arc::as_ptr(&pin[0].0));
        assert!(spares.contains(&Arc::as_ptr(&views[0].0)));
        assert_eq!(views[0].0.slice(views[0].1, views[0].2), &[2u8; 600][..]);
    }

    #[test]
    fn a_frame_larger_than_a_block_gets_its_own_block() {
        let mut r = BlockReader::new(1 << 20, 1024);
        let body: Vec<u8> = (0..50_000u32).map(|i| i as u8).collect();
        let views = read_all(&mut r, &frame(&body), &[333]);
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].0.capacity(), HEADER_LEN + body.len());
        assert_eq!(views[0].0.slice(views[0].1, views[0].2), &body[..]);
    }

    #[test]
    fn a_block_made_for_a_large_frame_is_let_go_once_its_frame_is() {
        let mut r = BlockReader::new(1 << 20, 1024);
        let views = read_all(&mut r, &frame(&[5u8; 50_000]), &[usize::MAX]);
        assert_eq!(views[0].0.capacity(), 50_004);
        drop(views);
        let (block, start, len) = r.window().unwrap();
        assert_eq!((block.capacity(), start, len), (1024, 0, 1024));
        r.window = None;
        drop(block);
        // And the same while the large frame is still held.
        let views = read_all(&mut r, &frame(&[6u8; 50_000]), &[usize::MAX]);
        assert_eq!(r.window().unwrap().0.capacity(), 1024);
        assert_eq!(views[0].0.slice(views[0].1, views[0].2), &[6u8; 50_000][..]);
    }

    #[test]
    fn an_oversized_declaration_fails_and_stays_failed() {
        let mut r = BlockReader::new(100, 1024);
        let (block, start, len) = r.window().unwrap();
        let header = 101u32.to_be_bytes();
        // SAFETY: the window is writable and holds at least 4 bytes.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), block.window_ptr(start, len), 4) };
        let mut out = Vec::new();
        let err = r.filled(4, &mut out).unwrap_err();
        assert_eq!(
            err,
            ReadError::TooLarge(FrameTooLarge {
                declared: 101,
                limit: 100
            })
        );
        assert!(matches!(r.window(), Err(ReadError::TooLarge(_))));
    }

    #[test]
    fn filled_needs_a_window_and_at_most_its_length() {
        let mut r = BlockReader::new(100, 1024);
        let mut out = Vec::new();
        assert_eq!(r.filled(1, &mut out), Err(ReadError::NoWindow));
        let (_, _, len) = r.window().unwrap();
        assert_eq!(
            r.filled(len + 1, &mut out),
            Err(ReadError::Overfilled {
                filled: len + 1,
                window: len
            })
        );
        assert_eq!(r.filled(0, &mut out), Err(ReadError::NoWindow));
    }
}
