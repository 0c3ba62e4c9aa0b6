//! Shared helpers for the tests that run the real model.

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
