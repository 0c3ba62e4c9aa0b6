//! `tb-fuzz TARGET|all [--seconds N] [--findings DIR] [--seed S]`: fuzzes targets for N seconds
//! each (default 60) and prints a table of executions, executions per second and findings;
//! exits 1 when anything was found. `tb-fuzz list` names the targets; `tb-fuzz seed` rewrites
//! the made seeds of the corpus (tiny GGUF, transport frames); `tb-fuzz replay` runs the corpus
//! and regressions once, with each input's outcome and time.

use std::path::PathBuf;

use anyhow::{Context, bail};
use tb_fuzz::targets::{TARGETS, target};
use tb_fuzz::{fuzz_dir, run, seeds};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(what) = args.first() else {
        bail!("usage: tb-fuzz TARGET|all [--seconds N] [--findings DIR] [--seed S] | list | seed");
    };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: f64 = flag("--seconds")
        .map(|s| s.parse().context("--seconds: expected a number"))
        .transpose()?
        .unwrap_or(60.0);
    let rng_seed: u64 = flag("--seed")
        .map(|s| s.parse().context("--seed: expected an integer"))
        .transpose()?
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let findings = flag("--findings")
        .map(PathBuf::from)
        .unwrap_or_else(|| fuzz_dir().join("findings"));
    match what.as_str() {
        "list" => {
            for (name, _) in TARGETS {
                println!("{name}");
            }
            return Ok(());
        }
        "seed" => return write_seeds(),
        "replay" => return replay(),
        _ => {}
    }
    let chosen: Vec<_> = if what == "all" {
        TARGETS.to_vec()
    } else {
        let t = target(what).with_context(|| {
            let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
            format!(
                "unknown target {what}; expected one of {}",
                names.join(", ")
            )
        })?;
        vec![(what.as_str(), t)]
    };
    println!("seed {rng_seed}");
    println!(
        "{:<20} {:>6} {:>10} {:>9} {:>9} {:>9}",
        "target", "seeds", "execs", "execs/s", "outcomes", "findings"
    );
    let mut total_findings = 0;
    for (name, t) in chosen {
        let r = run(name, t, seconds, rng_seed, &findings);
        println!(
            "{:<20} {:>6} {:>10} {:>9.0} {:>9} {:>9}",
            r.target,
            r.seeds,
            r.execs,
            r.execs as f64 / r.seconds.max(1e-9),
            r.outcomes,
            r.findings.len()
        );
        for (path, failure) in &r.findings {
            println!("    {failure}: {}", path.display());
        }
        total_findings += r.findings.len();
    }
    if total_findings > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Runs every corpus file and regression once, printing each one's outcome and time.
fn replay() -> anyhow::Result<()> {
    tb_fuzz::quiet_panics();
    let dir = fuzz_dir();
    for (name, t) in TARGETS {
        let mut inputs = tb_fuzz::files(&dir.join("corpus").join(name));
        inputs.extend(tb_fuzz::files(&dir.join("regressions").join(name)));
        for path in inputs {
            let data = std::fs::read(&path)?;
            let started = std::time::Instant::now();
            let outcome = tb_fuzz::execute(*t, &data);
            println!(
                "{:>9.1} ms  {name}/{}: {}",
                started.elapsed().as_secs_f64() * 1e3,
                path.file_name().unwrap_or_default().to_string_lossy(),
                match outcome {
                    Ok(o) => o,
                    Err(f) => format!("FAILED: {f}"),
                }
            );
        }
    }
    Ok(())
}

/// Writes the made seeds into fuzz/corpus/.
fn write_seeds() -> anyhow::Result<()> {
    let corpus = fuzz_dir().join("corpus");
    let mut made = vec![("gguf_header", "tiny-llama.gguf", seeds::tiny_gguf())];
    made.push(("gguf_engine", "tiny-llama.gguf", seeds::tiny_gguf()));
    for (t, name, bytes) in seeds::transport_seeds() {
        made.push((t, name, bytes));
    }
    for (t, name, bytes) in made {
        let dir = corpus.join(t);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
        println!("wrote {t}/{name}");
    }
    Ok(())
}
