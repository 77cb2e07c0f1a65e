//! Demuxing and decoding with symphonia (§7.3 step 3): exactly one audio track, the stream's
//! declared rate and channels checked, every packet at the first packet's rate and layout, the
//! frame cap enforced while decoding, down-mixed to mono as it goes.

use std::io::Cursor;

use symphonia::core::audio::Channels;
use symphonia::core::codecs::audio::well_known::CODEC_ID_OPUS;
use symphonia::core::codecs::audio::{
    AudioCodecParameters, AudioDecoder, AudioDecoderOptions, CODEC_ID_NULL_AUDIO,
};
use symphonia::core::codecs::CodecParameters;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::{Hint, Probe, ProbeOptions};
use symphonia::core::formats::well_known::{
    FORMAT_ID_FLAC, FORMAT_ID_ISOMP4, FORMAT_ID_MKV, FORMAT_ID_MP3, FORMAT_ID_OGG, FORMAT_ID_WAVE,
};
use symphonia::core::formats::{FormatId, FormatOptions, FormatReader, Track};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::packet::Packet;
use symphonia::default::formats::{
    FlacReader, IsoMp4Reader, MkvReader, MpaReader, OggReader, WavReader,
};
use symphonia::default::meta::Id3v2Reader;

use crate::error::AudioError;
use crate::opus::{HeadLayout, OpusDecoder, OpusHead, OPUS_RATE};
use crate::pcm::{downmix_interleaved_into, downmix_into, max_frames};
use crate::resample::Mono16k;
use crate::{Container, MAX_CHANNELS, MAX_DURATION_MS, MAX_SOURCE_RATE, MIN_SOURCE_RATE};

/// Packets in a row that may decode to nothing (decoder priming) before the stream counts as
/// stuck.
const MAX_EMPTY_PACKETS: u32 = 64;
/// How far the probe looks for the container's own header: it must be at the start (after an
/// ID3v2 tag for MP3), not somewhere in a megabyte of junk.
const PROBE_DEPTH: u32 = 64 * 1024;

/// What decoding produced: mono samples at 16 kHz plus the source's facts.
pub struct Decoded {
    pub samples: Vec<f32>,
    pub source_rate: u32,
    pub source_frames: u64,
    pub source_channels: u32,
}

fn decode_error(e: SymError) -> AudioError {
    match e {
        SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            AudioError::Truncated
        }
        SymError::ResetRequired => AudioError::LayoutChanged,
        other => AudioError::Decode {
            detail: other.to_string(),
        },
    }
}

/// A probe that knows only `container`'s reader (and ID3v2 tags in front of MP3), so the bytes
/// are parsed as the container the magic announced, or not at all.
fn probe_for(container: Container) -> Probe {
    let mut probe = Probe::new_with_options(&ProbeOptions {
        max_probe_depth: PROBE_DEPTH,
        ..ProbeOptions::default()
    });
    match container {
        Container::Wav => probe.register_format::<WavReader<'_>>(),
        Container::Flac => probe.register_format::<FlacReader<'_>>(),
        Container::Ogg => probe.register_format::<OggReader<'_>>(),
        Container::M4a => probe.register_format::<IsoMp4Reader<'_>>(),
        Container::Webm => probe.register_format::<MkvReader<'_>>(),
        Container::Mp3 => {
            probe.register_metadata::<Id3v2Reader<'_>>();
            probe.register_format::<MpaReader<'_>>();
        }
    }
    probe
}

fn format_id(container: Container) -> FormatId {
    match container {
        Container::Wav => FORMAT_ID_WAVE,
        Container::Flac => FORMAT_ID_FLAC,
        Container::Ogg => FORMAT_ID_OGG,
        Container::M4a => FORMAT_ID_ISOMP4,
        Container::Webm => FORMAT_ID_MKV,
        Container::Mp3 => FORMAT_ID_MP3,
    }
}

fn check_rate(rate: u32) -> Result<u32, AudioError> {
    if (MIN_SOURCE_RATE..=MAX_SOURCE_RATE).contains(&rate) {
        Ok(rate)
    } else {
        Err(AudioError::SampleRateOutOfRange { rate })
    }
}

fn check_channels(channels: usize) -> Result<usize, AudioError> {
    if (1..=MAX_CHANNELS).contains(&channels) {
        Ok(channels)
    } else {
        Err(AudioError::ChannelsOutOfRange { channels })
    }
}

/// The one audio track: its id, codec parameters and declared frame count.
fn audio_track(
    reader: &dyn FormatReader,
) -> Result<(u32, AudioCodecParameters, Option<u64>), AudioError> {
    let audio: Vec<&Track> = reader
        .tracks()
        .iter()
        .filter(|t| matches!(t.codec_params, Some(CodecParameters::Audio(_))))
        .collect();
    let track = match audio.as_slice() {
        [] => return Err(AudioError::NoAudioTrack),
        [one] => *one,
        many => {
            return Err(AudioError::MultipleAudioTracks { count: many.len() });
        }
    };
    let Some(CodecParameters::Audio(params)) = &track.codec_params else {
        return Err(AudioError::NoAudioTrack);
    };
    Ok((track.id, params.clone(), track.num_frames))
}

fn codec_name(params: &AudioCodecParameters) -> String {
    if params.codec == CODEC_ID_OPUS {
        return "opus".to_owned();
    }
    if params.codec == CODEC_ID_NULL_AUDIO {
        return "unknown".to_owned();
    }
    match symphonia::default::get_codecs().get_audio_decoder(params.codec) {
        Some(registered) => registered.codec.info.short_name.to_owned(),
        None => format!("codec id {}", params.codec),
    }
}

/// The track's decoder: symphonia's registry first, libopus for Opus (§7.3 step 3).
enum TrackDecoder {
    Registry(Box<dyn AudioDecoder>),
    /// libopus, and whether the demuxer's end trim marks the stream's end: Ogg's does (from the
    /// last granule position, as FFmpeg reads it); Matroska's DiscardPadding and MP4's edit
    /// list are not read, so those keep up to one packet of end padding.
    Opus(OpusDecoder, bool),
}

impl TrackDecoder {
    fn for_track(params: &AudioCodecParameters, container: Container) -> Result<Self, AudioError> {
        match symphonia::default::get_codecs()
            .make_audio_decoder(params, &AudioDecoderOptions::default())
        {
            Ok(decoder) => Ok(Self::Registry(decoder)),
            Err(SymError::Unsupported(_)) if params.codec == CODEC_ID_OPUS => {
                let layout = match container {
                    Container::M4a => HeadLayout::Dops,
                    _ => HeadLayout::Ogg,
                };
                let extra = params.extra_data.as_deref().unwrap_or_default();
                let head = OpusHead::parse(extra, layout)?;
                if let Some(channels) = &params.channels {
                    if channels.count() != head.channels {
                        return Err(AudioError::Decode {
                            detail: "the container and the Opus header disagree on channels"
                                .to_owned(),
                        });
                    }
                }
                Ok(Self::Opus(
                    OpusDecoder::new(&head)?,
                    container == Container::Ogg,
                ))
            }
            Err(SymError::Unsupported(_)) => Err(AudioError::UnsupportedCodec {
                codec: codec_name(params),
            }),
            Err(other) => Err(decode_error(other)),
        }
    }

    /// Decode one packet and down-mix it onto `mono`: `None` when it produced no frames, else
    /// its frame count, rate and channel layout.
    fn decode_into(
        &mut self,
        packet: &Packet,
        planes: &mut Vec<Vec<f32>>,
        mono: &mut Vec<f32>,
    ) -> Result<Option<(usize, u32, Channels)>, AudioError> {
        match self {
            Self::Registry(decoder) => {
                let buffer = decoder.decode(packet).map_err(decode_error)?;
                let n = buffer.frames();
                if n == 0 {
                    return Ok(None);
                }
                let rate = buffer.spec().rate();
                let layout = buffer.spec().channels().clone();
                buffer.copy_to_vecs_planar::<f32>(planes);
                downmix_into(planes, n, mono);
                Ok(Some((n, rate, layout)))
            }
            Self::Opus(decoder, end_trim) => {
                let channels = decoder.channels();
                let trim_end = if *end_trim {
                    usize::try_from(packet.trim_end.get()).unwrap_or(usize::MAX)
                } else {
                    0
                };
                let pcm = decoder.decode(&packet.data, trim_end)?;
                let n = pcm.len() / channels;
                if n == 0 {
                    return Ok(None);
                }
                downmix_interleaved_into(pcm, channels, mono);
                Ok(Some((n, OPUS_RATE, Channels::Discrete(channels as u16))))
            }
        }
    }
}

/// Decode `data` (already sniffed as `container`) to mono 16 kHz. `declared_rate` must equal
/// the source rate when given.
pub fn decode(
    data: &[u8],
    container: Container,
    declared_rate: Option<u32>,
) -> Result<Decoded, AudioError> {
    let source = MediaSourceStream::new(
        Box::new(Cursor::new(data)),
        MediaSourceStreamOptions::default(),
    );
    let mut reader = probe_for(container)
        .probe(
            &Hint::new(),
            source,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            SymError::Unsupported(_) => AudioError::Decode {
                detail: format!("not a valid {container} stream"),
            },
            other => decode_error(other),
        })?;
    if reader.format_info().format != format_id(container) {
        return Err(AudioError::Decode {
            detail: format!("not a valid {container} stream"),
        });
    }
    let (track_id, mut params, declared_frames) = audio_track(reader.as_ref())?;
    if params.codec == CODEC_ID_OPUS {
        // Opus decodes at 48 kHz whatever the container says (Matroska may carry the encoder's
        // input rate, as the OpusHead does): the stream's rate is 48 kHz.
        params.sample_rate = Some(OPUS_RATE);
    }

    // The stream's own claims, before any decoding.
    if let Some(rate) = params.sample_rate {
        check_rate(rate)?;
        if let Some(declared) = declared_rate.filter(|d| *d != rate) {
            return Err(AudioError::SampleRateMismatch {
                declared,
                actual: rate,
            });
        }
    }
    if let Some(channels) = &params.channels {
        check_channels(channels.count())?;
    }
    if params.codec == CODEC_ID_NULL_AUDIO {
        return Err(AudioError::UnsupportedCodec {
            codec: codec_name(&params),
        });
    }
    let mut decoder = TrackDecoder::for_track(&params, container)?;

    let mut planes: Vec<Vec<f32>> = Vec::new();
    let mut mono: Vec<f32> = Vec::new();
    let mut out: Option<Mono16k> = None;
    // The first packet's rate, channel layout and channel count, and the frame cap at that rate.
    let mut spec: Option<(u32, Channels, usize, u64)> = None;
    let mut frames: u64 = 0;
    let mut empty_run = 0u32;
    loop {
        let packet = match reader.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            // Symphonia's end-of-stream signal for readers that run into the end of the input
            // (MP3 turns it into `Ok(None)` itself); a cut-short WAV or FLAC is caught below.
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(decode_error(e)),
        };
        if packet.track_id != track_id {
            continue;
        }
        if packet.data.is_empty() {
            break; // nothing left to read: the length check below tells cut-short from streamed
        }
        mono.clear();
        let Some((n, rate, layout)) = decoder.decode_into(&packet, &mut planes, &mut mono)? else {
            empty_run += 1;
            if empty_run > MAX_EMPTY_PACKETS {
                return Err(AudioError::Truncated);
            }
            continue;
        };
        empty_run = 0;
        let channels = layout.count();
        let cap = match &spec {
            None => {
                check_rate(rate)?;
                check_channels(channels)?;
                if let Some(declared) = declared_rate.filter(|d| *d != rate) {
                    return Err(AudioError::SampleRateMismatch {
                        declared,
                        actual: rate,
                    });
                }
                if let Some(stream_rate) = params.sample_rate.filter(|r| *r != rate) {
                    return Err(AudioError::SampleRateChanged {
                        from: stream_rate,
                        to: rate,
                    });
                }
                out = Some(Mono16k::new(rate, declared_frames)?);
                let cap = max_frames(rate, MAX_DURATION_MS);
                spec = Some((rate, layout.clone(), channels, cap));
                cap
            }
            Some((first_rate, first_layout, _, cap)) => {
                if rate != *first_rate {
                    return Err(AudioError::SampleRateChanged {
                        from: *first_rate,
                        to: rate,
                    });
                }
                if layout != *first_layout {
                    return Err(AudioError::LayoutChanged);
                }
                *cap
            }
        };
        frames += n as u64;
        if frames > cap {
            return Err(AudioError::TooLong);
        }
        if let Some(out) = out.as_mut() {
            out.push(&mono)?;
        }
    }
    let (Some((rate, _, channels, cap)), Some(out)) = (spec, out) else {
        return Err(AudioError::NoFrames);
    };
    // WAV and FLAC state their exact length: fewer frames means the data was cut short. A length
    // beyond the cap is a placeholder (a streamed WAV writes 0xFFFFFFFF), not a promise.
    if matches!(container, Container::Wav | Container::Flac) {
        if let Some(declared) = declared_frames.filter(|d| *d > 0 && *d <= cap) {
            if frames < declared {
                return Err(AudioError::Truncated);
            }
        }
    }
    Ok(Decoded {
        samples: out.finish()?,
        source_rate: rate,
        source_frames: frames,
        source_channels: channels as u32,
    })
}
