//! Latency percentiles from a sorted vector of samples (exact, no bucketing).

use std::time::Duration;

/// Sorted latencies of successful writes.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    sorted: Vec<Duration>,
}

impl Latencies {
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Latencies { sorted: samples }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `q`-quantile (0.0..=1.0) by the nearest-rank method; `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.sorted.is_empty() {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.sorted.len() as f64).ceil() as usize;
        Some(self.sorted[rank.clamp(1, self.sorted.len()) - 1])
    }

    pub fn max(&self) -> Option<Duration> {
        self.sorted.last().copied()
    }
}

/// The median of a few durations (the lower middle one for an even count).
pub fn median(values: &[Duration]) -> Option<Duration> {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.get(v.len().checked_sub(1)? / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn nearest_rank_quantiles() {
        let l = Latencies::new((1..=100).rev().map(ms).collect());
        assert_eq!(l.quantile(0.5), Some(ms(50)));
        assert_eq!(l.quantile(0.99), Some(ms(99)));
        assert_eq!(l.quantile(1.0), Some(ms(100)));
        assert_eq!(l.quantile(0.0), Some(ms(1)));
        assert_eq!(Latencies::default().quantile(0.5), None);
    }

    #[test]
    fn median_of_three() {
        assert_eq!(median(&[ms(900), ms(300), ms(600)]), Some(ms(600)));
        assert_eq!(median(&[]), None);
    }
}
