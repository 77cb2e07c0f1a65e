//! End-to-end preparation of generated WAV (and a few hand-built Ogg/WebM/MP4) streams; the
//! PyAV-made Opus fixtures are in `tests/opus.rs`.

use sie_audio::{decode, prepare, AudioError, Container, MAX_AUDIO_BYTES, MAX_SAMPLE_COUNT};

/// Sample encodings of a PCM WAV.
#[derive(Clone, Copy)]
enum Fmt {
    U8,
    S16,
    S24,
    F32,
}

/// A canonical RIFF/WAVE file holding `frames` (one value per channel, in [-1, 1]).
fn wav(rate: u32, channels: u16, fmt: Fmt, frames: &[Vec<f32>]) -> Vec<u8> {
    let (tag, bits): (u16, u16) = match fmt {
        Fmt::U8 => (1, 8),
        Fmt::S16 => (1, 16),
        Fmt::S24 => (1, 24),
        Fmt::F32 => (3, 32),
    };
    let mut data = Vec::new();
    for frame in frames {
        assert_eq!(frame.len(), usize::from(channels));
        for &x in frame {
            match fmt {
                Fmt::U8 => data.push(((x * 128.0).round() as i32 + 128).clamp(0, 255) as u8),
                Fmt::S16 => data.extend_from_slice(
                    &((x * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes(),
                ),
                Fmt::S24 => {
                    let v = (x * 8_388_608.0).round().clamp(-8_388_608.0, 8_388_607.0) as i32;
                    data.extend_from_slice(&v.to_le_bytes()[..3]);
                }
                Fmt::F32 => data.extend_from_slice(&x.to_le_bytes()),
            }
        }
    }
    wav_raw(rate, channels, tag, bits, &data)
}

fn wav_raw(rate: u32, channels: u16, tag: u16, bits: u16, data: &[u8]) -> Vec<u8> {
    let block = channels * (bits / 8);
    let mut out = Vec::with_capacity(44 + data.len());
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(&bits.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    out
}

fn mono(samples: impl IntoIterator<Item = f32>) -> Vec<Vec<f32>> {
    samples.into_iter().map(|x| vec![x]).collect()
}

fn sine(rate: u32, freq: f32, n: usize, amp: f32) -> impl Iterator<Item = f32> {
    (0..n).map(move |i| amp * (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin())
}

fn pcm_i16(pcm: &[u8]) -> Vec<i16> {
    pcm.chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect()
}

fn err(data: &[u8]) -> AudioError {
    decode(data, None, None).expect_err("must be refused")
}

#[test]
fn metadata_for_rates_channels_and_lengths() {
    for rate in [8_000u32, 16_000, 44_100, 48_000] {
        for channels in [1u16, 2] {
            for n in [1usize, 31, 1601] {
                let frames: Vec<Vec<f32>> = sine(rate, 440.0, n, 0.5)
                    .map(|x| vec![x; usize::from(channels)])
                    .collect();
                let p = prepare(
                    &wav(rate, channels, Fmt::S16, &frames),
                    Some("wav"),
                    Some(rate),
                )
                .unwrap_or_else(|e| panic!("{rate} Hz x{channels} {n}: {e}"));
                assert_eq!(p.container, Container::Wav);
                assert_eq!(p.sample_rate, 16_000);
                assert_eq!(p.source_sample_rate, rate);
                assert_eq!(p.source_channels, u32::from(channels));
                assert_eq!(p.source_sample_count, n as u64);
                let exact_ms = (n as u64 * 1000).div_ceil(u64::from(rate));
                assert_eq!(p.duration_ms, exact_ms);
                let expected = (n as u64 * 16_000).div_ceil(u64::from(rate));
                assert_eq!(p.sample_count, expected, "{rate} Hz {n}");
                assert_eq!(p.pcm_s16le.len() as u64, 2 * p.sample_count);
                assert!(p.sample_count <= MAX_SAMPLE_COUNT);
            }
        }
    }
}

#[test]
fn duration_examples() {
    let one = prepare(&wav(16_000, 1, Fmt::S16, &mono([0.1])), None, None).unwrap();
    assert_eq!((one.duration_ms, one.sample_count), (1, 1));
    let d = |n: usize| {
        prepare(&wav(16_000, 1, Fmt::S16, &mono(vec![0.0; n])), None, None)
            .unwrap()
            .duration_ms
    };
    assert_eq!(d(1600), 100);
    assert_eq!(d(1601), 101);
}

#[test]
fn mono_16k_pcm_is_preserved_exactly() {
    let values: Vec<i16> = (0..4000)
        .map(|i| ((i * 37) % 65_536 - 32_768) as i16)
        .collect();
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = prepare(&wav_raw(16_000, 1, 1, 16, &data), None, None).unwrap();
    assert_eq!(pcm_i16(&p.pcm_s16le), values);
}

#[test]
fn stereo_is_averaged() {
    // L = -R cancels out; L = R keeps the value.
    let cancel: Vec<Vec<f32>> = sine(16_000, 300.0, 2000, 0.8)
        .map(|x| vec![x, -x])
        .collect();
    let p = prepare(&wav(16_000, 2, Fmt::S16, &cancel), None, None).unwrap();
    assert!(pcm_i16(&p.pcm_s16le).iter().all(|v| v.abs() <= 1));
    let same: Vec<Vec<f32>> = [0.5f32, -0.25, 0.0].iter().map(|&x| vec![x, x]).collect();
    let p = prepare(&wav(16_000, 2, Fmt::S16, &same), None, None).unwrap();
    assert_eq!(pcm_i16(&p.pcm_s16le), [16_384, -8_192, 0]);
    let mixed: Vec<Vec<f32>> = vec![vec![0.5, 0.25], vec![-1.0, 0.0]];
    let p = prepare(&wav(16_000, 2, Fmt::S16, &mixed), None, None).unwrap();
    assert_eq!(pcm_i16(&p.pcm_s16le), [12_288, -16_384]);
}

#[test]
fn sample_formats_decode_to_the_same_signal() {
    let signal: Vec<f32> = sine(16_000, 500.0, 800, 0.6).collect();
    let reference: Vec<i16> = signal
        .iter()
        .map(|&x| sie_audio::quantise_sample(x))
        .collect();
    for (fmt, tolerance) in [(Fmt::U8, 256), (Fmt::S16, 1), (Fmt::S24, 1), (Fmt::F32, 1)] {
        let p = prepare(
            &wav(16_000, 1, fmt, &mono(signal.iter().copied())),
            None,
            None,
        )
        .unwrap();
        let got = pcm_i16(&p.pcm_s16le);
        assert_eq!(got.len(), reference.len());
        for (a, b) in got.iter().zip(&reference) {
            assert!(
                (i32::from(*a) - i32::from(*b)).abs() <= tolerance,
                "{a} vs {b}"
            );
        }
    }
}

#[test]
fn non_finite_float_samples_are_sanitised() {
    // NaN and infinities would poison a whole FFT block (and make rubato's inverse FFT fail).
    let mut frames = mono(sine(44_100, 440.0, 3000, 0.5));
    frames[10][0] = f32::NAN;
    frames[20][0] = f32::INFINITY;
    frames[30][0] = f32::NEG_INFINITY;
    frames[40][0] = 1e38;
    let p = prepare(&wav(44_100, 1, Fmt::F32, &frames), None, None).unwrap();
    assert_eq!(p.sample_count, 1089);
    let at_16k = prepare(&wav(16_000, 1, Fmt::F32, &frames), None, None).unwrap();
    let s = pcm_i16(&at_16k.pcm_s16le);
    assert_eq!((s[10], s[20], s[30], s[40]), (0, 32_767, -32_768, 32_767));
}

#[test]
fn float_wav_is_clamped() {
    let p = prepare(
        &wav(16_000, 1, Fmt::F32, &mono([1.5, -3.0, 1.0])),
        None,
        None,
    )
    .unwrap();
    assert_eq!(pcm_i16(&p.pcm_s16le), [32_767, -32_768, 32_767]);
}

#[test]
fn eight_khz_keeps_its_duration_when_resampled() {
    let p = prepare(
        &wav(8_000, 1, Fmt::S16, &mono(sine(8_000, 250.0, 8_000, 0.5))),
        None,
        None,
    )
    .unwrap();
    assert_eq!(p.duration_ms, 1000);
    assert_eq!(p.sample_count, 16_000);
    // The 250 Hz tone is still there: 500 zero crossings a second (away from the edges).
    let s = pcm_i16(&p.pcm_s16le);
    let crossings = s[1000..15_000]
        .windows(2)
        .filter(|w| (w[0] < 0) != (w[1] < 0))
        .count();
    assert!((430..=445).contains(&crossings), "{crossings}");
}

#[test]
fn declared_format_and_rate() {
    let data = wav(44_100, 1, Fmt::S16, &mono(vec![0.0; 100]));
    for ok in ["wav", "WAV", " audio/x-wav ", "wave", ""] {
        assert!(decode(&data, Some(ok), None).is_ok(), "{ok}");
    }
    for bad in ["mp3", "flac", "audio/mpeg", "opus", "x"] {
        assert_eq!(
            decode(&data, Some(bad), None).unwrap_err(),
            AudioError::FormatMismatch {
                container: Container::Wav
            }
        );
    }
    assert_eq!(
        decode(&data, Some(&"w".repeat(33)), None).unwrap_err(),
        AudioError::FormatTooLong { bytes: 33 }
    );
    assert!(decode(&data, Some(&" ".repeat(32)), None).is_ok());
    assert!(decode(&data, None, Some(44_100)).is_ok());
    assert_eq!(
        decode(&data, None, Some(48_000)).unwrap_err(),
        AudioError::SampleRateMismatch {
            declared: 48_000,
            actual: 44_100
        }
    );
    assert_eq!(
        decode(&data, None, Some(0)).unwrap_err(),
        AudioError::InvalidDeclaredRate
    );
}

#[test]
fn rate_and_channel_limits() {
    let at = |rate: u32, channels: u16| {
        let frames = vec![vec![0.1; usize::from(channels)]; 64];
        decode(&wav(rate, channels, Fmt::S16, &frames), None, None)
    };
    assert!(at(8_000, 1).is_ok());
    assert!(at(48_000, 2).is_ok());
    assert_eq!(
        at(7_999, 1).unwrap_err(),
        AudioError::SampleRateOutOfRange { rate: 7_999 }
    );
    assert_eq!(
        at(48_001, 1).unwrap_err(),
        AudioError::SampleRateOutOfRange { rate: 48_001 }
    );
    assert_eq!(
        at(96_000, 2).unwrap_err(),
        AudioError::SampleRateOutOfRange { rate: 96_000 }
    );
    assert_eq!(
        at(16_000, 3).unwrap_err(),
        AudioError::ChannelsOutOfRange { channels: 3 }
    );
}

#[test]
fn twelve_minutes_is_the_limit() {
    // 8-bit mono at 8 kHz keeps the files small: 720 s = 5,760,000 frames.
    let limit = 8_000 * 720;
    let exact = wav_raw(8_000, 1, 1, 8, &vec![128u8; limit]);
    let p = decode(&exact, None, None).unwrap();
    assert_eq!(p.duration_ms, 720_000);
    assert_eq!(p.sample_count(), 11_520_000);
    let over = wav_raw(8_000, 1, 1, 8, &vec![128u8; limit + 1]);
    assert_eq!(decode(&over, None, None).unwrap_err(), AudioError::TooLong);
}

#[test]
fn size_limits() {
    assert_eq!(err(b""), AudioError::Empty);
    let mut big = wav_raw(16_000, 1, 1, 8, &[]);
    big.resize(MAX_AUDIO_BYTES + 1, 0);
    assert_eq!(
        err(&big),
        AudioError::TooLarge {
            bytes: MAX_AUDIO_BYTES + 1
        }
    );
}

#[test]
fn containers_that_are_not_audio() {
    assert_eq!(
        err(b"hello world, not audio"),
        AudioError::UnsupportedContainer
    );
    assert_eq!(
        err(b"GIF89a\x01\x00\x01\x00"),
        AudioError::UnsupportedContainer
    );
    assert_eq!(err(&[0u8; 64]), AudioError::UnsupportedContainer);
}

#[test]
fn no_frames_truncation_and_corruption_are_errors() {
    let header_only = wav_raw(16_000, 1, 1, 16, &[]);
    assert_eq!(err(&header_only), AudioError::NoFrames);
    let full = wav(16_000, 1, Fmt::S16, &mono(vec![0.25; 1000]));
    assert_eq!(err(&full[..full.len() - 100]), AudioError::Truncated);
    for cut in [12usize, 20, 30, 43] {
        assert!(decode(&full[..cut], None, None).is_err(), "cut at {cut}");
    }
    let mut no_bits = full.clone();
    no_bits[34] = 0; // bits per sample 0
    assert!(decode(&no_bits, None, None).is_err());
    let mut no_channels = full.clone();
    no_channels[22] = 0;
    assert!(decode(&no_channels, None, None).is_err());
    let mut bad_tag = full.clone();
    bad_tag[20] = 0x77; // unknown format tag
    assert!(decode(&bad_tag, None, None).is_err());
    // Magic of other containers followed by garbage.
    for magic in [
        &b"fLaC"[..],
        b"OggS",
        &[0x1A, 0x45, 0xDF, 0xA3],
        b"ID3\x03\x00",
        &[0xFF, 0xFB],
    ] {
        let mut data = magic.to_vec();
        data.extend((0..600u32).map(|i| (i * 7919 % 251) as u8));
        assert!(decode(&data, None, None).is_err());
    }
    let mut mp4 = b"\x00\x00\x00\x18ftypM4A ".to_vec();
    mp4.extend_from_slice(&[0; 40]);
    assert!(decode(&mp4, None, None).is_err());
}

#[test]
fn streamed_wav_length_placeholder_is_accepted() {
    let mut data = wav(16_000, 1, Fmt::S16, &mono(vec![0.5; 500]));
    data[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    data[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let p = decode(&data, None, None).unwrap();
    assert_eq!(p.source_sample_count, 500);
}

#[test]
fn hostile_chunk_lengths_do_not_allocate_what_they_claim() {
    // A LIST chunk claiming 4 GiB before the data: symphonia 0.6 grows reads progressively, so
    // this is a quick error, not a 4 GiB allocation.
    let mut data = b"RIFF\xff\xff\xff\xffWAVE".to_vec();
    data.extend_from_slice(
        b"fmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x10\x00",
    );
    data.extend_from_slice(b"LIST\xf0\xff\xff\xffINFOISFT\xe0\xff\xff\xff");
    data.extend_from_slice(&[0u8; 64]);
    assert!(decode(&data, None, None).is_err());
}

/// The Ogg page CRC (polynomial 0x04C11DB7, not reflected, initial value 0).
fn ogg_crc(data: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in data {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn ogg_page(header_type: u8, granule: u64, serial: u32, seq: u32, packet: &[u8]) -> Vec<u8> {
    assert!(packet.len() < 255);
    let mut page = b"OggS\x00".to_vec();
    page.push(header_type);
    page.extend_from_slice(&granule.to_le_bytes());
    page.extend_from_slice(&serial.to_le_bytes());
    page.extend_from_slice(&seq.to_le_bytes());
    page.extend_from_slice(&[0; 4]);
    page.push(1);
    page.push(packet.len() as u8);
    page.extend_from_slice(packet);
    let crc = ogg_crc(&page);
    page[22..26].copy_from_slice(&crc.to_le_bytes());
    page
}

/// A hand-built Ogg/Opus stream: one 20 ms CELT packet of silence whose last page's granule
/// (960) ends the stream, so after the 312-frame pre-skip 648 frames remain.
fn tiny_ogg_opus(channel_mapping: &[u8]) -> Vec<u8> {
    let mut head = b"OpusHead\x01".to_vec();
    head.push(channel_mapping[0]);
    head.extend_from_slice(&312u16.to_le_bytes());
    head.extend_from_slice(&48_000u32.to_le_bytes());
    head.extend_from_slice(&0i16.to_le_bytes());
    head.extend_from_slice(&channel_mapping[1..]);
    let mut tags = b"OpusTags".to_vec();
    tags.extend_from_slice(&4u32.to_le_bytes());
    tags.extend_from_slice(b"test");
    tags.extend_from_slice(&0u32.to_le_bytes());
    let mut data = ogg_page(0x02, 0, 7, 0, &head);
    data.extend(ogg_page(0x00, 0, 7, 1, &tags));
    data.extend(ogg_page(0x04, 960, 7, 2, &[0xF8]));
    data
}

#[test]
fn hand_built_ogg_opus_decodes_trimmed_by_pre_skip_and_granule() {
    let data = tiny_ogg_opus(&[1, 0]);
    let d = decode(&data, Some("ogg"), None).unwrap();
    assert_eq!(
        (
            d.source_sample_rate,
            d.source_channels,
            d.source_sample_count
        ),
        (48_000, 1, 648)
    );
    assert_eq!(d.container, Container::Ogg);
    assert!(d.samples.iter().all(|x| x.abs() < 1e-3));
    assert_eq!(
        decode(&data, Some("webm"), None).unwrap_err(),
        AudioError::FormatMismatch {
            container: Container::Ogg
        }
    );
    // The stream is 48 kHz whatever the header's "input sample rate" says.
    assert_eq!(
        decode(&data, Some("ogg"), Some(16_000)).unwrap_err(),
        AudioError::SampleRateMismatch {
            declared: 16_000,
            actual: 48_000
        }
    );
}

#[test]
fn opus_headers_the_limits_refuse() {
    // Six channels (family 1, 5.1): over the two-channel limit, refused before decoding.
    assert_eq!(
        decode(&tiny_ogg_opus(&[6, 1, 4, 2, 0, 4, 1, 2, 3, 5]), None, None).unwrap_err(),
        AudioError::ChannelsOutOfRange { channels: 6 }
    );
    // An unknown channel mapping family: the Ogg demuxer does not take the stream as Opus at
    // all (its packets are skipped, so nothing decodes); in WebM the header check refuses it
    // (`opus::tests::bad_heads_are_refused`).
    assert_eq!(
        decode(&tiny_ogg_opus(&[2, 2, 1, 1, 0, 1]), None, None).unwrap_err(),
        AudioError::Truncated
    );
}

#[test]
fn error_messages_do_not_echo_input() {
    let data = wav(16_000, 1, Fmt::S16, &mono(vec![0.0; 10]));
    let secret = "audio/secret-format";
    let message = decode(&data, Some(secret), None).unwrap_err().to_string();
    assert!(!message.contains("secret"), "{message}");
    assert_eq!(
        message,
        "declared audio format does not match the wav container"
    );
}

/// xorshift64*: a tiny deterministic generator for the mutation loop.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Random flips, overwrites, insertions and cuts of valid streams: every outcome is a value or
/// a typed error (`SIE_FUZZ_ITERATIONS` runs longer, as for sie-core).
#[test]
fn fuzz_mutated_streams() {
    let iterations: usize = std::env::var("SIE_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let seeds = [
        wav(16_000, 1, Fmt::S16, &mono(sine(16_000, 440.0, 300, 0.5))),
        wav(44_100, 2, Fmt::F32, &vec![vec![0.25, -0.25]; 200]),
        wav(8_000, 1, Fmt::U8, &mono(vec![0.1; 100])),
        // The Opus path: the Ogg and Matroska demuxers, the OpusHead parser and libopus.
        include_bytes!("fixtures/tone_mono_48k.opus").to_vec(),
        include_bytes!("fixtures/tone_stereo_48k.webm").to_vec(),
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..iterations {
        let mut data = seeds[i % seeds.len()].clone();
        for _ in 0..=rng.below(4) {
            let pos = rng.below(data.len());
            match rng.below(5) {
                0 => data[pos] ^= 1 << rng.below(8),
                1 => data[pos] = [0x00, 0x7F, 0x80, 0xFF][rng.below(4)],
                2 => {
                    let b = rng.next().to_le_bytes();
                    let n = 1 + rng.below(8);
                    data.splice(pos..pos, b[..n].iter().copied());
                }
                3 => {
                    let end = (pos + 1 + rng.below(8)).min(data.len());
                    data.drain(pos..end);
                }
                _ => data.truncate(pos),
            }
            if data.is_empty() {
                break;
            }
        }
        if let Ok(p) = prepare(&data, None, None) {
            assert_eq!(p.pcm_s16le.len() as u64, 2 * p.sample_count);
            assert!(p.duration_ms <= 720_000 && p.sample_count <= MAX_SAMPLE_COUNT);
            assert!((8_000..=48_000).contains(&p.source_sample_rate));
            assert!((1..=2).contains(&p.source_channels));
        }
    }
}
