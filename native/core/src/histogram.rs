//! An explicit-bucket histogram (count, sum, min, max, bucket counts over fixed upper bounds), the
//! registry's per-batch recording without a Python object per value (`telemetry.registry`).
//!
//! Bucket `i` holds values in `(bounds[i-1], bounds[i]]`; the last one everything above the last
//! bound, and a NaN the first, as Python's `bisect_left` places them (the twin).

/// The histogram's state.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    buckets: Vec<u64>,
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

/// Bounds that are not strictly increasing.
#[derive(Debug, PartialEq, Eq)]
pub struct BadBounds;

impl Histogram {
    pub fn new(bounds: Vec<f64>) -> Result<Self, BadBounds> {
        if bounds.windows(2).any(|w| w[0] >= w[1]) || bounds.iter().any(|b| b.is_nan()) {
            return Err(BadBounds);
        }
        let buckets = vec![0; bounds.len() + 1];
        Ok(Self {
            bounds,
            buckets,
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        })
    }

    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    pub fn buckets(&self) -> &[u64] {
        &self.buckets
    }

    /// The bucket of `value`: the first bound not below it.
    pub fn bucket_of(&self, value: f64) -> usize {
        self.bounds.partition_point(|b| *b < value)
    }

    /// Whether bucket `i` is `value`'s (what `bucket_of` would find, NaN included).
    fn holds(&self, i: usize, value: f64) -> bool {
        (i == 0 || self.bounds[i - 1] < value)
            && (i == self.bounds.len() || self.bounds[i] >= value)
    }

    /// `n` observations of one value.
    pub fn record_n(&mut self, value: f64, n: u64) {
        if n == 0 {
            return;
        }
        let i = self.bucket_of(value);
        self.buckets[i] += n;
        self.count += n;
        self.sum += value * n as f64;
        if value < self.min {
            self.min = value;
        }
        if value > self.max {
            self.max = value;
        }
    }

    /// One observation per value; the batch's sum is added once (its own sum first, as the twin's
    /// `math.fsum` of the batch is).
    pub fn record_many(&mut self, values: impl IntoIterator<Item = f64>) {
        let mut batch = 0.0;
        let mut n = 0u64;
        // A batch's values are often equal or close (one pull's arrival time, one batch's ages):
        // the previous value's bucket is checked before searching the bounds.
        let mut last = usize::MAX;
        for value in values {
            let i = if last != usize::MAX && self.holds(last, value) {
                last
            } else {
                self.bucket_of(value)
            };
            last = i;
            self.buckets[i] += 1;
            n += 1;
            batch += value;
            if value < self.min {
                self.min = value;
            }
            if value > self.max {
                self.max = value;
            }
        }
        self.count += n;
        self.sum += batch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_is_not_below_them() {
        let mut h = Histogram::new(vec![1.0, 2.0, 4.0]).unwrap();
        h.record_many([0.5, 1.0, 1.5, 4.0, 9.0, f64::NAN]);
        assert_eq!(h.buckets(), &[3, 1, 1, 1]); // NaN in the first, as bisect_left puts it
        assert_eq!((h.count, h.min, h.max), (6, 0.5, 9.0));
        assert!(h.sum.is_nan());
        h = Histogram::new(vec![1.0]).unwrap();
        h.record_n(3.0, 4);
        h.record_n(0.0, 0);
        assert_eq!((h.buckets(), h.count, h.sum), (&[0, 4][..], 4, 12.0));
    }

    #[test]
    fn a_batch_lands_where_its_values_land_one_by_one() {
        // Runs of equal values, neighbours across every bound, the bounds themselves, infinities
        // and NaN, in many orders: the previous value's bucket is reused only where it is theirs.
        let bounds = vec![-1.0, 0.0, 0.5, 1.0, 2.0, 4.0];
        let mut pool: Vec<f64> = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -2.0, 9.0];
        for b in &bounds {
            pool.extend([*b, b - 1e-9, b + 1e-9]);
        }
        let mut seed = 7u64;
        for round in 0..400 {
            let mut values = Vec::new();
            for _ in 0..(round % 23) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = pool[(seed >> 33) as usize % pool.len()];
                values.extend(std::iter::repeat_n(v, 1 + (seed >> 60) as usize % 3));
            }
            let mut batch = Histogram::new(bounds.clone()).unwrap();
            let mut single = Histogram::new(bounds.clone()).unwrap();
            batch.record_many(values.iter().copied());
            for v in &values {
                single.record_n(*v, 1);
            }
            assert_eq!(batch.buckets(), single.buckets(), "{values:?}");
            assert_eq!(
                (batch.count, batch.min, batch.max),
                (single.count, single.min, single.max)
            );
        }
    }

    #[test]
    fn bounds_must_increase() {
        assert_eq!(Histogram::new(vec![1.0, 1.0]), Err(BadBounds));
        assert_eq!(Histogram::new(vec![2.0, 1.0]), Err(BadBounds));
        assert!(Histogram::new(vec![]).is_ok());
    }
}
