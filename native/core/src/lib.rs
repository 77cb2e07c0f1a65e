//! sie-core: the byte-level wire formats of the sie-sidecar, in safe Rust with no Python.
//!
//! * [`msgpack`]: the msgpack subset the wire uses (shortest-form writer, zero-copy reader);
//! * [`histogram`]: the telemetry registry's explicit-bucket histogram;
//! * [`frame`]: IPC length-prefixed framing and the incremental splitter;
//! * [`ipc`]: request envelopes, response classification and IpcResponseChunkV1 frames;
//! * [`controller`]: the scheduler's adaptive batch controller (PI on p50 headroom) and its replay;
//! * [`chunks`]: IpcResponseChunkV1 reassembly under a process-wide budget;
//! * [`results`]: WorkResult encoding and ResultChunkV1 planning and reassembly;
//! * [`otlp`]: OTLP trace export requests for the batch spans (prost);
//! * [`otlp_metrics`]: the OTLP metrics export request, written from the registry's points;
//! * [`outputs`]: result framing (msgpack-numpy sentinels, dense/sparse/multivector/score).
#![forbid(unsafe_code)]

pub mod batcher;
pub mod chunks;
pub mod controller;
pub mod frame;
pub mod histogram;
pub mod ipc;
pub mod jetstream;
pub mod local_items;
pub mod msgpack;
pub mod otlp;
pub mod otlp_direct;
pub mod otlp_metrics;
pub mod outputs;
pub mod results;

#[cfg(test)]
pub(crate) mod test_util {
    /// Hex (as written in shared/spec/test-vectors.md) to bytes.
    pub fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
