//! The benchmark's clusters: a constant, deterministic list of (name, topology, workload)
//! cases, 1 to 16 Macs, built from Apple's published chip figures and public model shapes.
//!
//! Free memory is what tb may allocate (memory less max(8 GiB, memory/8)) unless a case says
//! some of it is already in use. Links are Thunderbolt 5 with RDMA (80 Gb/s, 10 µs round trip)
//! unless a case says otherwise. Every pipeline case leaves strategy to `Pipeline`, because exo
//! and the brute force both place pipelines.

use std::collections::BTreeMap;

use tb_core::placement::{LinkInfo, Mac, ModelShape, Objective, Strategy, Topology, Workload};

const GIB: u64 = 1 << 30;
const GB: u64 = 1_000_000_000;

/// A Mac model: chip, unified memory, memory bandwidth, GPU cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chip {
    /// Mac Studio M3 Ultra 512 GB (819 GB/s, 80 GPU cores).
    Ultra512,
    /// Mac Studio M3 Ultra 256 GB (819 GB/s, 60 GPU cores).
    Ultra256,
    /// Mac Studio M2 Ultra 192 GB (800 GB/s, 76 GPU cores).
    M2Ultra192,
    /// MacBook Pro / Mac Studio M4 Max 128 GB (546 GB/s, 40 GPU cores).
    Max128,
    /// M4 Max 48 GB, binned (410 GB/s, 32 GPU cores).
    Max48,
    /// M4 Max 36 GB, binned (410 GB/s, 32 GPU cores).
    Max36,
    /// Mac mini M4 Pro 64 GB (273 GB/s, 20 GPU cores).
    Pro64,
    /// Mac mini M4 Pro 48 GB (273 GB/s, 16 GPU cores).
    Pro48,
}

impl Chip {
    /// Every chip, for the random clusters of the solve-time runs.
    pub const ALL: [Chip; 8] = [
        Chip::Ultra512,
        Chip::Ultra256,
        Chip::M2Ultra192,
        Chip::Max128,
        Chip::Max48,
        Chip::Max36,
        Chip::Pro64,
        Chip::Pro48,
    ];

    /// (chip name, memory GiB, bandwidth GB/s, GPU cores).
    fn spec(self) -> (&'static str, u64, f64, u32) {
        match self {
            Chip::Ultra512 => ("Apple M3 Ultra", 512, 819.0, 80),
            Chip::Ultra256 => ("Apple M3 Ultra", 256, 819.0, 60),
            Chip::M2Ultra192 => ("Apple M2 Ultra", 192, 800.0, 76),
            Chip::Max128 => ("Apple M4 Max", 128, 546.0, 40),
            Chip::Max48 => ("Apple M4 Max", 48, 410.0, 32),
            Chip::Max36 => ("Apple M4 Max", 36, 410.0, 32),
            Chip::Pro64 => ("Apple M4 Pro", 64, 273.0, 20),
            Chip::Pro48 => ("Apple M4 Pro", 48, 273.0, 16),
        }
    }

    /// Thunderbolt 5 ports: a Mac Studio has 6, a MacBook Pro or Mac mini 3.
    pub fn ports(self) -> usize {
        match self {
            Chip::Ultra512 | Chip::Ultra256 | Chip::M2Ultra192 => 6,
            _ => 3,
        }
    }

    /// Short label for tables: "M3U-512".
    pub fn short(self) -> &'static str {
        match self {
            Chip::Ultra512 => "M3U-512",
            Chip::Ultra256 => "M3U-256",
            Chip::M2Ultra192 => "M2U-192",
            Chip::Max128 => "M4Max-128",
            Chip::Max48 => "M4Max-48",
            Chip::Max36 => "M4Max-36",
            Chip::Pro64 => "M4Pro-64",
            Chip::Pro48 => "M4Pro-48",
        }
    }
}

/// Memory less what macOS keeps: max(8 GiB, memory/8).
pub fn allocatable(memory_bytes: u64) -> u64 {
    memory_bytes.saturating_sub((8 * GIB).max(memory_bytes / 8))
}

/// A Mac of this chip with all its allocatable memory free.
pub fn mac(name: &str, chip: Chip) -> Mac {
    let (chip_name, memory_gib, bandwidth, cores) = chip.spec();
    let alloc = allocatable(memory_gib * GIB);
    Mac {
        name: name.to_string(),
        chip: chip_name.to_string(),
        allocatable_bytes: alloc,
        free_bytes: alloc,
        memory_bandwidth_gbs: bandwidth,
        token_overhead_us: 0.0,
        engine_measured: false,
        gpu_cores: cores,
        labels: BTreeMap::new(),
        unavailable: None,
    }
}

/// A kind of cable between two Macs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cable {
    /// Thunderbolt 5 with RDMA: 80 Gb/s, 10 µs round trip.
    Tb5Rdma,
    /// Thunderbolt 4 with TCP: 40 Gb/s, 100 µs.
    Tb4Tcp,
    /// 10 Gb Ethernet with TCP: 10 Gb/s, 1000 µs.
    Ethernet10,
}

/// The link record for a cable between `a` and `b`.
pub fn link(a: &str, b: &str, cable: Cable) -> (String, String, LinkInfo) {
    let (bandwidth, latency, rdma, cables) = match cable {
        Cable::Tb5Rdma => (80.0, 10.0, true, 1),
        Cable::Tb4Tcp => (40.0, 100.0, false, 1),
        Cable::Ethernet10 => (10.0, 1000.0, false, 1),
    };
    let mut rdma_devices = BTreeMap::new();
    if rdma {
        for (end, other) in [(a, b), (b, a)] {
            rdma_devices.insert(end.to_string(), vec![format!("rdma_to_{other}")]);
        }
    }
    let info = LinkInfo {
        bandwidth_gbps: bandwidth,
        latency_us: latency,
        rdma,
        cables,
        measured: false,
        rdma_devices,
    };
    (a.to_string(), b.to_string(), info)
}

/// A model from public figures: total bytes, layers, and the attention shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Model {
    /// Llama-3.1-8B 8-bit: 8 GB, 32 layers, hidden 4096, 32 heads, 8 KV heads.
    Llama8BQ8,
    /// Llama-3.1-8B fp16: 16 GB, 32 layers, hidden 4096, 32 heads, 8 KV heads.
    Llama8B,
    /// Qwen3-32B bf16: 64 GB, 64 layers, hidden 5120, 64 heads, 8 KV heads.
    Qwen32B,
    /// Llama-3.3-70B 8-bit: 70 GB, 80 layers, hidden 8192, 64 heads, 8 KV heads.
    Llama70B8,
    /// Qwen3-235B-A22B 4-bit: 132 GB, 94 layers, hidden 4096, 64 heads, 4 KV heads.
    Qwen235B4,
    /// DeepSeek-V3 4-bit: 380 GB, 61 layers, hidden 7168, 128 heads, 128 KV heads.
    DeepSeekV3Q4,
    /// Kimi-K2 4-bit: 580 GB, 61 layers, hidden 7168, 64 heads, 64 KV heads.
    KimiK2Q4,
    /// DeepSeek-V3 8-bit: 700 GB, 61 layers, hidden 7168, 128 heads, 128 KV heads.
    DeepSeekV3Q8,
}

impl Model {
    /// The shape with this context (tokens) and batch reserved for the KV cache.
    pub fn shape(self, context: u32, batch: u32) -> ModelShape {
        // (name, total GB, layers, embedding+head GB, hidden, heads, kv heads, head dim)
        let (name, total_gb, layers, other_gb, hidden, heads, kv_heads, head_dim) = match self {
            Model::Llama8BQ8 => ("Llama-3.1-8B 8bit", 8.0, 32, 1.05, 4096, 32, 8, 128),
            Model::Llama8B => ("Llama-3.1-8B fp16", 16.0, 32, 2.1, 4096, 32, 8, 128),
            Model::Qwen32B => ("Qwen3-32B bf16", 64.0, 64, 3.1, 5120, 64, 8, 128),
            Model::Llama70B8 => ("Llama-3.3-70B 8bit", 70.0, 80, 2.1, 8192, 64, 8, 128),
            Model::Qwen235B4 => ("Qwen3-235B-A22B 4bit", 132.0, 94, 0.7, 4096, 64, 4, 128),
            Model::DeepSeekV3Q4 => ("DeepSeek-V3 4bit", 380.0, 61, 1.0, 7168, 128, 128, 128),
            Model::KimiK2Q4 => ("Kimi-K2 4bit", 580.0, 61, 1.3, 7168, 64, 64, 128),
            Model::DeepSeekV3Q8 => ("DeepSeek-V3 8bit", 700.0, 61, 2.1, 7168, 128, 128, 128),
        };
        let total = (total_gb * GB as f64) as u64;
        let other = (other_gb * GB as f64) as u64;
        ModelShape {
            name: name.to_string(),
            layers,
            bytes_per_layer: (total - other) / layers as u64,
            other_bytes: other,
            hidden_size: hidden,
            heads,
            kv_heads,
            head_dim,
            context,
            batch,
            ..ModelShape::default()
        }
    }
}

/// A pipeline workload with no node bounds or selector.
pub fn workload(model: ModelShape, objective: Objective) -> Workload {
    Workload {
        model,
        strategy: Strategy::Pipeline,
        objective,
        min_nodes: 1,
        max_nodes: None,
        node_selector: BTreeMap::new(),
    }
}

/// One benchmark case.
pub struct Case {
    pub name: &'static str,
    /// "mesh", "ring", "chain", "partial mesh", "star", ...
    pub shape: &'static str,
    /// What the case is there to show.
    pub note: &'static str,
    pub topology: Topology,
    pub workload: Workload,
}

impl Case {
    pub fn macs(&self) -> usize {
        self.topology.len()
    }

    /// "Llama-3.3-70B 8bit 8k×1".
    pub fn model_label(&self) -> String {
        let m = &self.workload.model;
        format!("{} {}k×{}", m.name, m.context / 1024, m.batch)
    }
}

/// Macs and cables, built up case by case.
#[derive(Default)]
struct Lab {
    macs: Vec<Mac>,
    links: Vec<(String, String, LinkInfo)>,
}

impl Lab {
    /// Macs named `{prefix}1..` of one chip.
    fn many(mut self, prefix: &str, chip: Chip, n: usize) -> Self {
        let start = self.macs.len();
        for i in 0..n {
            self.macs
                .push(mac(&format!("{prefix}{}", start + i + 1), chip));
        }
        self
    }

    fn one(mut self, name: &str, chip: Chip) -> Self {
        self.macs.push(mac(name, chip));
        self
    }

    /// The last Mac added has only this much free (the rest is used by other work).
    fn used(mut self, free_gib: u64) -> Self {
        if let Some(m) = self.macs.last_mut() {
            m.free_bytes = (free_gib * GIB).min(m.allocatable_bytes);
        }
        self
    }

    fn names(&self) -> Vec<String> {
        self.macs.iter().map(|m| m.name.clone()).collect()
    }

    fn cable(mut self, a: &str, b: &str, cable: Cable) -> Self {
        self.links.push(link(a, b, cable));
        self
    }

    fn mesh(mut self) -> Self {
        let names = self.names();
        for i in 0..names.len() {
            for j in i + 1..names.len() {
                self.links.push(link(&names[i], &names[j], Cable::Tb5Rdma));
            }
        }
        self
    }

    fn chain(mut self) -> Self {
        let names = self.names();
        for w in names.windows(2) {
            self.links.push(link(&w[0], &w[1], Cable::Tb5Rdma));
        }
        self
    }

    fn ring(self) -> Self {
        let names = self.names();
        let (first, last) = (names[0].clone(), names[names.len() - 1].clone());
        self.chain().cable(&last, &first, Cable::Tb5Rdma)
    }

    fn build(self) -> Topology {
        Topology::new(self.macs, self.links)
    }
}

fn case(
    name: &'static str,
    shape: &'static str,
    note: &'static str,
    lab: Lab,
    model: ModelShape,
    objective: Objective,
) -> Case {
    Case {
        name,
        shape,
        note,
        topology: lab.build(),
        workload: workload(model, objective),
    }
}

const K: u32 = 1024;

/// The benchmark suite: 27 cases.
pub fn cases() -> Vec<Case> {
    use Chip::*;
    use Model::*;
    use Objective::{Latency, Throughput};
    vec![
        case(
            "one-studio",
            "single",
            "one Mac holds it: nothing to split",
            Lab::default().one("s1", Ultra512),
            Qwen32B.shape(32 * K, 1),
            Latency,
        ),
        case(
            "fast-small-vs-slow-big",
            "pair",
            "exo takes the Mac with most memory (M4 Pro); the M4 Max is 1.5x faster",
            Lab::default()
                .one("max", Max48)
                .one("pro", Pro64)
                .cable("max", "pro", Cable::Tb5Rdma),
            Llama8B.shape(8 * K, 1),
            Latency,
        ),
        case(
            "fast-small-vs-slow-big-70b",
            "mesh",
            "a partly used fast M4 Max 128 beside slow M4 Pros",
            Lab::default()
                .one("max", Max128)
                .used(60)
                .many("pro", Pro64, 2)
                .mesh(),
            Llama70B8.shape(8 * K, 1),
            Latency,
        ),
        case(
            "mesh4-70b-latency",
            "mesh",
            "four M4 Pro minis; two hold it",
            Lab::default().many("mini", Pro64, 4).mesh(),
            Llama70B8.shape(8 * K, 1),
            Latency,
        ),
        case(
            "mesh4-70b-throughput",
            "mesh",
            "throughput, 8k × 4: more stages do not decode a batch faster (a stage reads its weights once per micro-batch)",
            Lab::default().many("mini", Pro64, 4).mesh(),
            Llama70B8.shape(8 * K, 4),
            Throughput,
        ),
        case(
            "llama8b-128k-batch4",
            "pair",
            "KV cache (64 GiB) overflows the one Mac exo picks",
            Lab::default()
                .one("max", Max36)
                .one("pro", Pro64)
                .cable("max", "pro", Cable::Tb5Rdma),
            Llama8B.shape(128 * K, 4),
            Latency,
        ),
        case(
            "llama8b-128k-batch8",
            "ring",
            "KV cache (128 GiB) overflows the one Mac exo picks",
            Lab::default()
                .many("max", Max128, 2)
                .one("pro1", Pro64)
                .ring(),
            Llama8B.shape(128 * K, 8),
            Throughput,
        ),
        case(
            "llama8b-q8-minis-128k",
            "pair",
            "an 8 GB model whose 48 GiB KV cache needs both minis",
            Lab::default()
                .many("mini", Pro48, 2)
                .cable("mini1", "mini2", Cable::Tb5Rdma),
            Llama8BQ8.shape(128 * K, 3),
            Throughput,
        ),
        case(
            "qwen32-3x36-throughput",
            "mesh",
            "three small M4 Max laptops, 8k × 4",
            Lab::default().many("mbp", Max36, 3).mesh(),
            Qwen32B.shape(8 * K, 4),
            Throughput,
        ),
        case(
            "qwen235-ring4",
            "ring",
            "one M3 Ultra 256 holds it",
            Lab::default()
                .many("studio", Ultra256, 2)
                .many("max", Max128, 2)
                .ring(),
            Qwen235B4.shape(32 * K, 4),
            Latency,
        ),
        case(
            "qwen235-slow-link",
            "ring + slow link",
            "exo's only cycle crosses the 10 GbE link; tb routes around it",
            Lab::default()
                .many("mini", Pro64, 4)
                .cable("mini1", "mini2", Cable::Tb5Rdma)
                .cable("mini2", "mini3", Cable::Tb5Rdma)
                .cable("mini3", "mini4", Cable::Tb5Rdma)
                .cable("mini4", "mini1", Cable::Ethernet10),
            Qwen235B4.shape(8 * K, 1),
            Latency,
        ),
        case(
            "qwen235-slow-link-tput",
            "ring + slow link",
            "the same ring, throughput objective, 8k × 4",
            Lab::default()
                .many("mini", Pro64, 4)
                .cable("mini1", "mini2", Cable::Tb5Rdma)
                .cable("mini2", "mini3", Cable::Tb5Rdma)
                .cable("mini3", "mini4", Cable::Tb5Rdma)
                .cable("mini4", "mini1", Cable::Ethernet10),
            Qwen235B4.shape(8 * K, 4),
            Throughput,
        ),
        case(
            "deepseek-kv-overflow",
            "mesh",
            "exo's 2 Macs hold the weights, not the 32k KV cache",
            Lab::default().many("studio", Ultra256, 3).mesh(),
            DeepSeekV3Q4.shape(32 * K, 1),
            Latency,
        ),
        case(
            "deepseek-m2-ring",
            "ring",
            "32k × 2 of KV cache needs all three Macs; exo picks one",
            Lab::default()
                .one("m3u", Ultra512)
                .many("m2u", M2Ultra192, 2)
                .ring(),
            DeepSeekV3Q4.shape(32 * K, 2),
            Throughput,
        ),
        case(
            "deepseek-used-studio",
            "mesh",
            "one Studio is mostly used by another job",
            Lab::default()
                .one("studio1", Ultra256)
                .one("studio2", Ultra256)
                .used(50)
                .one("studio3", Ultra256)
                .mesh(),
            DeepSeekV3Q4.shape(8 * K, 1),
            Latency,
        ),
        case(
            "deepseek8-two-cables",
            "2 cables",
            "two 512 GB Studios with two cables between them",
            Lab::default()
                .many("studio", Ultra512, 2)
                .cable("studio1", "studio2", Cable::Tb5Rdma)
                .cable("studio1", "studio2", Cable::Tb5Rdma),
            DeepSeekV3Q8.shape(8 * K, 2),
            Throughput,
        ),
        case(
            "deepseek8-128k-ring4",
            "ring",
            "128k context: KV (537 GB) needs a third Studio, exo takes two",
            Lab::default().many("studio", Ultra512, 4).ring(),
            DeepSeekV3Q8.shape(128 * K, 1),
            Latency,
        ),
        case(
            "kimi-chain3",
            "chain",
            "a daisy chain: no cycle of 3, exo finds no plan",
            Lab::default().many("studio", Ultra256, 3).chain(),
            KimiK2Q4.shape(8 * K, 1),
            Latency,
        ),
        case(
            "deepseek-chain5",
            "chain",
            "five M4 Max 128 in a chain: exo finds no cycle of 4",
            Lab::default().many("max", Max128, 5).chain(),
            DeepSeekV3Q4.shape(8 * K, 2),
            Throughput,
        ),
        case(
            "kimi-mesh4-ultra",
            "mesh",
            "four 256 GB Studios, 32k context",
            Lab::default().many("studio", Ultra256, 4).mesh(),
            KimiK2Q4.shape(32 * K, 1),
            Latency,
        ),
        case(
            "kimi-star5",
            "star",
            "a 512 GB hub cabled to four spokes",
            Lab::default()
                .one("hub", Ultra512)
                .one("max1", Max128)
                .one("max2", Max128)
                .one("pro1", Pro64)
                .one("pro2", Pro64)
                .cable("hub", "max1", Cable::Tb5Rdma)
                .cable("hub", "max2", Cable::Tb5Rdma)
                .cable("hub", "pro1", Cable::Tb5Rdma)
                .cable("hub", "pro2", Cable::Tb5Rdma),
            KimiK2Q4.shape(8 * K, 2),
            Throughput,
        ),
        case(
            "mixed6-partial-deepseek",
            "partial mesh",
            "six mixed Macs, 64k × 2, throughput",
            Lab::default()
                .one("u1", Ultra256)
                .one("u2", Ultra256)
                .one("m2", M2Ultra192)
                .one("x1", Max128)
                .one("x2", Max128)
                .one("p1", Pro64)
                .cable("u1", "u2", Cable::Tb5Rdma)
                .cable("u1", "m2", Cable::Tb5Rdma)
                .cable("u1", "x1", Cable::Tb5Rdma)
                .cable("u2", "x2", Cable::Tb5Rdma)
                .cable("u2", "m2", Cable::Tb5Rdma)
                .cable("m2", "p1", Cable::Tb5Rdma)
                .cable("x1", "x2", Cable::Tb4Tcp)
                .cable("x2", "p1", Cable::Tb5Rdma),
            DeepSeekV3Q4.shape(64 * K, 2),
            Throughput,
        ),
        case(
            "ring8-minis-70b",
            "ring",
            "eight Mac minis in a ring, latency",
            Lab::default().many("mini", Pro48, 8).ring(),
            Llama70B8.shape(32 * K, 1),
            Latency,
        ),
        case(
            "mesh8-mixed-kimi",
            "mesh",
            "eight mixed Macs fully meshed, throughput",
            Lab::default()
                .many("u", Ultra256, 2)
                .many("m", M2Ultra192, 2)
                .many("x", Max128, 2)
                .many("p", Pro64, 2)
                .mesh(),
            KimiK2Q4.shape(32 * K, 2),
            Throughput,
        ),
        case(
            "partial12-deepseek8",
            "partial mesh",
            "twelve Macs: above the exhaustive limit, tb's heuristic",
            partial_lab(12),
            DeepSeekV3Q8.shape(16 * K, 2),
            Throughput,
        ),
        case(
            "partial16-kimi",
            "partial mesh",
            "sixteen Macs, 64k context",
            partial_lab(16),
            KimiK2Q4.shape(64 * K, 1),
            Latency,
        ),
        case(
            "minis-nothing-fits",
            "mesh",
            "two 64 GB minis cannot hold DeepSeek: tb must refuse with a reason",
            Lab::default().many("mini", Pro64, 2).mesh(),
            DeepSeekV3Q4.shape(8 * K, 1),
            Latency,
        ),
        case(
            "studios-nothing-fits-kv",
            "mesh",
            "the weights fit three 256 GB Studios, the 64k × 2 KV cache does not",
            Lab::default().many("studio", Ultra256, 3).mesh(),
            DeepSeekV3Q4.shape(64 * K, 2),
            Throughput,
        ),
    ]
}

/// A fixed partial mesh of `n` mixed Macs: a ring, plus a chord from every third Mac to the
/// Mac halfway round, TB4 TCP on every fourth ring link.
fn partial_lab(n: usize) -> Lab {
    const MIX: [Chip; 8] = [
        Chip::Ultra512,
        Chip::Max128,
        Chip::Pro64,
        Chip::Ultra256,
        Chip::Max48,
        Chip::M2Ultra192,
        Chip::Pro48,
        Chip::Max36,
    ];
    let mut lab = Lab::default();
    for i in 0..n {
        lab = lab.one(&format!("n{:02}", i + 1), MIX[i % MIX.len()]);
    }
    let names = lab.names();
    for i in 0..n {
        let cable = if i % 4 == 3 {
            Cable::Tb4Tcp
        } else {
            Cable::Tb5Rdma
        };
        lab = lab.cable(&names[i], &names[(i + 1) % n], cable);
    }
    for i in (0..n / 2).step_by(3) {
        lab = lab.cable(&names[i], &names[i + n / 2], Cable::Tb5Rdma);
    }
    lab
}
