//! Apple silicon chips: memory bandwidth and GPU core counts, from Apple's published
//! specifications. Placement uses the bandwidth to predict decode speed (a token reads every
//! weight once, so time per token ≈ bytes of weights / memory bandwidth).

/// One configuration of a chip: its GPU core count and memory bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    pub gpu_cores: u32,
    pub bandwidth_gbps: f64,
}

const fn v(gpu_cores: u32, bandwidth_gbps: f64) -> Variant {
    Variant {
        gpu_cores,
        bandwidth_gbps,
    }
}

/// Chip name (without "Apple ") → its configurations, fewest GPU cores first. Bandwidth is in
/// GB/s (10^9 bytes per second) as Apple states it. Where bandwidth depends on the binning
/// (M3 Max, M4 Max), each variant carries its own figure.
const CHIPS: &[(&str, &[Variant])] = &[
    ("M1", &[v(7, 68.25), v(8, 68.25)]),
    ("M1 Pro", &[v(14, 200.0), v(16, 200.0)]),
    ("M1 Max", &[v(24, 400.0), v(32, 400.0)]),
    ("M1 Ultra", &[v(48, 800.0), v(64, 800.0)]),
    ("M2", &[v(8, 100.0), v(10, 100.0)]),
    ("M2 Pro", &[v(16, 200.0), v(19, 200.0)]),
    ("M2 Max", &[v(30, 400.0), v(38, 400.0)]),
    ("M2 Ultra", &[v(60, 800.0), v(76, 800.0)]),
    ("M3", &[v(8, 100.0), v(10, 100.0)]),
    ("M3 Pro", &[v(14, 150.0), v(18, 150.0)]),
    ("M3 Max", &[v(30, 300.0), v(40, 400.0)]),
    ("M3 Ultra", &[v(60, 819.0), v(80, 819.0)]),
    ("M4", &[v(8, 120.0), v(10, 120.0)]),
    ("M4 Pro", &[v(16, 273.0), v(20, 273.0)]),
    ("M4 Max", &[v(32, 410.0), v(40, 546.0)]),
    ("M5", &[v(10, 153.0)]),
];

/// The normalized table key for a chip string: "Apple M3 Ultra" → "M3 Ultra". Accepts the
/// brand string as macOS prints it, with or without "Apple", and ignores trailing words such as
/// "(Virtual)".
fn key(chip: &str) -> Option<String> {
    let mut words = chip.split_whitespace().skip_while(|w| !is_family(w));
    let family = words.next()?;
    match words.next() {
        Some(tier @ ("Pro" | "Max" | "Ultra")) => Some(format!("{family} {tier}")),
        _ => Some(family.to_string()),
    }
}

/// "M1", "M2", ... : an `M` followed by digits only.
fn is_family(word: &str) -> bool {
    word.strip_prefix('M')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The configurations of a chip, fewest GPU cores first; `None` for a chip not in the table
/// (including every non-Apple CPU).
pub fn variants(chip: &str) -> Option<&'static [Variant]> {
    let key = key(chip)?;
    CHIPS
        .iter()
        .find(|(name, _)| *name == key)
        .map(|(_, variants)| *variants)
}

/// The GPU core counts a chip ships with, e.g. `[60, 80]` for the M3 Ultra.
pub fn gpu_core_options(chip: &str) -> Option<Vec<u32>> {
    variants(chip).map(|vs| vs.iter().map(|v| v.gpu_cores).collect())
}

/// The memory bandwidth of a chip in GB/s. Where it depends on the GPU core count (M3 Max,
/// M4 Max) the count picks the variant: an exact match, else the largest variant with no more
/// cores than given; with no count known, the slowest variant (the safe guess for placement).
pub fn memory_bandwidth_gbps(chip: &str, gpu_cores: Option<u32>) -> Option<f64> {
    let variants = variants(chip)?;
    let slowest = variants
        .iter()
        .map(|v| v.bandwidth_gbps)
        .min_by(f64::total_cmp)?;
    let Some(cores) = gpu_cores else {
        return Some(slowest);
    };
    let chosen = variants
        .iter()
        .filter(|v| v.gpu_cores <= cores)
        .max_by_key(|v| v.gpu_cores)
        .map_or(slowest, |v| v.bandwidth_gbps);
    Some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_chip() {
        let cases: &[(&str, Option<u32>, f64)] = &[
            ("Apple M1", None, 68.25),
            ("Apple M1 Pro", None, 200.0),
            ("Apple M1 Max", None, 400.0),
            ("Apple M1 Ultra", Some(64), 800.0),
            ("Apple M2", None, 100.0),
            ("Apple M2 Pro", None, 200.0),
            ("Apple M2 Max", None, 400.0),
            ("Apple M2 Ultra", None, 800.0),
            ("Apple M3", None, 100.0),
            ("Apple M3 Pro", None, 150.0),
            ("Apple M3 Max", Some(30), 300.0),
            ("Apple M3 Max", Some(40), 400.0),
            ("Apple M3 Ultra", Some(80), 819.0),
            ("Apple M4", None, 120.0),
            ("Apple M4 Pro", Some(20), 273.0),
            ("Apple M4 Max", Some(32), 410.0),
            ("Apple M4 Max", Some(40), 546.0),
            ("Apple M5", None, 153.0),
        ];
        for &(chip, cores, want) in cases {
            assert_eq!(
                memory_bandwidth_gbps(chip, cores),
                Some(want),
                "{chip} {cores:?}"
            );
        }
    }

    #[test]
    fn binned_chips_without_a_core_count_get_the_slower_variant() {
        assert_eq!(memory_bandwidth_gbps("Apple M3 Max", None), Some(300.0));
        assert_eq!(memory_bandwidth_gbps("Apple M4 Max", None), Some(410.0));
        // A count between variants picks the largest variant it reaches.
        assert_eq!(memory_bandwidth_gbps("Apple M4 Max", Some(36)), Some(410.0));
        assert_eq!(memory_bandwidth_gbps("Apple M4 Max", Some(8)), Some(410.0));
    }

    #[test]
    fn names_are_normalized() {
        assert_eq!(memory_bandwidth_gbps("M4 Pro", None), Some(273.0));
        assert_eq!(
            memory_bandwidth_gbps("Apple M2 Ultra (Virtual)", None),
            Some(800.0)
        );
        assert_eq!(
            memory_bandwidth_gbps("  Apple   M3   Ultra ", None),
            Some(819.0)
        );
        assert_eq!(gpu_core_options("Apple M3 Ultra"), Some(vec![60, 80]));
    }

    #[test]
    fn unknown_chips() {
        assert_eq!(memory_bandwidth_gbps("AMD EPYC", None), None);
        assert_eq!(memory_bandwidth_gbps("Apple M9 Ultra", None), None);
        assert_eq!(memory_bandwidth_gbps("", Some(10)), None);
        assert_eq!(memory_bandwidth_gbps("Apple Mx", None), None);
        assert_eq!(variants("M"), None);
    }
}
