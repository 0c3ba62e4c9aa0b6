//! A small deterministic random number generator (SplitMix64) for everything training draws
//! from a seed: LoRA A initialisation, dropout masks, epoch shuffles and the eval split. It is
//! defined here, not taken from a crate, so a seed means the same numbers on every machine and
//! every version of tb.

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one named stream of `seed` (`parts` e.g. layer and target), so streams
    /// do not depend on the order they are drawn in.
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut s = Self::new(seed);
        let mut state = s.next_u64();
        for &p in parts {
            state = Self::new(state ^ p.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64();
        }
        s.state = state;
        s
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0), without modulo bias worth caring about for n << 2^64.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map(|_| SplitMix64::derive(7, &[1, 2]).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            SplitMix64::derive(7, &[1, 2]).next_u64(),
            SplitMix64::derive(7, &[2, 1]).next_u64()
        );
        let mut r = SplitMix64::new(1);
        for _ in 0..1000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            assert!(r.below(5) < 5);
        }
    }
}
