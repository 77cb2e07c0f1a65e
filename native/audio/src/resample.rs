//! Mono samples to 16 kHz with rubato's FFT resampler, fixed input chunk of 1024 frames (§7.3
//! step 4), fed packet by packet so that a long clip never holds its source-rate samples whole.
//!
//! The output is what rubato's `process_all` gives for the whole clip (the startup delay trimmed,
//! the tail flushed), cut to exactly `ceil(frames × 16000 / rate)` samples in integer arithmetic.

use audioadapter_buffers::direct::{InterleavedSlice, SequentialSliceOfVecs};
use rubato::{Fft, FixedSync, Indexing, Resampler};

use crate::error::AudioError;
use crate::pcm::resampled_len;
use crate::{MAX_SAMPLE_COUNT, MAX_SOURCE_RATE, RESAMPLE_CHUNK, TARGET_RATE};

/// Resampler calls in a row that may yield no output before the flush gives up.
const MAX_SILENT_CALLS: usize = MAX_SOURCE_RATE as usize / RESAMPLE_CHUNK + 16;

fn failed(e: impl std::fmt::Display) -> AudioError {
    AudioError::Resample {
        detail: e.to_string(),
    }
}

/// Collects mono samples at the source rate and hands back 16 kHz samples.
pub enum Mono16k {
    /// The source is already at 16 kHz: samples are kept as they are.
    Passthrough(Vec<f32>),
    /// Anything else goes through the FFT resampler.
    Fft(Box<Streaming>),
}

pub struct Streaming {
    resampler: Fft<f32>,
    /// Source samples not yet handed to the resampler (less than one chunk after each push).
    pending: Vec<f32>,
    /// One output chunk of scratch, reused.
    scratch: Vec<Vec<f32>>,
    out: Vec<f32>,
    /// Output frames still to drop at the start (the resampler's delay).
    to_trim: usize,
    rate: u32,
    frames_in: u64,
}

impl Mono16k {
    /// A collector for `rate` Hz input; `expected_frames` sizes the output (a hint only).
    pub fn new(rate: u32, expected_frames: Option<u64>) -> Result<Self, AudioError> {
        let hint = |r: u32| -> usize {
            expected_frames
                .and_then(|n| resampled_len(n, rate, r))
                .and_then(|n| usize::try_from(n).ok())
                // Capped at the longest clip; reserved, not touched, so a false claim costs
                // address space only.
                .map_or(0, |n| n.min(MAX_SAMPLE_COUNT as usize))
        };
        if rate == TARGET_RATE {
            return Ok(Self::Passthrough(Vec::with_capacity(hint(rate))));
        }
        let resampler = Fft::<f32>::new(
            rate as usize,
            TARGET_RATE as usize,
            RESAMPLE_CHUNK,
            1,
            FixedSync::Input,
        )
        .map_err(failed)?;
        let to_trim = resampler.output_delay();
        let scratch = vec![vec![0.0; resampler.output_frames_max()]];
        Ok(Self::Fft(Box::new(Streaming {
            pending: Vec::with_capacity(2 * RESAMPLE_CHUNK),
            scratch,
            out: Vec::with_capacity(hint(TARGET_RATE)),
            to_trim,
            resampler,
            rate,
            frames_in: 0,
        })))
    }

    /// Append source samples.
    pub fn push(&mut self, samples: &[f32]) -> Result<(), AudioError> {
        match self {
            Self::Passthrough(out) => {
                out.extend_from_slice(samples);
                Ok(())
            }
            Self::Fft(s) => s.push(samples),
        }
    }

    /// The 16 kHz samples of everything pushed.
    pub fn finish(self) -> Result<Vec<f32>, AudioError> {
        match self {
            Self::Passthrough(out) => Ok(out),
            Self::Fft(s) => s.finish(),
        }
    }
}

impl Streaming {
    fn push(&mut self, samples: &[f32]) -> Result<(), AudioError> {
        self.frames_in += samples.len() as u64;
        self.pending.extend_from_slice(samples);
        let mut start = 0;
        loop {
            let need = self.resampler.input_frames_next();
            if self.pending.len() - start < need {
                break;
            }
            // Split borrows: the chunk is read from `pending` while the rest of `self` changes.
            let pending = std::mem::take(&mut self.pending);
            let result = self.process(&pending[start..start + need], None);
            self.pending = pending;
            result?;
            start += need;
        }
        self.pending.drain(..start);
        Ok(())
    }

    /// One resampler call; `partial` is the number of valid frames of a short final chunk.
    fn process(&mut self, input: &[f32], partial: Option<usize>) -> Result<(), AudioError> {
        let frames_in = input.len();
        let buffer_in = InterleavedSlice::new(input, 1, frames_in).map_err(failed)?;
        let frames_out = self.scratch[0].len();
        let mut buffer_out =
            SequentialSliceOfVecs::new_mut(&mut self.scratch, 1, frames_out).map_err(failed)?;
        let indexing = Indexing {
            input_offset: 0,
            output_offset: 0,
            partial_len: partial,
            active_channels_mask: None,
        };
        let (_, written) = self
            .resampler
            .process_into_buffer(&buffer_in, &mut buffer_out, Some(&indexing))
            .map_err(failed)?;
        let skip = self.to_trim.min(written);
        self.to_trim -= skip;
        self.out.extend_from_slice(&self.scratch[0][skip..written]);
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<f32>, AudioError> {
        let expected = resampled_len(self.frames_in, self.rate, TARGET_RATE)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| failed("output length overflows"))?;
        let pending = std::mem::take(&mut self.pending);
        if !pending.is_empty() {
            let n = pending.len();
            self.process(&pending, Some(n))?;
        }
        // Flush with silence until the delayed tail is out. A call can yield nothing while the
        // resampler fills an FFT block; a block never exceeds one second of input (the block is a
        // multiple of rate / gcd(rate, 16000) <= 48,000 frames, 47 chunks), hence the bound.
        let mut guard = 0;
        while self.out.len() < expected {
            let before = self.out.len() + self.to_trim;
            self.process(&[], Some(0))?;
            guard = if self.out.len() + self.to_trim == before {
                guard + 1
            } else {
                0
            };
            if guard > MAX_SILENT_CALLS {
                return Err(failed("resampler produced no output"));
            }
        }
        self.out.truncate(expected);
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use audioadapter_buffers::direct::InterleavedSlice;

    fn sine(rate: u32, freq: f32, frames: usize) -> Vec<f32> {
        (0..frames)
            .map(|i| 0.5 * (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin())
            .collect()
    }

    fn resample(rate: u32, input: &[f32], packet: usize) -> Vec<f32> {
        let mut r = Mono16k::new(rate, Some(input.len() as u64)).unwrap();
        for chunk in input.chunks(packet.max(1)) {
            r.push(chunk).unwrap();
        }
        r.finish().unwrap()
    }

    #[test]
    fn exact_output_length() {
        for rate in [8_000u32, 11_025, 22_050, 32_000, 44_100, 47_999, 48_000] {
            for frames in [1usize, 17, 1023, 1024, 1025, 5_000, 44_101] {
                let out = resample(rate, &sine(rate, 440.0, frames), 577);
                let expected = resampled_len(frames as u64, rate, 16_000).unwrap() as usize;
                assert_eq!(out.len(), expected, "{frames} frames @ {rate}");
            }
        }
    }

    #[test]
    fn passthrough_at_16k() {
        let input = sine(16_000, 440.0, 3000);
        assert_eq!(resample(16_000, &input, 100), input);
    }

    #[test]
    fn streaming_matches_rubato_process_all() {
        for rate in [8_000u32, 44_100, 48_000] {
            let input = sine(rate, 300.0, 20_000);
            let mut whole =
                Fft::<f32>::new(rate as usize, 16_000, 1024, 1, FixedSync::Input).unwrap();
            let reference = whole
                .process_all(
                    &InterleavedSlice::new(&input, 1, input.len()).unwrap(),
                    input.len(),
                    None,
                )
                .unwrap()
                .take_data();
            for packet in [1usize, 333, 1024, 4096, 20_000] {
                let ours = resample(rate, &input, packet);
                let n = ours.len().min(reference.len());
                assert!(
                    n + 1 >= reference.len(),
                    "{rate}: {n} vs {}",
                    reference.len()
                );
                for (i, (a, b)) in ours[..n].iter().zip(&reference[..n]).enumerate() {
                    assert!(
                        (a - b).abs() < 1e-6,
                        "{rate}/{packet} sample {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_sine_keeps_its_frequency_and_level() {
        // 1 kHz at 44.1 kHz → 16 kHz: the resampled wave still crosses zero 2000 times a second.
        let out = resample(44_100, &sine(44_100, 1000.0, 44_100), 4096);
        assert_eq!(out.len(), 16_000);
        let body = &out[800..15_200];
        let crossings = body
            .windows(2)
            .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
            .count();
        assert!((1_790..=1_810).contains(&crossings), "{crossings}");
        let peak = body.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!((0.48..=0.52).contains(&peak), "{peak}");
    }

    #[test]
    fn empty_input() {
        assert!(resample(44_100, &[], 10).is_empty());
        assert!(resample(16_000, &[], 10).is_empty());
    }
}
