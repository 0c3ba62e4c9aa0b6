//! tb-fuzz: fuzzing of every tb parser that takes outside input, on stable Rust (no libFuzzer).
//! [`targets`] are plain functions of bytes; [`run`] drives one with mutations of its corpus
//! (`fuzz/corpus/TARGET/`) for a number of seconds, catching panics and measuring every
//! execution's allocations with the counting allocator of [`alloc`]; the replay test
//! (`cargo test -p tb-fuzz`) runs every corpus file and every saved finding
//! (`fuzz/regressions/TARGET/`) through its target, so CI checks them on every build.

pub mod alloc;
pub mod mutate;
pub mod seeds;
pub mod targets;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mutate::{Rng, mutate};
use targets::Target;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// An execution slower than this is a finding (a parser must answer hostile input promptly).
pub const SLOW: Duration = Duration::from_secs(2);

/// The fuzz/ directory (corpus, regressions).
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The files of `dir`, sorted (none when it does not exist).
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// What went wrong on one input.
#[derive(Debug, Clone)]
pub enum Failure {
    Panic(String),
    Memory(String),
    Slow(Duration),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Panic(m) => write!(f, "panic: {m}"),
            Failure::Memory(m) => write!(f, "unbounded allocation: {m}"),
            Failure::Slow(d) => write!(f, "slow: {d:?} for one input"),
        }
    }
}

/// Runs `target` on `data` once: its outcome, or why the input is a finding.
pub fn execute(target: Target, data: &[u8]) -> Result<String, Failure> {
    let started = Instant::now();
    IN_TARGET.with(|t| t.set(true));
    let (result, usage) = alloc::measure(|| catch_unwind(AssertUnwindSafe(|| target(data))));
    IN_TARGET.with(|t| t.set(false));
    let outcome = result.map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(not a string)".into());
        Failure::Panic(msg)
    })?;
    if let Some(why) = usage.excess() {
        return Err(Failure::Memory(why));
    }
    let took = started.elapsed();
    if took > SLOW {
        return Err(Failure::Slow(took));
    }
    Ok(outcome)
}

thread_local! {
    /// Whether this thread is inside a target (whose panics are findings, reported once).
    static IN_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Silences the default panic message inside targets (a finding is reported once, by the
/// driver), keeping the location for the report; other panics are reported as usual.
pub fn quiet_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !IN_TARGET.with(|t| t.get()) {
            default(info);
            return;
        }
        if let Some(loc) = info.location() {
            *LAST_PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) =
                format!("{}:{}", loc.file(), loc.line());
        }
    }));
}

/// Where the last panic happened (`file:line`).
pub static LAST_PANIC_AT: Mutex<String> = Mutex::new(String::new());

/// The input being executed, saved by [`save_on_abort`] when the system refuses an allocation.
static CURRENT: Mutex<Option<(PathBuf, Vec<u8>)>> = Mutex::new(None);

fn save_on_abort(size: usize) {
    if let Ok(Some((dir, data))) = CURRENT.try_lock().map(|c| c.clone()) {
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("oom-{:016x}", hash(&data)));
        let _ = std::fs::write(&path, &data);
        eprintln!(
            "allocation of {size} bytes refused; input saved to {}",
            path.display()
        );
    }
}

/// FNV-1a, to name findings by their content.
pub fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// One run's numbers.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: String,
    pub execs: u64,
    pub seconds: f64,
    pub findings: Vec<(PathBuf, Failure)>,
    /// Distinct outcomes seen (a rough measure of how much of the parser was reached).
    pub outcomes: usize,
    pub seeds: usize,
}

/// Fuzzes `name` for `seconds`: seeds from `fuzz/corpus/NAME` and `fuzz/regressions/NAME`,
/// findings written to `findings/NAME/` (distinct by the failure's kind and place).
pub fn run(name: &str, target: Target, seconds: f64, rng_seed: u64, findings: &Path) -> Report {
    quiet_panics();
    alloc::on_refused(save_on_abort);
    let dir = fuzz_dir();
    let mut pool: Vec<Vec<u8>> = files(&dir.join("corpus").join(name))
        .into_iter()
        .chain(files(&dir.join("regressions").join(name)))
        .filter_map(|p| std::fs::read(p).ok())
        .collect();
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    let seeds = pool.len();
    let out_dir = findings.join(name);
    let mut seen = HashSet::new();
    let mut found: Vec<(PathBuf, Failure)> = Vec::new();
    let mut kinds = HashSet::new();
    let mut rng = Rng::new(rng_seed);
    let started = Instant::now();
    let budget = Duration::from_secs_f64(seconds);
    let mut execs = 0u64;
    // The seeds themselves first, unmutated.
    let mut queue: Vec<Vec<u8>> = pool.clone();
    while started.elapsed() < budget {
        let input = match queue.pop() {
            Some(i) => i,
            None => {
                let mut input = pool[rng.below(pool.len())].clone();
                let other = &pool[rng.below(pool.len())];
                mutate(&mut rng, &mut input, other);
                input
            }
        };
        if let Ok(mut c) = CURRENT.lock() {
            *c = Some((out_dir.clone(), input.clone()));
        }
        execs += 1;
        match execute(target, &input) {
            Ok(outcome) => {
                if seen.len() < 100_000 && seen.insert(outcome) && pool.len() < 20_000 {
                    pool.push(input);
                }
            }
            Err(failure) => {
                let kind = match &failure {
                    Failure::Panic(_) => format!(
                        "panic at {}",
                        LAST_PANIC_AT.lock().map(|s| s.clone()).unwrap_or_default()
                    ),
                    Failure::Memory(_) => "memory".to_string(),
                    Failure::Slow(_) => "slow".to_string(),
                };
                if kinds.insert(kind.clone()) {
                    let _ = std::fs::create_dir_all(&out_dir);
                    let path = out_dir.join(format!("{:016x}", hash(&input)));
                    let _ = std::fs::write(&path, &input);
                    eprintln!(
                        "{name}: FINDING ({kind}) {failure}: saved {}",
                        path.display()
                    );
                    found.push((path, failure));
                }
            }
        }
    }
    Report {
        target: name.to_string(),
        execs,
        seconds: started.elapsed().as_secs_f64(),
        findings: found,
        outcomes: seen.len(),
        seeds,
    }
}
