//! Opus in Ogg and WebM (what browsers record), decoded by the bundled libopus. The fixtures are
//! one second of tone made with PyAV (FFmpeg + libopus) by `tests/make_opus_fixtures.py`.

use sie_audio::{decode, prepare, AudioError, Container};

const MONO_OGG: &[u8] = include_bytes!("fixtures/tone_mono_48k.opus");
const MONO_16K_OGG: &[u8] = include_bytes!("fixtures/tone_mono_16k.opus");
const MONO_WEBM: &[u8] = include_bytes!("fixtures/tone_mono_48k.webm");
const STEREO_WEBM: &[u8] = include_bytes!("fixtures/tone_stereo_48k.webm");
const MONO_MP4: &[u8] = include_bytes!("fixtures/tone_mono_48k_opus.m4a");

/// How much end padding a WebM or MP4 clip may keep: their demuxers read neither Matroska's
/// DiscardPadding nor MP4's edit list, so up to one packet (at most 120 ms) stays.
const WEBM_PADDING_MAX: u64 = 5_760;

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

/// Rising zero crossings per second of a 16 kHz signal: a tone's frequency.
fn frequency_16k(x: &[f32]) -> f64 {
    let rising = x.windows(2).filter(|w| w[0] < 0.0 && w[1] >= 0.0).count();
    rising as f64 * 16_000.0 / x.len() as f64
}

#[test]
fn ogg_opus_is_one_second_of_440_hz_at_48_khz() {
    let d = decode(MONO_OGG, Some("audio/ogg"), None).unwrap();
    assert_eq!(d.container, Container::Ogg);
    assert_eq!(
        (
            d.source_sample_rate,
            d.source_channels,
            d.source_sample_count
        ),
        (48_000, 1, 48_000),
        "pre-skip and the end granule trim the stream to exactly what was encoded"
    );
    assert_eq!(d.duration_ms, 1_000);
    assert_eq!(d.sample_count(), 16_000);
    let middle = &d.samples[2_000..14_000];
    assert!(
        (rms(middle) - 0.5 / 2f64.sqrt()).abs() < 0.03,
        "{}",
        rms(middle)
    );
    assert!((frequency_16k(middle) - 440.0).abs() < 5.0);
}

#[test]
fn an_encoder_input_rate_of_16_khz_still_decodes_at_48() {
    let d = decode(MONO_16K_OGG, Some("ogg"), None).unwrap();
    assert_eq!(
        (d.source_sample_rate, d.source_sample_count),
        (48_000, 48_000)
    );
    assert!((frequency_16k(&d.samples[2_000..14_000]) - 440.0).abs() < 5.0);
}

#[test]
fn webm_opus_decodes_like_the_ogg_one() {
    for (data, channels) in [(MONO_WEBM, 1), (STEREO_WEBM, 2)] {
        let d = decode(data, Some("audio/webm"), Some(48_000)).unwrap();
        assert_eq!(d.container, Container::Webm);
        assert_eq!(
            (d.source_sample_rate, d.source_channels),
            (48_000, channels)
        );
        assert!(
            (48_000..=48_000 + WEBM_PADDING_MAX).contains(&d.source_sample_count),
            "{}",
            d.source_sample_count
        );
    }
    let ogg = decode(MONO_OGG, None, None).unwrap();
    let webm = decode(MONO_WEBM, None, None).unwrap();
    // The same encoder output in two containers: the same samples where both have them.
    let n = 15_000;
    let worst = ogg.samples[..n]
        .iter()
        .zip(&webm.samples[..n])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 0.02, "{worst}");
}

#[test]
fn mp4_opus_reads_its_big_endian_header() {
    // A little-endian reading of dOps's pre-skip (312 = 0x0138) would drop 14,337 frames.
    let d = decode(MONO_MP4, Some("audio/mp4"), None).unwrap();
    assert_eq!(d.container, Container::M4a);
    assert!(
        (48_000..=48_000 + WEBM_PADDING_MAX).contains(&d.source_sample_count),
        "{}",
        d.source_sample_count
    );
    assert!((frequency_16k(&d.samples[2_000..14_000]) - 440.0).abs() < 5.0);
}

#[test]
fn stereo_opus_is_averaged_to_mono() {
    // Left 440 Hz at 0.4, right 880 Hz at 0.4: the mono mix has RMS sqrt(2 × (0.2 / sqrt 2)²).
    let d = decode(STEREO_WEBM, None, None).unwrap();
    let middle = &d.samples[2_000..14_000];
    assert!((rms(middle) - 0.2).abs() < 0.02, "{}", rms(middle));
}

#[test]
fn prepared_opus_is_16_khz_pcm() {
    let p = prepare(MONO_OGG, Some("oga"), None).unwrap();
    assert_eq!((p.sample_rate, p.sample_count), (16_000, 16_000));
    assert_eq!(p.pcm_s16le.len(), 32_000);
    assert_eq!(
        (p.source_sample_rate, p.source_sample_count),
        (48_000, 48_000)
    );
}

#[test]
fn a_corrupt_opus_packet_is_a_typed_error() {
    // Overwrite the TOC of a packet in the middle with code 3, frame count 0 (invalid, RFC 6716
    // §3.2.5): find the second audio page's first packet after its header.
    let mut data = MONO_OGG.to_vec();
    let pages: Vec<usize> = data
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"OggS")
        .map(|(i, _)| i)
        .collect();
    let page = pages[3];
    let segments = usize::from(data[page + 26]);
    let body = page + 27 + segments;
    data[body] = 0xFB;
    data[body + 1] = 0x00;
    // The page CRC no longer matches: the demuxer skips the page or the decoder refuses the
    // packet, either way a value or a typed error, never a panic.
    match decode(&data, None, None) {
        Ok(d) => assert!(d.source_sample_count < 48_000),
        Err(e) => assert!(
            matches!(e, AudioError::Decode { .. } | AudioError::Truncated),
            "{e:?}"
        ),
    }
}
