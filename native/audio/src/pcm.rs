//! Sample arithmetic: duration (§2.3), the frame cap, down-mixing and quantisation (§7.3 steps 4-5).

/// `ceil(frames × 1000 / rate)` computed as `(n div sr) × 1000 + ceil((n mod sr) × 1000 / sr)`
/// with checked arithmetic; None on overflow or a zero rate.
pub fn duration_ms(frames: u64, rate: u32) -> Option<u64> {
    let sr = u64::from(rate);
    if sr == 0 {
        return None;
    }
    let whole = (frames / sr).checked_mul(1000)?;
    let frac = (frames % sr).checked_mul(1000)?.div_ceil(sr);
    whole.checked_add(frac)
}

/// The most source frames a clip may have: `ceil(rate × max_ms / 1000)`.
pub fn max_frames(rate: u32, max_ms: u64) -> u64 {
    (u64::from(rate) * max_ms).div_ceil(1000)
}

/// The resampled length: `ceil(frames × to / from)` in exact integer arithmetic.
pub fn resampled_len(frames: u64, from: u32, to: u32) -> Option<u64> {
    let num = u128::from(frames) * u128::from(to);
    let len = num.div_ceil(u128::from(from).max(1));
    u64::try_from(len).ok()
}

/// A decoded sample made safe for the FFT: NaN becomes 0 and everything is clamped to [-1, 1]
/// (quantisation would clamp there anyway; an infinite or huge float sample would otherwise turn
/// a whole resampler block into NaN).
#[inline]
pub fn sanitise(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(-1.0, 1.0)
    }
}

/// Append one packet's planes to `mono`: one channel as is, two averaged (each sample sanitised).
pub fn downmix_into(planes: &[Vec<f32>], frames: usize, mono: &mut Vec<f32>) {
    match planes {
        [only] => mono.extend(only[..frames].iter().map(|x| sanitise(*x))),
        [left, right] => mono.extend(
            left[..frames]
                .iter()
                .zip(&right[..frames])
                .map(|(l, r)| (sanitise(*l) + sanitise(*r)) * 0.5),
        ),
        _ => {
            // Not reached: callers refuse other channel counts first. Averaging keeps it correct.
            let n = planes.len().max(1) as f32;
            mono.extend(
                (0..frames).map(|i| planes.iter().map(|p| sanitise(p[i])).sum::<f32>() / n),
            );
        }
    }
}

/// `downmix_into` for interleaved samples (libopus's output): the same averaging, so a stereo
/// Opus clip down-mixes exactly as a planar stereo one does.
pub fn downmix_interleaved_into(interleaved: &[f32], channels: usize, mono: &mut Vec<f32>) {
    match channels {
        1 => mono.extend(interleaved.iter().map(|x| sanitise(*x))),
        2 => mono.extend(
            interleaved
                .chunks_exact(2)
                .map(|lr| (sanitise(lr[0]) + sanitise(lr[1])) * 0.5),
        ),
        _ => {
            let n = channels.max(1);
            mono.extend(
                interleaved
                    .chunks_exact(n)
                    .map(|frame| frame.iter().map(|x| sanitise(*x)).sum::<f32>() / n as f32),
            );
        }
    }
}

/// One sample to i16: clamp to [-1, 1], × 32768, round half away from zero, clamp to the i16
/// range (+1.0 becomes 32767). NaN becomes 0.
#[inline]
pub fn quantise_sample(x: f32) -> i16 {
    if x.is_nan() {
        return 0;
    }
    let scaled = (x.clamp(-1.0, 1.0) * 32768.0).round();
    scaled.clamp(-32768.0, 32767.0) as i16
}

/// Write `samples` as little-endian i16 into `out`, which must be exactly twice as long
/// (a shorter or longer `out` is a caller bug and panics).
pub fn quantise_into(samples: &[f32], out: &mut [u8]) {
    assert_eq!(
        out.len(),
        samples.len() * 2,
        "output must hold 2 bytes per sample"
    );
    for (dst, &x) in out.chunks_exact_mut(2).zip(samples) {
        dst.copy_from_slice(&quantise_sample(x).to_le_bytes());
    }
}

/// `quantise_into` into a new vector.
pub fn quantise(samples: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(samples.len() * 2);
    for &x in samples {
        out.extend_from_slice(&quantise_sample(x).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_examples_of_section_2_3() {
        assert_eq!(duration_ms(1, 16_000), Some(1));
        assert_eq!(duration_ms(1600, 16_000), Some(100));
        assert_eq!(duration_ms(1601, 16_000), Some(101));
        assert_eq!(duration_ms(16_000, 16_000), Some(1000));
        assert_eq!(duration_ms(16_001, 16_000), Some(1001));
        assert_eq!(duration_ms(0, 16_000), Some(0));
        assert_eq!(duration_ms(44_100, 44_100), Some(1000));
        assert_eq!(duration_ms(1, 44_100), Some(1));
        assert_eq!(duration_ms(441, 44_100), Some(10));
        assert_eq!(duration_ms(442, 44_100), Some(11));
        assert_eq!(duration_ms(48_000 * 720, 48_000), Some(720_000));
        assert_eq!(duration_ms(48_000 * 720 + 1, 48_000), Some(720_001));
    }

    #[test]
    fn duration_is_checked() {
        assert_eq!(duration_ms(5, 0), None);
        assert_eq!(duration_ms(u64::MAX, 1), None); // whole × 1000 overflows
                                                    // The largest frame count whose whole part still fits: no overflow, no wrap.
        let n = u64::MAX / 1000;
        assert_eq!(duration_ms(n, 1), Some(n * 1000));
        // (n mod sr) × 1000 never overflows for a u32 rate, and the sum is checked.
        assert_eq!(
            duration_ms(u64::MAX, u32::MAX),
            (u64::MAX / u64::from(u32::MAX))
                .checked_mul(1000)
                .and_then(|w| w.checked_add(0))
        );
    }

    #[test]
    fn duration_matches_exact_ceiling() {
        for rate in [8_000u32, 11_025, 16_000, 22_050, 44_100, 47_999, 48_000] {
            for frames in [1u64, 2, 7, 999, 1000, 1001, 12_345, 1_000_003] {
                let exact = (u128::from(frames) * 1000).div_ceil(u128::from(rate)) as u64;
                assert_eq!(duration_ms(frames, rate), Some(exact), "{frames} @ {rate}");
            }
        }
    }

    #[test]
    fn frame_cap() {
        assert_eq!(max_frames(16_000, 720_000), 11_520_000);
        assert_eq!(max_frames(44_100, 720_000), 31_752_000);
        assert_eq!(max_frames(8_000, 1), 8);
        assert_eq!(max_frames(44_100, 1), 45); // 44.1 rounded up
                                               // Every clip within the cap lasts at most max_ms.
        for rate in [8_000u32, 11_025, 44_100, 47_999] {
            assert!(duration_ms(max_frames(rate, 720_000), rate).unwrap() <= 720_000);
        }
    }

    #[test]
    fn resampled_lengths() {
        assert_eq!(resampled_len(8_000, 8_000, 16_000), Some(16_000));
        assert_eq!(resampled_len(44_100, 44_100, 16_000), Some(16_000));
        assert_eq!(resampled_len(1, 44_100, 16_000), Some(1));
        assert_eq!(resampled_len(441_000, 44_100, 16_000), Some(160_000));
        assert_eq!(resampled_len(441_001, 44_100, 16_000), Some(160_001));
        assert_eq!(resampled_len(0, 48_000, 16_000), Some(0));
    }

    #[test]
    fn quantisation() {
        assert_eq!(quantise_sample(0.0), 0);
        assert_eq!(quantise_sample(1.0), 32767);
        assert_eq!(quantise_sample(2.5), 32767);
        assert_eq!(quantise_sample(-1.0), -32768);
        assert_eq!(quantise_sample(-7.0), -32768);
        assert_eq!(quantise_sample(0.5), 16384);
        assert_eq!(quantise_sample(-0.5), -16384);
        assert_eq!(quantise_sample(1.5 / 32768.0), 2); // half rounds away from zero
        assert_eq!(quantise_sample(-1.5 / 32768.0), -2);
        assert_eq!(quantise_sample(f32::NAN), 0);
        assert_eq!(quantise_sample(f32::INFINITY), 32767);
        assert_eq!(quantise_sample(f32::NEG_INFINITY), -32768);
        // Every i16 survives the round trip through its f32 value.
        for v in i16::MIN..=i16::MAX {
            assert_eq!(quantise_sample(f32::from(v) / 32768.0), v);
        }
    }

    #[test]
    fn quantise_is_little_endian_and_fills_everything() {
        let samples = [0.0, 1.0, -1.0, 0.25];
        let bytes = quantise(&samples);
        assert_eq!(bytes, [0, 0, 0xFF, 0x7F, 0x00, 0x80, 0x00, 0x20]);
        let mut out = vec![0xAAu8; 8];
        quantise_into(&samples, &mut out);
        assert_eq!(out, bytes);
    }

    #[test]
    fn sanitising() {
        assert_eq!(sanitise(f32::NAN), 0.0);
        assert_eq!(sanitise(f32::INFINITY), 1.0);
        assert_eq!(sanitise(-1e38), -1.0);
        assert_eq!(sanitise(0.25), 0.25);
        let mut mono = Vec::new();
        downmix_into(
            &[vec![f32::NAN, 3.0], vec![1.0, f32::NEG_INFINITY]],
            2,
            &mut mono,
        );
        assert_eq!(mono, [0.5, 0.0]);
    }

    #[test]
    fn downmix() {
        let mut mono = Vec::new();
        downmix_into(&[vec![0.5, -0.5, 0.25]], 2, &mut mono);
        assert_eq!(mono, [0.5, -0.5]);
        mono.clear();
        downmix_into(&[vec![0.5, 1.0, 0.3], vec![-0.5, 0.0, 0.1]], 3, &mut mono);
        assert_eq!(mono, [0.0, 0.5, 0.2]);
        mono.clear();
        downmix_into(&[vec![0.3; 4], vec![0.6; 4], vec![0.9; 4]], 4, &mut mono);
        assert!(mono.iter().all(|x| (x - 0.6).abs() < 1e-6));
    }
}
