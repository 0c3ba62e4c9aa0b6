//! Shared helpers for the tests that run the real model.

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::path::PathBuf;

/// The test model; fails (no silent skip) when it has not been fetched.
pub fn model_path() -> PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "test model {} not found: run scripts/fetch-model.sh (or set TB_TEST_MODEL to a GGUF path)",
        p.display()
    );
    p
}

/// The largest element-wise difference of two equally long vectors of logits.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
