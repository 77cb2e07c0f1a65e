//! Opus (RFC 6716) in Ogg (RFC 7845) or WebM/Matroska, what browsers' MediaRecorder writes
//! (§7.3 step 3's "falling back to an Opus decoder"). Symphonia demuxes both containers but has
//! no Opus decoder; libopus (bundled by `opusic-sys` and linked statically, so the wheels stay
//! self-contained) decodes the packets.
//!
//! The identification header (`OpusHead`, the Ogg stream's first packet or Matroska's
//! CodecPrivate) is parsed and checked here before libopus sees it. Packets always decode at
//! 48 kHz, Opus's own rate; the header's "input sample rate" is only a note about the original
//! and is ignored, as RFC 7845 §5.1 says. The first `pre_skip` decoded frames are the encoder's
//! priming and are dropped, as is the padding the container trims from the last packet; the
//! header's output gain is applied.
//!
//! This module is the crate's only `unsafe`: four libopus calls behind a safe `OpusDecoder`.

#![allow(unsafe_code)]

use std::ptr::NonNull;

use opusic_sys as ffi;

use crate::error::AudioError;
use crate::MAX_CHANNELS;

/// The rate every Opus stream decodes at.
pub const OPUS_RATE: u32 = 48_000;
/// The longest packet: 120 ms at 48 kHz (RFC 6716 §3.2.5), per channel.
const MAX_PACKET_FRAMES: usize = 5_760;
/// The fixed part of `OpusHead`: magic, version, channels, pre-skip, input rate, gain, family.
const HEAD_LEN: usize = 19;

/// The identification header (RFC 7845 §5.1), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpusHead {
    pub channels: usize,
    pub pre_skip: u16,
    /// Q7.8 dB.
    pub output_gain: i16,
    pub streams: u8,
    pub coupled: u8,
    pub mapping: Vec<u8>,
}

fn bad_head(why: &str) -> AudioError {
    AudioError::Decode {
        detail: format!("invalid Opus header: {why}"),
    }
}

/// How the header's multi-byte fields are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadLayout {
    /// Ogg's `OpusHead` (RFC 7845 §5.1) and Matroska's CodecPrivate: little-endian.
    Ogg,
    /// MP4's `dOps` box, which symphonia hands over verbatim behind an `OpusHead` magic:
    /// big-endian, version 0 ("Encapsulation of Opus in ISO Base Media File Format" §4.3.2).
    Dops,
}

impl OpusHead {
    /// Parse `OpusHead`; channel mapping families 0 (mono/stereo) and 1 (Vorbis order) are
    /// accepted, with 1-2 output channels (the §7.3 channel limit). Anything else is refused
    /// before a decoder is built.
    pub fn parse(data: &[u8], layout: HeadLayout) -> Result<Self, AudioError> {
        if data.len() < HEAD_LEN || &data[..8] != b"OpusHead" {
            return Err(bad_head("no OpusHead packet"));
        }
        let version_ok = match layout {
            HeadLayout::Ogg => data[8] & 0xF0 == 0,
            HeadLayout::Dops => data[8] == 0,
        };
        if !version_ok {
            return Err(bad_head("unsupported version"));
        }
        let channels = usize::from(data[9]);
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(AudioError::ChannelsOutOfRange { channels });
        }
        let (pre_skip, output_gain) = match layout {
            HeadLayout::Ogg => (
                u16::from_le_bytes([data[10], data[11]]),
                i16::from_le_bytes([data[16], data[17]]),
            ),
            HeadLayout::Dops => (
                u16::from_be_bytes([data[10], data[11]]),
                i16::from_be_bytes([data[16], data[17]]),
            ),
        };
        let (streams, coupled, mapping) = match data[18] {
            0 => (
                1u8,
                (channels - 1) as u8,
                (0..channels as u8).collect::<Vec<u8>>(),
            ),
            1 => {
                let table = data
                    .get(HEAD_LEN..HEAD_LEN + 2 + channels)
                    .ok_or_else(|| bad_head("channel mapping table cut short"))?;
                let (streams, coupled) = (table[0], table[1]);
                let mapping = table[2..].to_vec();
                let decoded = u16::from(streams) + u16::from(coupled);
                if streams == 0 || coupled > streams || decoded > 255 {
                    return Err(bad_head("stream counts out of range"));
                }
                if mapping.iter().any(|&m| m != 255 && u16::from(m) >= decoded) {
                    return Err(bad_head("channel mapping out of range"));
                }
                (streams, coupled, mapping)
            }
            family => {
                return Err(AudioError::UnsupportedCodec {
                    codec: format!("opus (channel mapping family {family})"),
                })
            }
        };
        Ok(Self {
            channels,
            pre_skip,
            output_gain,
            streams,
            coupled,
            mapping,
        })
    }

    /// The output gain as a linear factor: 10^(gain / (20 × 256)).
    pub fn gain_factor(&self) -> f32 {
        10f32.powf(f32::from(self.output_gain) / (20.0 * 256.0))
    }
}

fn opus_error(code: i32) -> AudioError {
    let what = match code {
        ffi::OPUS_BAD_ARG => "bad argument",
        ffi::OPUS_BUFFER_TOO_SMALL => "packet longer than 120 ms",
        ffi::OPUS_INTERNAL_ERROR => "internal error",
        ffi::OPUS_INVALID_PACKET => "invalid packet",
        ffi::OPUS_UNIMPLEMENTED => "unimplemented",
        ffi::OPUS_INVALID_STATE => "invalid state",
        ffi::OPUS_ALLOC_FAIL => "allocation failed",
        _ => "unknown error",
    };
    AudioError::Decode {
        detail: format!("opus: {what}"),
    }
}

/// A libopus multistream decoder at 48 kHz (family 0 is one stream of one or two channels).
pub struct OpusDecoder {
    state: NonNull<ffi::OpusMSDecoder>,
    channels: usize,
    /// Interleaved output of the last packet, room for the longest one.
    pcm: Vec<f32>,
    gain: f32,
    /// Priming frames still to drop.
    skip: usize,
}

impl OpusDecoder {
    pub fn new(head: &OpusHead) -> Result<Self, AudioError> {
        let mut err: std::ffi::c_int = ffi::OPUS_OK;
        // SAFETY: `mapping` holds `channels` entries, each checked against streams + coupled by
        // `OpusHead::parse` (libopus checks again); `err` is a valid out-pointer.
        let raw = unsafe {
            ffi::opus_multistream_decoder_create(
                OPUS_RATE as ffi::opus_int32,
                head.channels as std::ffi::c_int,
                std::ffi::c_int::from(head.streams),
                std::ffi::c_int::from(head.coupled),
                head.mapping.as_ptr(),
                &mut err,
            )
        };
        let state = match NonNull::new(raw) {
            Some(state) if err == ffi::OPUS_OK => state,
            Some(state) => {
                // SAFETY: `state` came from `opus_multistream_decoder_create` and is not used again.
                unsafe { ffi::opus_multistream_decoder_destroy(state.as_ptr()) };
                return Err(opus_error(err));
            }
            None => return Err(opus_error(err)),
        };
        Ok(Self {
            state,
            channels: head.channels,
            pcm: vec![0.0; MAX_PACKET_FRAMES * head.channels],
            gain: head.gain_factor(),
            skip: usize::from(head.pre_skip),
        })
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Decode one packet to interleaved f32; priming frames still owed and the `trim_end`
    /// frames the container marks as end padding are dropped, so the slice may be empty.
    pub fn decode(&mut self, packet: &[u8], trim_end: usize) -> Result<&[f32], AudioError> {
        let len =
            ffi::opus_int32::try_from(packet.len()).map_err(|_| opus_error(ffi::OPUS_BAD_ARG))?;
        // SAFETY: `state` is a live decoder; `packet` is `len` readable bytes; `pcm` has room
        // for MAX_PACKET_FRAMES frames of `channels` samples, the frame_size passed.
        let frames = unsafe {
            ffi::opus_multistream_decode_float(
                self.state.as_ptr(),
                packet.as_ptr(),
                len,
                self.pcm.as_mut_ptr(),
                MAX_PACKET_FRAMES as std::ffi::c_int,
                0,
            )
        };
        let frames = usize::try_from(frames).map_err(|_| opus_error(frames))?;
        let start = self.skip.min(frames);
        self.skip -= start;
        let end = frames.saturating_sub(trim_end).max(start);
        let out = &mut self.pcm[start * self.channels..end * self.channels];
        if self.gain != 1.0 {
            out.iter_mut().for_each(|x| *x *= self.gain);
        }
        Ok(out)
    }
}

impl Drop for OpusDecoder {
    fn drop(&mut self) {
        // SAFETY: `state` came from `opus_multistream_decoder_create` and is destroyed once.
        unsafe { ffi::opus_multistream_decoder_destroy(self.state.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(channels: u8, family: u8, tail: &[u8]) -> Vec<u8> {
        let mut h = b"OpusHead\x01".to_vec();
        h.push(channels);
        h.extend_from_slice(&312u16.to_le_bytes());
        h.extend_from_slice(&48_000u32.to_le_bytes());
        h.extend_from_slice(&256i16.to_le_bytes());
        h.push(family);
        h.extend_from_slice(tail);
        h
    }

    impl OpusHead {
        fn parse_ogg(data: &[u8]) -> Result<Self, AudioError> {
            Self::parse(data, HeadLayout::Ogg)
        }
    }

    #[test]
    fn dops_fields_are_big_endian_and_its_version_is_zero() {
        let mut dops = b"OpusHead\x00\x02".to_vec();
        dops.extend_from_slice(&312u16.to_be_bytes());
        dops.extend_from_slice(&48_000u32.to_be_bytes());
        dops.extend_from_slice(&(-256i16).to_be_bytes());
        dops.push(0);
        let h = OpusHead::parse(&dops, HeadLayout::Dops).unwrap();
        assert_eq!((h.channels, h.pre_skip, h.output_gain), (2, 312, -256));
        dops[8] = 1;
        assert!(OpusHead::parse(&dops, HeadLayout::Dops).is_err());
    }

    #[test]
    fn family_zero_is_one_stream() {
        let h = OpusHead::parse_ogg(&head(2, 0, &[])).unwrap();
        assert_eq!((h.channels, h.streams, h.coupled), (2, 1, 1));
        assert_eq!(h.mapping, vec![0, 1]);
        assert_eq!(h.pre_skip, 312);
        assert!((h.gain_factor() - 10f32.powf(1.0 / 20.0)).abs() < 1e-6);
    }

    #[test]
    fn family_one_reads_its_table() {
        let h = OpusHead::parse_ogg(&head(2, 1, &[2, 0, 0, 1])).unwrap();
        assert_eq!(
            (h.streams, h.coupled, h.mapping.clone()),
            (2, 0, vec![0, 1])
        );
        assert!(OpusHead::parse_ogg(&head(2, 1, &[1, 0, 0, 1])).is_err()); // index 1 >= 1 stream
        assert!(OpusHead::parse_ogg(&head(2, 1, &[0, 0, 0, 0])).is_err()); // no streams
        assert!(OpusHead::parse_ogg(&head(2, 1, &[1, 2, 0, 0])).is_err()); // coupled > streams
        assert!(OpusHead::parse_ogg(&head(2, 1, &[1, 0])).is_err()); // table cut short
    }

    #[test]
    fn bad_heads_are_refused() {
        assert!(OpusHead::parse_ogg(b"OpusHead").is_err());
        assert!(OpusHead::parse_ogg(&head(2, 0, &[])[..18]).is_err());
        let mut wrong_magic = head(1, 0, &[]);
        wrong_magic[0] = b'o';
        assert!(OpusHead::parse_ogg(&wrong_magic).is_err());
        let mut v16 = head(1, 0, &[]);
        v16[8] = 0x10;
        assert!(OpusHead::parse_ogg(&v16).is_err());
        assert_eq!(
            OpusHead::parse_ogg(&head(0, 0, &[])),
            Err(AudioError::ChannelsOutOfRange { channels: 0 })
        );
        assert_eq!(
            OpusHead::parse_ogg(&head(6, 1, &[4, 2, 0, 4, 1, 2, 3, 5])),
            Err(AudioError::ChannelsOutOfRange { channels: 6 })
        );
        assert!(matches!(
            OpusHead::parse_ogg(&head(2, 255, &[1, 1, 0, 1])),
            Err(AudioError::UnsupportedCodec { .. })
        ));
    }

    #[test]
    fn a_garbage_packet_is_a_decode_error_and_priming_is_dropped() {
        let h = OpusHead::parse_ogg(&head(1, 0, &[])).unwrap();
        let mut d = OpusDecoder::new(&h).unwrap();
        // TOC 0xF8: CELT-only fullband 20 ms, one frame; an empty frame body decodes as silence
        // (a lost frame), 960 frames of which the first 312 are priming.
        assert_eq!(d.decode(&[0xF8], 0).unwrap().len(), 960 - 312);
        assert_eq!(d.decode(&[0xF8], 100).unwrap().len(), 860);
        assert_eq!(d.decode(&[0xF8], 5_000).unwrap().len(), 0);
        // Code 3 with a frame count of 0 is invalid (RFC 6716 §3.2.5).
        assert!(matches!(
            d.decode(&[0xFB, 0x00], 0),
            Err(AudioError::Decode { .. })
        ));
    }
}
