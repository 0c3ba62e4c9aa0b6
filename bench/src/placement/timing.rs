//! How long tb's `plan` takes: random but seeded clusters of mixed Macs in a partial mesh
//! (a chain for connectivity, then random cables up to each Mac's Thunderbolt ports), with a
//! model that needs several of them; the median of several runs per size.

use std::time::Instant;

use tb_core::placement::{LinkInfo, Objective, Options, Topology, Workload, plan};

use super::suite::{Cable, Chip, Model, link, mac, workload};

/// Targets from the brief: ≤ 10 ms at 8 Macs, ≤ 1 s at 64.
pub fn target_ms(macs: usize) -> Option<f64> {
    match macs {
        8 => Some(10.0),
        64 => Some(1000.0),
        _ => None,
    }
}

/// One size's measurement.
#[derive(Debug, Clone)]
pub struct SolveTime {
    pub macs: usize,
    pub model: String,
    pub runs: usize,
    pub median_ms: f64,
    pub max_ms: f64,
    /// "placed on 5 Macs, 41.2 tok/s" or the refusal.
    pub outcome: String,
    pub target_ms: Option<f64>,
}

impl SolveTime {
    pub fn missed(&self) -> bool {
        self.target_ms.is_some_and(|t| self.median_ms > t)
    }
}

/// SplitMix64: a small, seeded generator, so the clusters are the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A random cluster of `n` Macs and the largest model (with its KV cache for 2 sequences)
/// that half its free memory holds; the throughput objective.
pub fn random_cluster(n: usize, seed: u64) -> (Topology, Workload) {
    let mut rng = Rng::new(seed);
    let chips: Vec<Chip> = (0..n)
        .map(|_| Chip::ALL[rng.below(Chip::ALL.len())])
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("mac{i:02}")).collect();
    let macs: Vec<_> = names.iter().zip(&chips).map(|(m, &c)| mac(m, c)).collect();
    let mut cables = Cables {
        used: vec![0; n],
        cabled: vec![vec![false; n]; n],
        links: Vec::new(),
    };
    for i in 1..n {
        cables.add(&names, i - 1, i, &mut rng);
    }
    for _ in 0..2 * n {
        let (a, b) = (rng.below(n), rng.below(n));
        if a == b
            || cables.cabled[a][b]
            || cables.used[a] >= chips[a].ports()
            || cables.used[b] >= chips[b].ports()
        {
            continue;
        }
        cables.add(&names, a, b, &mut rng);
    }
    let links = cables.links;
    let free: u64 = macs.iter().map(|m| m.free_bytes).sum();
    let candidates = [
        (Model::Llama70B8, 8 * 1024),
        (Model::Qwen235B4, 32 * 1024),
        (Model::DeepSeekV3Q4, 8 * 1024),
        (Model::KimiK2Q4, 16 * 1024),
        (Model::DeepSeekV3Q8, 32 * 1024),
    ];
    let mut shape = candidates[0].0.shape(candidates[0].1, 2);
    for (m, ctx) in candidates {
        let s = m.shape(ctx, 2);
        if s.weight_bytes() + s.kv_bytes() <= free / 2 {
            shape = s;
        }
    }
    (
        Topology::new(macs, links),
        workload(shape, Objective::Throughput),
    )
}

/// The cables of a random cluster as they are laid.
struct Cables {
    used: Vec<usize>,
    cabled: Vec<Vec<bool>>,
    links: Vec<(String, String, LinkInfo)>,
}

impl Cables {
    /// Cables `a`–`b`: Thunderbolt 5 with RDMA, one time in five Thunderbolt 4 with TCP.
    fn add(&mut self, names: &[String], a: usize, b: usize, rng: &mut Rng) {
        let kind = if rng.below(5) == 0 {
            Cable::Tb4Tcp
        } else {
            Cable::Tb5Rdma
        };
        self.links.push(link(&names[a], &names[b], kind));
        self.used[a] += 1;
        self.used[b] += 1;
        self.cabled[a][b] = true;
        self.cabled[b][a] = true;
    }
}

/// Median (and max) of `runs` calls of `plan` on a random cluster of each size.
pub fn measure(sizes: &[usize], runs: usize) -> Vec<SolveTime> {
    let options = Options::default();
    sizes
        .iter()
        .map(|&n| {
            let (topology, workload) = random_cluster(n, 0x7b_0000 + n as u64);
            let mut times = Vec::with_capacity(runs);
            let mut outcome = String::new();
            for _ in 0..runs.max(1) {
                let start = Instant::now();
                let result = plan(&topology, &workload, &options);
                times.push(start.elapsed().as_secs_f64() * 1e3);
                outcome = match result {
                    Ok(p) => format!(
                        "placed on {} Macs, {:.1} tok/s",
                        p.stages.len(),
                        p.tokens_per_second
                    ),
                    Err(e) => format!("refused: {}", e.message),
                };
            }
            times.sort_by(f64::total_cmp);
            SolveTime {
                macs: n,
                model: workload.model.name.clone(),
                runs: times.len(),
                median_ms: times[times.len() / 2],
                max_ms: times[times.len() - 1],
                outcome,
                target_ms: target_ms(n),
            }
        })
        .collect()
}
