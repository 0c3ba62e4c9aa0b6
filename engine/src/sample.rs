//! Sampling: greedy or temperature + top-p over logits, deterministic for a seed (a SplitMix64
//! generator, so results do not change with a dependency upgrade), and [`StopMatcher`], which
//! finds stop strings in streamed text without emitting a partial stop prefix.

use serde::{Deserialize, Serialize};

/// How to pick tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probability sums to top_p (1 = all).
    pub top_p: f32,
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops before the first occurrence of any of these strings.
    pub stop: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            max_tokens: 256,
            stop: Vec::new(),
        }
    }
}

/// Picks the next token from logits.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    state: u64,
}

/// Index of the largest value; ties (and NaN-free equal maxima) go to the lowest index.
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes the compiler vectorises (lane-wise maxima, then the first index holding the
    // maximum) instead of one with a branch per value: a batch of 8 over a 49,152-token
    // vocabulary spent ~2 % of a decode step here, on the thread the kernels' workers wait for.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            // NaN compares false, so it never becomes the maximum.
            *m = if v > *m { v } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Self {
        Self {
            temperature: params.temperature,
            top_p: params.top_p,
            state: params.seed,
        }
    }

    fn next_f64(&mut self) -> f64 {
        // SplitMix64.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.temperature <= 0.0 || !self.temperature.is_finite() || logits.is_empty() {
            return argmax(logits);
        }
        let t = f64::from(self.temperature);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, (f64::from(l - max) / t).exp()))
            .filter(|(_, p)| *p > 0.0 && p.is_finite())
            .collect();
        if probs.is_empty() {
            return argmax(logits);
        }
        // Most likely first; ties by lowest id, so the order is deterministic.
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f64 = probs.iter().map(|p| p.1).sum();
        let top_p = if self.top_p > 0.0 && self.top_p < 1.0 {
            f64::from(self.top_p)
        } else {
            1.0
        };
        let mut kept = 0;
        let mut mass = 0.0;
        for (_, p) in &probs {
            kept += 1;
            mass += p / total;
            if mass >= top_p {
                break;
            }
        }
        probs.truncate(kept);
        let kept_total: f64 = probs.iter().map(|p| p.1).sum();
        let mut r = self.next_f64() * kept_total;
        for (id, p) in &probs {
            if r < *p {
                return *id;
            }
            r -= p;
        }
        probs.last().map_or(0, |p| p.0)
    }
}

/// Finds stop strings in text that arrives piece by piece.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

/// What [`StopMatcher::push`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopCheck {
    /// Text safe to emit now.
    pub text: String,
    /// A stop string was found; nothing after it will be emitted.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds text; returns what can be emitted (text that cannot be the start of a stop string)
    /// and whether a stop string was found.
    pub fn push(&mut self, piece: &str) -> StopCheck {
        if self.stopped {
            return StopCheck {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(piece);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.stopped = true;
            let text = self.held[..at].to_string();
            self.held.clear();
            return StopCheck {
                text,
                stopped: true,
            };
        }
        // Hold back the longest suffix of `held` that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.held.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let split = self.held.len() - keep;
        let text = self.held[..split].to_string();
        self.held.replace_range(..split, "");
        StopCheck {
            text,
            stopped: false,
        }
    }

    /// Text held back at the end of generation (no stop string followed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first index of the greatest value, one branch per value (what `argmax` computes).
    fn argmax_scalar(logits: &[f32]) -> u32 {
        let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
        for (i, &v) in logits.iter().enumerate() {
            if v > best_v {
                (best, best_v) = (i, v);
            }
        }
        best as u32
    }

    #[test]
    fn argmax_is_the_first_greatest_value_whatever_the_length() {
        let mut cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN; 40],
            vec![f32::NEG_INFINITY; 33],
            vec![f32::NAN, f32::NEG_INFINITY, 1.0],
            vec![-0.0, 0.0],
            vec![0.0, -0.0],
        ];
        for len in [1, 15, 16, 17, 31, 32, 100, 49152] {
            let v: Vec<f32> = (0..len)
                .map(|i| ((i * 7919 + len) % 613) as f32 / 61.0 - 5.0)
                .collect();
            // The greatest value twice (a tie), a NaN before it, an infinity after a copy.
            let mut tied = v.clone();
            tied[len / 3] = 50.0;
            tied[len - 1] = 50.0;
            tied[len / 5] = f32::NAN;
            let mut infinite = v.clone();
            infinite[len / 2] = f32::INFINITY;
            cases.extend([v, tied, infinite]);
        }
        for (n, c) in cases.iter().enumerate() {
            assert_eq!(argmax(c), argmax_scalar(c), "case {n}: {} values", c.len());
        }
    }

    #[test]
    fn greedy_ties_lowest() {
        let mut s = Sampler::new(&SamplingParams::default());
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    #[test]
    fn seeded_is_deterministic() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: 42,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let a: Vec<u32> = {
            let mut s = Sampler::new(&p);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(&p);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().any(|&x| x != a[0]), "sampling should vary: {a:?}");
    }

    #[test]
    fn top_p_tiny_is_greedy() {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.01,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(&p);
        for _ in 0..10 {
            assert_eq!(s.sample(&[0.0, 5.0, 1.0]), 1);
        }
    }

    #[test]
    fn stop_across_pieces() {
        let mut m = StopMatcher::new(&["</end>".to_string()]);
        let mut out = String::new();
        for piece in ["hello <", "/e", "nd> world"] {
            let c = m.push(piece);
            out.push_str(&c.text);
            if c.stopped {
                break;
            }
        }
        assert_eq!(out, "hello ");
        assert!(m.stopped());
    }

    #[test]
    fn partial_prefix_released() {
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("ab ST").text, "ab ");
        assert_eq!(m.push("ring").text, "STring");
        assert_eq!(m.push("S").text, "");
        assert_eq!(m.finish(), "S");
    }
}
