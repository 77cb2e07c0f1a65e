//! `sie_sidecar._native`: the PyO3 face of sie-core, plus the embedded Cython module
//! `sie_sidecar._native.wire` (subjects and tombstones).

mod assembler;
mod attempts;
mod audio;
mod batcher;
mod buffers;
mod clock;
mod columns;
mod controller;
mod convert;
mod cython;
mod deadlines;
mod envelopes;
mod errors;
mod framing;
mod histogram;
mod intake;
mod lazy;
mod local_items;
mod otlp;
mod outputs;
mod pack;
mod read_blocks;
mod replies;
mod request_body;
mod results;
mod run_batch;
mod settle;
mod slots;
mod text;
mod tracing;
mod workitem;

#[pyo3::pymodule(gil_used = true)]
mod _native {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::framing::{
        encode_frame, encode_request, encode_response_frames, FrameReader, FrameSplitter,
        ReadWindow,
    };

    #[pymodule_export]
    use crate::envelopes::{
        decode_batch_outcome, decode_body, decode_response, response_body, BatchOutcome,
        BatchedF16Multivector, IpcResponseChunk, ItemOutcome, ResponseEnvelope,
    };

    #[pymodule_export]
    use crate::assembler::{
        response_budget, AssembledResponse, ChunkLimits, IpcChunkAssembler, ResponseBudget,
    };

    #[pymodule_export]
    use crate::results::{
        encode_result_chunk, encode_work_result, plan_reply, ReplyPlan, ResultChunkAssembler,
    };

    #[pymodule_export]
    use crate::outputs::{
        f32_to_f16, frame_dense, frame_dense_batch, frame_multivector, frame_score, frame_sparse,
        nd_sentinel_raw, FramedBatch,
    };

    #[pymodule_export]
    use crate::replies::{
        frame_batch_response, frame_outcome_replies, FramedReplies, FramedResponse,
    };

    #[pymodule_export]
    use crate::batcher::{Batcher, FormedBatch};

    #[pymodule_export]
    use crate::controller::{replay_controller, AdaptiveController, PercentileWindow};

    #[pymodule_export]
    use crate::buffers::SharedBytes;

    #[pymodule_export]
    use crate::workitem::decode_work_item;

    #[pymodule_export]
    use crate::intake::intake_batch;

    #[pymodule_export]
    use crate::attempts::{delivery_attempts, AttemptTally};

    #[pymodule_export]
    use crate::lazy::{deliveries_of_run, LazyDelivery};

    #[pymodule_export]
    use crate::run_batch::write_run_batch_body;

    #[pymodule_export]
    use crate::request_body::RequestBody;

    #[pymodule_export]
    use crate::settle::finish_deliveries;

    #[pymodule_export]
    use crate::columns::{config_hashes, request_latencies_ms, run_batch_columns, unsettled};

    #[pymodule_export]
    use crate::deadlines::{deadline_lease_holders, deadline_split};

    #[pymodule_export]
    use crate::local_items::check_local_items;

    #[pymodule_export]
    use crate::otlp::{encode_metrics_request, encode_trace_request};

    #[pymodule_export]
    use crate::tracing::{BatchSpan, BatchTracer};

    #[pymodule_export]
    use crate::histogram::{BatchInstruments, Histogram};

    #[pymodule_export]
    use crate::audio::{prepare_audio, PreparedAudio};

    #[allow(non_upper_case_globals)]
    #[pymodule_export]
    const __version__: &str = env!("CARGO_PKG_VERSION");

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add(
            "PRODUCTION_LIMITS",
            crate::assembler::production_limits(m.py())?,
        )?;
        m.add(
            "AudioPrepError",
            m.py().get_type::<crate::audio::AudioPrepError>(),
        )?;
        let origin = m.filename().ok().map(|f| f.to_string());
        let wire = crate::cython::load(
            m.py(),
            "sie_sidecar._native.wire",
            origin.as_deref(),
            crate::cython::PyInit_wire,
        )?;
        // Not add_submodule(): that would use __name__ ("sie_sidecar._native.wire") as the attribute.
        m.add("wire", wire)?;
        Ok(())
    }
}
