//! Audio preparation for extract items (scheduler-and-prep §7.3, §2.3): the compressed audio of
//! an item becomes the `PreparedAudioPcm16` the backend receives (wire-protocol §4.3).
//!
//! 1. The container is sniffed from its magic bytes (`sniff`) and the declared format, if any,
//!    must name that container (`format_matches`).
//! 2. Symphonia demuxes and decodes it (libopus decodes Opus): exactly one audio track, 8-48 kHz, 1-2 channels, the same
//!    rate and layout in every packet, at most 12 minutes of frames, at least one frame.
//! 3. Channels are averaged to mono and resampled to 16 kHz with rubato's FFT resampler (fixed
//!    input chunk of 1024) when the source rate differs.
//! 4. Samples are quantised to little-endian i16 (`quantise_into`).
//!
//! `duration_ms` is computed from the *source* frames and rate, rounded up.
//!
//! Opus: symphonia demuxes Ogg, WebM and MP4 Opus tracks but has no Opus decoder, so they fall
//! back to libopus, bundled and linked statically (`opus`, the crate's only `unsafe`).
//!
//! No Python; the PyO3 glue is `native/py/src/audio.rs`.

#![deny(unsafe_code)]

mod decode;
mod error;
mod opus;
mod pcm;
mod resample;
mod sniff;

pub use error::AudioError;
pub use pcm::{duration_ms, max_frames, quantise, quantise_into, quantise_sample, resampled_len};
pub use sniff::{format_matches, sniff, Container};

/// Compressed bytes accepted per item: 24 MiB.
pub const MAX_AUDIO_BYTES: usize = 24 * 1024 * 1024;
/// Longest decoded clip: 12 minutes.
pub const MAX_DURATION_MS: u64 = 720_000;
/// Longest declared format string, in bytes of UTF-8.
pub const MAX_FORMAT_BYTES: usize = 32;
/// Source sample rates accepted, inclusive.
pub const MIN_SOURCE_RATE: u32 = 8_000;
pub const MAX_SOURCE_RATE: u32 = 48_000;
/// Source channels accepted: mono or stereo.
pub const MAX_CHANNELS: usize = 2;
/// The rate of every prepared clip.
pub const TARGET_RATE: u32 = 16_000;
/// Input frames per resampler call.
pub const RESAMPLE_CHUNK: usize = 1024;
/// The backend's bound on `sample_count`: 12 minutes at 16 kHz plus 2048 samples of slack.
pub const MAX_SAMPLE_COUNT: u64 = MAX_DURATION_MS * 16 + 2048;

/// Decoded, down-mixed and resampled audio; `samples` still as f32 in [-1, 1] (roughly: FFT
/// resampling can overshoot slightly; quantisation clamps).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedAudio {
    /// Mono samples at 16 kHz.
    pub samples: Vec<f32>,
    /// `ceil(source_sample_count × 1000 / source_sample_rate)`.
    pub duration_ms: u64,
    pub source_sample_rate: u32,
    /// Frames decoded at the source rate (one frame = one sample per channel).
    pub source_sample_count: u64,
    pub source_channels: u32,
    pub container: Container,
}

impl DecodedAudio {
    /// Samples at 16 kHz (the wire's `sample_count`).
    pub fn sample_count(&self) -> u64 {
        self.samples.len() as u64
    }
}

/// The complete wire struct, PCM included (`quantise_into` a caller's buffer avoids this copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedAudio {
    pub pcm_s16le: Vec<u8>,
    pub sample_rate: u32,
    pub sample_count: u64,
    pub duration_ms: u64,
    pub source_sample_rate: u32,
    pub source_sample_count: u64,
    pub source_channels: u32,
    pub container: Container,
}

/// Check the cheap rules (size, declared format and rate) and find the container.
pub fn inspect(
    data: &[u8],
    format: Option<&str>,
    sample_rate: Option<u32>,
) -> Result<Container, AudioError> {
    if data.is_empty() {
        return Err(AudioError::Empty);
    }
    if data.len() > MAX_AUDIO_BYTES {
        return Err(AudioError::TooLarge { bytes: data.len() });
    }
    if let Some(f) = format {
        if f.len() > MAX_FORMAT_BYTES {
            return Err(AudioError::FormatTooLong { bytes: f.len() });
        }
    }
    if sample_rate == Some(0) {
        return Err(AudioError::InvalidDeclaredRate);
    }
    let container = sniff(data).ok_or(AudioError::UnsupportedContainer)?;
    if !format_matches(format, container) {
        return Err(AudioError::FormatMismatch { container });
    }
    Ok(container)
}

/// Decode one item's audio to mono 16 kHz f32 (§7.3 steps 1-4 and 6).
///
/// A panic inside a decoder (malformed input reaching a bug) is caught and reported as a
/// decode error: hostile bytes must never take the process down.
pub fn decode(
    data: &[u8],
    format: Option<&str>,
    sample_rate: Option<u32>,
) -> Result<DecodedAudio, AudioError> {
    let container = inspect(data, format, sample_rate)?;
    let decoded = std::panic::catch_unwind(|| decode::decode(data, container, sample_rate))
        .map_err(|_| AudioError::Decode {
            detail: format!("the {container} decoder failed on malformed data"),
        })??;
    let duration_ms = duration_ms(decoded.source_frames, decoded.source_rate)
        .ok_or(AudioError::DurationOverflow)?;
    if duration_ms > MAX_DURATION_MS {
        return Err(AudioError::TooLong);
    }
    Ok(DecodedAudio {
        samples: decoded.samples,
        duration_ms,
        source_sample_rate: decoded.source_rate,
        source_sample_count: decoded.source_frames,
        source_channels: decoded.source_channels,
        container,
    })
}

/// `decode`, then quantise into a new vector: the whole §7.3 preparation.
pub fn prepare(
    data: &[u8],
    format: Option<&str>,
    sample_rate: Option<u32>,
) -> Result<PreparedAudio, AudioError> {
    let d = decode(data, format, sample_rate)?;
    Ok(PreparedAudio {
        pcm_s16le: quantise(&d.samples),
        sample_rate: TARGET_RATE,
        sample_count: d.sample_count(),
        duration_ms: d.duration_ms,
        source_sample_rate: d.source_sample_rate,
        source_sample_count: d.source_sample_count,
        source_channels: d.source_channels,
        container: d.container,
    })
}
