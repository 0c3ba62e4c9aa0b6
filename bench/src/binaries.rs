//! The programs a benchmark runs: tb's own, built in release mode from this workspace
//! (`cargo build --release -p …`, a no-op when they are up to date, so the binaries always
//! match the source), other systems' looked up on the `PATH`, and the line that names each one
//! in the report.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `cargo build --release -p P…` in the workspace; returns the directory the binaries are in
/// (`$CARGO_TARGET_DIR/release`, by default `target/release`).
pub fn build_release(packages: &[&str]) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec!["build", "--release"];
    for p in packages {
        args.extend(["-p", p]);
    }
    let shown = format!("cargo {}", args.join(" "));
    eprintln!("building {} ({shown}) ...", packages.join(", "));
    let status = std::process::Command::new(cargo)
        .args(&args)
        .current_dir(&root)
        .status()
        .with_context(|| format!("running {shown}"))?;
    anyhow::ensure!(status.success(), "{shown} failed ({status})");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok(target.join("release"))
}

/// `dir/name`, which must exist (a file the build just made).
pub fn built(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let bin = dir.join(name);
    anyhow::ensure!(
        bin.is_file(),
        "{} is missing after the build",
        bin.display()
    );
    Ok(bin)
}

/// The first `name` in the `PATH`, then in the sbin directories a non-root `PATH` often lacks
/// (Debian puts daemons such as `slurmctld` and `munged` in `/usr/sbin`).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `label: `path` (built DATE)`, for the report's header.
pub fn describe(label: &str, path: &Path) -> String {
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(|t| {
            chrono::DateTime::<chrono::Utc>::from(t)
                .format("%Y-%m-%d %H:%M UTC")
                .to_string()
        })
        .unwrap_or_else(|_| "unknown".into());
    format!("{label}: `{}` (built {modified})", path.display())
}
