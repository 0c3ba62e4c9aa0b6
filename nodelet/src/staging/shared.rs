//! What a holder may serve over the staging port: the port answers anyone who can reach it and
//! the nodelet may run as root, so it serves only files every local account could read anyway —
//! an absolute, normalised path, a regular file (not a link), readable by all (`o+r`) under
//! directories every account may enter (`o+x`), and no larger than the kind of file can be.
//! Used for LoRA adapters ([`super::adapter`]) and datasets ([`super::dataset`]).

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The longest path served.
pub const MAX_PATH: usize = 1024;

/// Checks that `path` is absolute and normalised; `what` names the kind of file in the error.
pub fn check_path(path: &Path, what: &str) -> Result<(), String> {
    let text = path.to_str().unwrap_or_default();
    if text.len() > MAX_PATH
        || !text.starts_with('/')
        || text.contains("//")
        || text.split('/').any(|p| p == "." || p == "..")
        || text.chars().any(char::is_control)
    {
        return Err(format!(
            "{text:?} is not an absolute, normalised {what} path"
        ));
    }
    Ok(())
}

/// Opens `path` for serving when every account may reach and read it (see the module doc),
/// returning the file and its length. Checked on the opened file's own metadata, so a file
/// swapped after the check is not read.
pub fn open_shared(path: &Path, what: &str, max: u64) -> Result<(File, u64), String> {
    check_path(path, what)?;
    let mut above = path.parent();
    while let Some(d) = above {
        let meta = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
        if meta.mode() & 0o001 == 0 {
            return Err(format!(
                "{} is not open to every account (o+x); a shared {what} must be",
                d.display()
            ));
        }
        above = d.parent();
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.mode() & 0o004 == 0 {
        return Err(format!(
            "{} is not readable by every account (o+r); a shared {what} must be",
            path.display()
        ));
    }
    if meta.len() > max {
        return Err(format!(
            "{} has {} bytes; a {what} file has at most {max}",
            path.display(),
            meta.len()
        ));
    }
    Ok((file, meta.len()))
}
