//! Latency statistics: exact percentiles of a small sample, and a fixed-size log-linear histogram
//! for the millions of samples of the fan-out figure.

use std::time::Duration;

/// Nearest-rank percentile (`q` in 0..=1) of samples sorted ascending; `None` when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p99 and max of a sample (sorted in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
}

impl Summary {
    pub fn of(samples: &mut [Duration]) -> Option<Self> {
        samples.sort_unstable();
        Some(Self {
            count: samples.len(),
            p50: percentile(samples, 0.50)?,
            p99: percentile(samples, 0.99)?,
            p999: percentile(samples, 0.999)?,
            max: *samples.last()?,
        })
    }
}

/// Sub-buckets per power of two: values are kept within 1/64 (about 1.6 %) of their size.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Powers of two covered above the linear range: up to 2^40 µs (about 12 days).
const GROUPS: usize = 40;

/// A histogram of microsecond values with bounded relative error and a fixed size (about
/// 20 KiB), cheap to record into from a hot loop and to merge.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; (GROUPS + 1) * SUB as usize],
            total: 0,
            max: 0,
        }
    }
}

impl Histogram {
    fn index(value: u64) -> usize {
        if value < SUB {
            return value as usize;
        }
        let group = (63 - value.leading_zeros()) - SUB_BITS + 1; // >= 1
        let sub = (value >> (group - 1)) - SUB; // 0..SUB
        let index = group as usize * SUB as usize + sub as usize;
        index.min((GROUPS + 1) * SUB as usize - 1)
    }

    /// The largest value that lands in bucket `index` (values are reported from above, so a
    /// percentile never understates).
    fn upper(index: usize) -> u64 {
        let (group, sub) = (index as u64 / SUB, index as u64 % SUB);
        if group == 0 {
            return sub;
        }
        ((SUB + sub + 1) << (group - 1)) - 1
    }

    pub fn record_micros(&mut self, micros: u64) {
        self.counts[Self::index(micros)] += 1;
        self.total += 1;
        self.max = self.max.max(micros);
    }

    pub fn record(&mut self, value: Duration) {
        self.record_micros(value.as_micros().min(u64::MAX as u128) as u64);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q`, from above within the bucket's precision; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Duration::from_micros(Self::upper(index).min(self.max)));
            }
        }
        Some(Duration::from_micros(self.max))
    }

    pub fn max(&self) -> Option<Duration> {
        (self.total > 0).then(|| Duration::from_micros(self.max))
    }
}

/// The median of some numbers (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    })
}

/// Smallest and largest of some numbers.
pub fn spread(values: &[f64]) -> Option<(f64, f64)> {
    let min = values.iter().copied().reduce(f64::min)?;
    let max = values.iter().copied().reduce(f64::max)?;
    Some((min, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nearest_rank_percentiles_pick_a_sample_that_was_seen() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let summary = Summary::of(&mut samples).unwrap();
        assert_eq!(summary.p50, ms(50));
        assert_eq!(summary.p99, ms(99));
        assert_eq!(summary.max, ms(100));
        assert_eq!(percentile(&[ms(7)], 0.99), Some(ms(7)));
        assert!(Summary::of(&mut []).is_none());
    }

    #[test]
    fn the_histogram_is_exact_below_64_microseconds_and_within_two_percent_above() {
        let mut h = Histogram::default();
        for v in 0..64 {
            h.record_micros(v);
        }
        assert_eq!(h.quantile(1.0), Some(Duration::from_micros(63)));
        for value in [64u64, 100, 1_000, 12_345, 999_999, 50_000_000] {
            let mut h = Histogram::default();
            h.record_micros(value);
            h.record_micros(value + 1);
            let got = h.quantile(0.5).unwrap().as_micros() as f64;
            assert!(got >= value as f64, "{value}: {got} understates");
            assert!(
                got <= value as f64 * 1.02 + 1.0,
                "{value}: {got} is too far above"
            );
        }
    }

    #[test]
    fn merged_histograms_answer_like_one_that_saw_every_sample() {
        let (mut a, mut b, mut all) = (
            Histogram::default(),
            Histogram::default(),
            Histogram::default(),
        );
        for v in 0..10_000u64 {
            let value = v * 37 % 20_000;
            if v % 2 == 0 { &mut a } else { &mut b }.record_micros(value);
            all.record_micros(value);
        }
        a.merge(&b);
        assert_eq!(a.count(), 10_000);
        for q in [0.5, 0.9, 0.99, 0.999] {
            assert_eq!(a.quantile(q), all.quantile(q));
        }
        assert_eq!(a.max(), all.max());
    }

    #[test]
    fn the_median_and_spread_of_runs_are_reported() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(spread(&[4.0, 1.0, 2.0]), Some((1.0, 4.0)));
        assert_eq!(median(&[]), None);
    }
}
