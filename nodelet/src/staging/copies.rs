//! Whole staged copies of model files. A rank told to `replicate` fetches every tensor of the
//! file into the staging cache (after its own shard) and records the copy next to it:
//! `copy.path` (the Model's `source.path`, the name other nodes ask for) and `copy.json` (the
//! holder's manifest, which the copy was verified against). The nodelet reports the paths it
//! holds in its Node status (`models`), the scheduler names it as a staging source, and its
//! staging server serves the copy like the original — so losing the first holder does not stop
//! a model from being placed again.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::Manifest;

const COPY_PATH: &str = "copy.path";
const COPY_MANIFEST: &str = "copy.json";
/// The cached file in each copy's directory (as `fetch` writes it).
pub const MODEL_FILE: &str = "model.gguf";

static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Where this nodelet's staging cache is (`DATA_DIR/models`): set once at start, so the
/// staging server can serve the copies in it.
pub fn set_root(root: PathBuf) {
    let _ = ROOT.set(root);
}

/// The staging cache, once set.
pub fn root() -> Option<&'static Path> {
    ROOT.get().map(PathBuf::as_path)
}

/// Records that `dir` holds a whole, verified copy of `path` (written last, each file whole).
pub fn record(dir: &Path, path: &str, manifest: &Manifest) -> std::io::Result<()> {
    let json = serde_json::to_vec(manifest).map_err(std::io::Error::other)?;
    write_atomically(&dir.join(COPY_MANIFEST), &json)?;
    write_atomically(&dir.join(COPY_PATH), path.as_bytes())
}

fn write_atomically(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = target.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, target)
}

/// The copy of `path` in the cache under `root`, if one was recorded: its file and manifest.
pub fn find(root: &Path, path: &str) -> Option<(PathBuf, Manifest)> {
    let entries = std::fs::read_dir(root).ok()?;
    for e in entries.flatten() {
        let dir = e.path();
        let Ok(named) = std::fs::read_to_string(dir.join(COPY_PATH)) else {
            continue;
        };
        if named != path {
            continue;
        }
        let manifest = std::fs::read(dir.join(COPY_MANIFEST))
            .ok()
            .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok());
        let file = dir.join(MODEL_FILE);
        if let Some(m) = manifest
            && std::fs::metadata(&file).is_ok_and(|meta| meta.len() == m.file_len)
        {
            return Some((file, m));
        }
    }
    None
}

/// The paths of every copy recorded under `root`, sorted.
pub fn held(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join(COPY_PATH)).ok())
        .filter(|p| !p.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_copy_is_found_by_its_path_and_listed() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("abc");
        std::fs::create_dir_all(&dir).expect("dir");
        let m = Manifest {
            file_len: 10,
            header_len: 4,
            header_sha256: "00".into(),
            tensors: Vec::new(),
        };
        std::fs::write(dir.join(MODEL_FILE), [0u8; 10]).expect("file");
        assert!(find(root.path(), "/m/a.gguf").is_none());
        record(&dir, "/m/a.gguf", &m).expect("record");
        let (file, found) = find(root.path(), "/m/a.gguf").expect("found");
        assert_eq!(file, dir.join(MODEL_FILE));
        assert_eq!(found, m);
        assert!(find(root.path(), "/m/b.gguf").is_none());
        assert_eq!(held(root.path()), ["/m/a.gguf"]);
        // A file of the wrong length is no copy.
        std::fs::write(dir.join(MODEL_FILE), [0u8; 3]).expect("file");
        assert!(find(root.path(), "/m/a.gguf").is_none());
    }
}
