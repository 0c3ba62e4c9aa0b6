//! A temporary directory per test: removed when the test passes, kept (with its path printed)
//! when it fails, so the controllers' data directories and logs can be inspected.

use std::path::{Path, PathBuf};

/// Set `TB_TEST_KEEP=1` to keep directories of passing tests too.
const KEEP_ENV: &str = "TB_TEST_KEEP";

pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TestDir {
    /// A new directory whose name starts with `tb-<name>-`.
    pub fn new(name: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tb-{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temporary directory: {e}"));
        let path = dir.path().to_path_buf();
        TestDir {
            dir: Some(dir),
            path,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A sub-directory (created if missing).
    pub fn sub(&self, name: &str) -> PathBuf {
        let p = self.path.join(name);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        p
    }

    /// Write a file into the directory and return its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.path.join(name);
        std::fs::write(&p, contents).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        p
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let keep = std::thread::panicking() || std::env::var_os(KEEP_ENV).is_some();
        if let Some(dir) = self.dir.take()
            && keep
        {
            let path = dir.keep();
            eprintln!("test files kept in {}", path.display());
        }
    }
}
