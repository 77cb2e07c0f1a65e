//! One error variant per §7.3 rule. Messages name sizes, rates and container names, never the
//! audio bytes or the caller's format string.

use std::fmt;

use crate::{Container, MAX_AUDIO_BYTES, MAX_CHANNELS, MAX_DURATION_MS, MAX_FORMAT_BYTES};
use crate::{MAX_SOURCE_RATE, MIN_SOURCE_RATE};

/// Why an item's audio was refused. The sidecar publishes `to_string()` as the item's
/// `invalid_request` error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AudioError {
    /// The compressed data is empty.
    Empty,
    /// The compressed data is over 24 MiB.
    TooLarge { bytes: usize },
    /// The declared `format` is longer than 32 bytes.
    FormatTooLong { bytes: usize },
    /// The declared `sample_rate` is 0 (it must be positive).
    InvalidDeclaredRate,
    /// No known container magic at the start of the data.
    UnsupportedContainer,
    /// The declared `format` names another container (or none we know).
    FormatMismatch { container: Container },
    /// The declared `sample_rate` differs from the decoded source rate.
    SampleRateMismatch { declared: u32, actual: u32 },
    /// The container holds no audio track.
    NoAudioTrack,
    /// The container holds more than one audio track.
    MultipleAudioTracks { count: usize },
    /// The track's codec has no decoder here (Opus among them: symphonia has none).
    UnsupportedCodec { codec: String },
    /// The source rate is outside 8,000-48,000 Hz.
    SampleRateOutOfRange { rate: u32 },
    /// The source has no channels, or more than 2.
    ChannelsOutOfRange { channels: usize },
    /// A packet decoded at another sample rate than the first one.
    SampleRateChanged { from: u32, to: u32 },
    /// A packet decoded with another channel layout than the first one (or the track list
    /// changed mid-stream, as in a chained Ogg stream).
    LayoutChanged,
    /// More frames than 12 minutes at the source rate.
    TooLong,
    /// Not a single frame decoded.
    NoFrames,
    /// The container declares more frames than the data holds, or stopped making progress.
    Truncated,
    /// The container or codec data is malformed (or the decoder gave up on it).
    Decode { detail: String },
    /// `ceil(frames × 1000 / rate)` does not fit in 64 bits.
    DurationOverflow,
    /// The resampler could not be built or failed.
    Resample { detail: String },
}

impl fmt::Display for AudioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "audio data is empty"),
            Self::TooLarge { bytes } => write!(
                f,
                "audio data too large: {bytes} bytes (limit {MAX_AUDIO_BYTES})"
            ),
            Self::FormatTooLong { bytes } => write!(
                f,
                "audio format is {bytes} bytes long (limit {MAX_FORMAT_BYTES})"
            ),
            Self::InvalidDeclaredRate => write!(f, "audio sample_rate must be positive"),
            Self::UnsupportedContainer => write!(
                f,
                "unsupported audio container (expected wav, mp3, flac, ogg, m4a or webm)"
            ),
            Self::FormatMismatch { container } => write!(
                f,
                "declared audio format does not match the {container} container"
            ),
            Self::SampleRateMismatch { declared, actual } => write!(
                f,
                "declared audio sample_rate {declared} does not match the decoded rate {actual}"
            ),
            Self::NoAudioTrack => write!(f, "no audio track"),
            Self::MultipleAudioTracks { count } => {
                write!(f, "{count} audio tracks (exactly one is supported)")
            }
            Self::UnsupportedCodec { codec } => write!(f, "unsupported audio codec: {codec}"),
            Self::SampleRateOutOfRange { rate } => write!(
                f,
                "audio sample rate {rate} Hz is outside {MIN_SOURCE_RATE}-{MAX_SOURCE_RATE} Hz"
            ),
            Self::ChannelsOutOfRange { channels } => write!(
                f,
                "audio has {channels} channels (1 to {MAX_CHANNELS} are supported)"
            ),
            Self::SampleRateChanged { from, to } => write!(
                f,
                "audio sample rate changed mid-stream ({from} Hz to {to} Hz)"
            ),
            Self::LayoutChanged => write!(f, "audio channel layout changed mid-stream"),
            Self::TooLong => write!(f, "audio longer than {MAX_DURATION_MS} ms"),
            Self::NoFrames => write!(f, "no audio frames decoded"),
            Self::Truncated => write!(f, "audio data is truncated"),
            Self::Decode { detail } => write!(f, "audio decode failed: {detail}"),
            Self::DurationOverflow => write!(f, "audio duration overflows"),
            Self::Resample { detail } => write!(f, "audio resampling failed: {detail}"),
        }
    }
}

impl std::error::Error for AudioError {}
