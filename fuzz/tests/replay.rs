//! Replays every corpus file and every saved finding (fuzz/corpus/TARGET/*,
//! fuzz/regressions/TARGET/*) through its target: none may panic, allocate beyond the bounds or
//! be slow. A finding fixed in a parser stays fixed.

use tb_fuzz::targets::TARGETS;
use tb_fuzz::{execute, files, fuzz_dir, quiet_panics};

#[test]
fn every_corpus_file_and_regression_passes_its_target() {
    quiet_panics();
    let dir = fuzz_dir();
    let mut failures = Vec::new();
    let mut ran = 0;
    for (name, target) in TARGETS {
        let mut inputs = files(&dir.join("corpus").join(name));
        assert!(
            !inputs.is_empty(),
            "target {name} has no corpus in fuzz/corpus/{name}"
        );
        inputs.extend(files(&dir.join("regressions").join(name)));
        for path in inputs {
            let data = std::fs::read(&path).expect("read a corpus file");
            ran += 1;
            if let Err(f) = execute(*target, &data) {
                failures.push(format!("{}: {f}", path.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} inputs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_made_gguf_seed_is_valid_for_both_readers() {
    let bytes = tb_fuzz::seeds::tiny_gguf();
    assert_eq!(tb_fuzz::targets::gguf_header(&bytes), "ok");
    let engine = tb_fuzz::targets::gguf_engine(&bytes);
    assert_eq!(engine, "index ok, tokenizer ok, template ok");
}
