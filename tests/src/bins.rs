//! Locates `tb-controller` and `tbctl` and makes sure they are up to date.
//!
//! Integration tests of one crate cannot name another crate's binaries with
//! `env!("CARGO_BIN_EXE_...")`, so the harness runs `cargo build -p PACKAGE` once per binary and
//! test process (a no-op taking well under a second when nothing changed; cargo's own lock
//! serialises it with any concurrent build) into the target directory this test binary was built
//! in, then uses the binary from there. `cargo test` does not hold the build lock while tests
//! run, so this cannot deadlock. Each binary is built on first use, so tests of the controller
//! do not depend on tbctl compiling, and the other way round.
//!
//! Set `TB_TEST_BIN_DIR` to a directory holding prebuilt binaries to skip the build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `tb-controller` binary (package `tb-controller`).
pub fn controller() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    binary(&BUILT, "tb-controller", "tb-controller")
}

/// The `tbctl` binary (package `tbctl`).
pub fn tbctl() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    binary(&BUILT, "tbctl", "tbctl")
}

fn binary(built: &OnceLock<Result<PathBuf, String>>, package: &str, name: &str) -> PathBuf {
    match built.get_or_init(|| prepare(package, name)) {
        Ok(path) => path.clone(),
        Err(e) => panic!("{name} is not available: {e}"),
    }
}

fn prepare(package: &str, name: &str) -> Result<PathBuf, String> {
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let path = if let Some(dir) = std::env::var_os("TB_TEST_BIN_DIR") {
        PathBuf::from(dir).join(file)
    } else {
        let layout = Layout::detect()?;
        build(&layout, package)?;
        layout.profile_dir.join(file)
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}

/// The target directory and profile this test binary was built with.
#[derive(Debug)]
struct Layout {
    target_dir: PathBuf,
    /// `<target>/debug`, `<target>/release` or `<target>/<custom profile>`.
    profile_dir: PathBuf,
}

impl Layout {
    fn detect() -> Result<Layout, String> {
        // A test binary lives at <target>/<profile>/deps/<name>-<hash>.
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let deps = exe.parent();
        if let Some(deps) = deps.filter(|d| d.file_name().is_some_and(|n| n == "deps"))
            && let Some(profile_dir) = deps.parent()
            && let Some(target_dir) = profile_dir.parent()
        {
            return Ok(Layout {
                target_dir: target_dir.to_path_buf(),
                profile_dir: profile_dir.to_path_buf(),
            });
        }
        // Not run by cargo test: fall back to the workspace's target directory.
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        Ok(Layout {
            profile_dir: target_dir.join("debug"),
            target_dir,
        })
    }

    /// `cargo build` arguments selecting the profile whose output lands in `profile_dir`.
    fn profile_args(&self) -> Vec<String> {
        match self.profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => Vec::new(),
            Some("release") => vec!["--release".into()],
            Some(other) => vec!["--profile".into(), other.into()],
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn build(layout: &Layout, package: &str) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = std::time::Instant::now();
    let output = Command::new(&cargo)
        .current_dir(workspace_root())
        .args(["build", "--quiet", "-p", package])
        .args(layout.profile_args())
        .env("CARGO_TARGET_DIR", &layout.target_dir)
        .output()
        .map_err(|e| format!("running {}: {e}", Path::new(&cargo).display()))?;
    if !output.status.success() {
        return Err(format!(
            "`cargo build -p {package}` failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    crate::step!(
        "{package} built in {} ({:.1}s)",
        layout.profile_dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
