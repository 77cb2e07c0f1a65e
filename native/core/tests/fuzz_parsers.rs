//! Bounded fuzz loop over every parser of the core: random bytes and mutations of valid inputs
//! must produce a typed error or a value, never a panic, a hang or an unbounded allocation.
//! `SIE_FUZZ_ITERATIONS` sets the count (`make fuzz` runs millions).

use sie_core::chunks::{Assembler, Budget, ChunkLimits, Sha256Sink};
use sie_core::frame::{encode_frame, Body, FrameSplitter, MAX_FRAME};
use sie_core::ipc::{decode_response, encode_chunk_frame, encode_request, Response};
use sie_core::msgpack::Reader;
use sie_core::results::{encode_result_chunk, parse_result_chunk, ChunkIdentity, ResultAssembler};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

struct NullSha;
impl Sha256Sink for NullSha {
    fn update(&mut self, _data: &[u8]) -> Result<(), String> {
        Ok(())
    }
    fn finalize(&mut self) -> Result<[u8; 32], String> {
        Ok([0; 32])
    }
}

fn iterations() -> usize {
    std::env::var("SIE_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn seeds() -> Vec<Vec<u8>> {
    let mut body = Vec::new();
    sie_core::msgpack::write_map_header(&mut body, 1);
    sie_core::msgpack::write_str(&mut body, "outcomes");
    sie_core::msgpack::write_array_header(&mut body, 0);
    let request = encode_request("RunBatch", "w-1", &body, true).unwrap();
    let chunk = encode_chunk_frame("w-1", &[1u8; 32], 0, 2, 40_000_000, b"payload");
    let mut result_chunk = Vec::new();
    let id = ChunkIdentity {
        work_item_id: "r.0",
        request_id: "r",
        item_index: 0,
    };
    encode_result_chunk(&mut result_chunk, &id, &[2u8; 32], 0, 1, 3, b"abc");
    vec![request[4..].to_vec(), chunk, result_chunk, body]
}

fn mutate(rng: &mut XorShift, input: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        match rng.below(4) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = rng.next() as u8;
            }
            1 if !input.is_empty() => {
                let i = rng.below(input.len());
                input.truncate(i);
            }
            2 => {
                let i = rng.below(input.len() + 1);
                input.insert(i, rng.next() as u8);
            }
            _ => {
                let i = rng.below(input.len() + 1);
                let interesting = [0xc1u8, 0xdd, 0xdf, 0xc6, 0xff, 0x00, 0x7f, 0x80];
                input.insert(i, interesting[rng.below(interesting.len())]);
            }
        }
    }
}

fn exercise(input: &[u8]) {
    let _ = Reader::new(input).skip_value();
    if let Ok(Response::Chunk(c)) = decode_response(input) {
        let payload = &input[c.payload.0..c.payload.1];
        let mut a = Assembler::new(
            c.request_id.to_owned(),
            Budget::new(1 << 20),
            ChunkLimits::PRODUCTION,
        );
        let _ = a.feed(&c, payload, || Ok(NullSha));
    }
    let _ = parse_result_chunk(input, 16 << 20);
    let mut r = ResultAssembler::new(16 << 20);
    let _ = r.feed(input, || Ok(NullSha));
    let mut s = FrameSplitter::new(MAX_FRAME);
    let mut out = Vec::new();
    if s.feed(input, &mut out).is_ok() {
        for body in out {
            if let Body::InInput { start, end } = body {
                assert!(start <= end && end <= input.len());
            }
        }
    }
}

#[test]
fn fuzz_parsers_random_and_mutated() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let seeds = seeds();
    for i in 0..iterations() {
        let input = if i % 2 == 0 {
            let len = rng.below(64);
            (0..len).map(|_| rng.next() as u8).collect::<Vec<u8>>()
        } else {
            let mut s = seeds[rng.below(seeds.len())].clone();
            mutate(&mut rng, &mut s);
            s
        };
        exercise(&input);
    }
}

#[test]
fn fuzz_splitter_chunkings() {
    let mut rng = XorShift(42);
    for _ in 0..(iterations() / 100).max(10) {
        let bodies: Vec<Vec<u8>> = (0..rng.below(6))
            .map(|_| (0..rng.below(40)).map(|_| rng.next() as u8).collect())
            .collect();
        let stream: Vec<u8> = bodies
            .iter()
            .flat_map(|b| encode_frame(b).unwrap())
            .collect();
        let mut s = FrameSplitter::new(MAX_FRAME);
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < stream.len() {
            let take = 1 + rng.below(stream.len() - pos);
            let part = &stream[pos..pos + take];
            let mut out = Vec::new();
            s.feed(part, &mut out).unwrap();
            for b in out {
                got.push(match b {
                    Body::InInput { start, end } => part[start..end].to_vec(),
                    Body::Assembled(v) => v,
                });
            }
            pos += take;
        }
        assert_eq!(got, bodies);
        assert_eq!(s.buffered(), 0);
    }
}
