//! Audio preparation (`sie_audio`, scheduler-and-prep §7.3) for Python: `prepare_audio` decodes,
//! down-mixes, resamples and quantises with the GIL released, and returns a `PreparedAudio` whose
//! `pcm_s16le` is one `bytes` written once.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyString};

use crate::buffers::RawBuffer;

pyo3::import_exception!(sie_sidecar.errors, AudioPrepError);

fn refused(e: sie_audio::AudioError) -> PyErr {
    AudioPrepError::new_err(e.to_string())
}

/// PreparedAudioPcm16 (wire-protocol §4.3): mono s16le PCM at 16 kHz plus the source's facts.
#[pyclass(frozen, get_all, module = "sie_sidecar._native")]
pub struct PreparedAudio {
    pub pcm_s16le: Py<PyBytes>,
    pub sample_rate: u32,
    pub sample_count: u64,
    pub duration_ms: u64,
    pub source_sample_rate: u32,
    pub source_sample_count: u64,
    pub source_channels: u32,
    pub container: &'static str,
}

#[pymethods]
impl PreparedAudio {
    /// The wire map: the eight PreparedAudioPcm16 keys, `pcm_s16le` shared, not copied.
    fn to_wire<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("pcm_s16le", self.pcm_s16le.bind(py))?;
        d.set_item("sample_rate", self.sample_rate)?;
        d.set_item("sample_count", self.sample_count)?;
        d.set_item("duration_ms", self.duration_ms)?;
        d.set_item("source_sample_rate", self.source_sample_rate)?;
        d.set_item("source_sample_count", self.source_sample_count)?;
        d.set_item("source_channels", self.source_channels)?;
        d.set_item("container", self.container)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "PreparedAudio(container={:?}, sample_count={}, duration_ms={}, source_sample_rate={}, \
             source_sample_count={}, source_channels={})",
            self.container,
            self.sample_count,
            self.duration_ms,
            self.source_sample_rate,
            self.source_sample_count,
            self.source_channels
        )
    }
}

/// `format` as `Option<String>`: str or None; anything else is a TypeError.
fn declared_format(format: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match format {
        None => Ok(None),
        Some(f) if f.is_none() => Ok(None),
        Some(f) => {
            let s = f
                .cast::<PyString>()
                .map_err(|_| PyTypeError::new_err("format must be a str or None"))?;
            // Lossy only for lone surrogates, which match no format name anyway.
            Ok(Some(s.to_string_lossy().into_owned()))
        }
    }
}

/// `sample_rate` as `Option<u32>`: an int that fits u32 (0 is refused later, as declared-invalid),
/// or None. A bool or non-int is a TypeError; a negative or too large int an `AudioPrepError`.
fn declared_rate(rate: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u32>> {
    match rate {
        None => Ok(None),
        Some(r) if r.is_none() => Ok(None),
        Some(r) if r.is_instance_of::<PyBool>() || !r.is_instance_of::<PyInt>() => {
            Err(PyTypeError::new_err("sample_rate must be an int or None"))
        }
        Some(r) => r.extract::<u32>().map(Some).map_err(|_| {
            AudioPrepError::new_err("audio sample_rate must be a positive integer that fits u32")
        }),
    }
}

/// Decode one item's compressed audio (`data`: bytes or any buffer; `format` and `sample_rate` as
/// declared by the item, each optional) into a `PreparedAudio`, or raise `AudioPrepError` with
/// the reason. The GIL is released while decoding and while the PCM is written.
///
/// `bytes` input is read in place; any other buffer (it could change under a released GIL) is
/// copied once first.
#[pyfunction]
#[pyo3(signature = (data, format = None, sample_rate = None))]
pub fn prepare_audio(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    format: Option<&Bound<'_, PyAny>>,
    sample_rate: Option<&Bound<'_, PyAny>>,
) -> PyResult<PreparedAudio> {
    let format = declared_format(format)?;
    let rate = declared_rate(sample_rate)?;
    let decode = |bytes: &[u8]| {
        py.detach(|| sie_audio::decode(bytes, format.as_deref(), rate))
            .map_err(refused)
    };
    let decoded = if let Ok(b) = data.cast::<PyBytes>() {
        decode(b.as_bytes())?
    } else {
        let copy = RawBuffer::get(data, false)
            .map_err(|_| PyTypeError::new_err("data must be bytes or a buffer"))?
            .as_bytes()
            .to_vec();
        decode(&copy)?
    };
    let samples = &decoded.samples;
    let pcm = PyBytes::new_with(py, samples.len() * 2, |out| {
        py.detach(|| sie_audio::quantise_into(samples, out));
        Ok(())
    })?;
    Ok(PreparedAudio {
        pcm_s16le: pcm.unbind(),
        sample_rate: sie_audio::TARGET_RATE,
        sample_count: decoded.sample_count(),
        duration_ms: decoded.duration_ms,
        source_sample_rate: decoded.source_sample_rate,
        source_sample_count: decoded.source_sample_count,
        source_channels: decoded.source_channels,
        container: decoded.container.as_str(),
    })
}
