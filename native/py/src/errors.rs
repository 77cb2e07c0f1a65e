//! The typed exceptions of `sie_sidecar.errors`, raised from Rust so both implementations raise
//! the very same classes.
use pyo3::PyErr;

pyo3::import_exception!(sie_sidecar.errors, FrameTooLarge);
pyo3::import_exception!(sie_sidecar.errors, ProtocolError);
pyo3::import_exception!(sie_sidecar.errors, DecodeError);
pyo3::import_exception!(sie_sidecar.errors, ChunkProtocolError);
pyo3::import_exception!(sie_sidecar.errors, BudgetExceeded);
pyo3::import_exception!(sie_sidecar.errors, IpcServerError);
pyo3::import_exception!(sie_sidecar.errors, ShapeError);
pyo3::import_exception!(sie_sidecar.errors, PayloadTooLarge);

pub fn frame_too_large(e: sie_core::frame::FrameTooLarge) -> PyErr {
    FrameTooLarge::new_err(e.to_string())
}

pub fn decode(e: sie_core::msgpack::DecodeError) -> PyErr {
    DecodeError::new_err(e.to_string())
}

pub fn shape(e: sie_core::outputs::ShapeError) -> PyErr {
    ShapeError::new_err(e.0)
}

pub fn chunk(e: sie_core::chunks::ChunkError) -> PyErr {
    match e {
        sie_core::chunks::ChunkError::Protocol(m) => ChunkProtocolError::new_err(m),
        budget @ sie_core::chunks::ChunkError::Budget { .. } => {
            BudgetExceeded::new_err(budget.to_string())
        }
    }
}
