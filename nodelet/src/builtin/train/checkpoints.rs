//! Where a built-in fine-tune keeps its checkpoints: `step-N` directories under the job's
//! `checkpoints.dir` (TB_CHECKPOINT_DIR). A rank saves into a hidden `.step-N.rR` directory and
//! renames it into place, so the nodelet's TB_RESUME_FROM (the newest entry) never names a
//! half-written one; ranks that share the directory (one Mac) find it there already and drop
//! their copy — the copies are the same, since every rank holds the same adapters. Every rank
//! on another Mac keeps its own copy, so a gang placed again resumes without shared storage.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Checkpoints kept; older ones are removed.
pub const KEEP: usize = 3;

/// The name of step `step`'s checkpoint.
pub fn name(step: u64) -> String {
    format!("step-{step}")
}

/// The step a checkpoint's name says, if it is one of ours.
pub fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// Saves with `save` into `dir/step-N` (see the module doc); then prunes to [`KEEP`].
pub fn save(
    dir: &Path,
    step: u64,
    rank: usize,
    save: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = dir.join(name(step));
    let partial = dir.join(format!(".{}.r{rank}", name(step)));
    let _ = std::fs::remove_dir_all(&partial);
    save(&partial)?;
    if target.exists() {
        // Another rank on this Mac saved the same checkpoint first.
        let _ = std::fs::remove_dir_all(&partial);
    } else if let Err(e) = std::fs::rename(&partial, &target) {
        let _ = std::fs::remove_dir_all(&partial);
        if !target.exists() {
            return Err(e).with_context(|| format!("renaming into {}", target.display()));
        }
    }
    prune(dir);
    Ok(target)
}

/// Keeps the newest [`KEEP`] step directories.
fn prune(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut steps: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((step_of(&e.file_name().to_string_lossy())?, e.path())))
        .collect();
    steps.sort();
    let drop = steps.len().saturating_sub(KEEP);
    for (_, p) in steps.into_iter().take(drop) {
        let _ = std::fs::remove_dir_all(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_land_whole_and_old_ones_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        for step in [10, 20, 30, 40] {
            for rank in 0..2 {
                save(dir.path(), step, rank, |p| {
                    std::fs::create_dir_all(p)?;
                    std::fs::write(p.join("COMPLETE"), step.to_string())?;
                    Ok(())
                })
                .expect("saved");
            }
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["step-20", "step-30", "step-40"]);
        assert_eq!(step_of("step-40"), Some(40));
        assert_eq!(step_of("adapter"), None);
    }
}
