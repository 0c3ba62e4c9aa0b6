//! What a rank needs before it starts: its directories, its program found (`super::program`),
//! its environment (MLX's hostfile and variables, tb's own), the newest checkpoint to resume
//! from, and for the built-in executor the `tb-shard` (service) or `tb-train` (TrainingJob)
//! command line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use tb_api::specs::{AllocationSpec, Backend, Executor};

use crate::agent::accounts::Account;
use crate::agent::dirs::{self, AllocDirs};
use crate::agent::program;
use crate::builtin::command::{TERMINATION_MESSAGE_ENV, TrainPaths, shard_command, train_command};
use crate::builtin::train::progress::PROGRESS_FILE_ENV;
use crate::exec;
use crate::exec::contain;
use crate::mlx;

/// Why an allocation could not be prepared.
pub(super) enum Prepare {
    /// The built-in executor's model file is not here.
    Model(String),
    /// An exec rank's program (or script) is nowhere it was looked for.
    Program(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Prepare {
    fn from(e: anyhow::Error) -> Self {
        Prepare::Other(e)
    }
}

impl From<mlx::MlxError> for Prepare {
    fn from(e: mlx::MlxError) -> Self {
        Prepare::Other(e.into())
    }
}

/// The `tb-shard` binary: beside this nodelet's own binary.
pub(crate) fn shard_binary() -> PathBuf {
    sibling_binary("tb-shard")
}

/// A binary beside this nodelet's own (`tb-shard`, `tb-train`).
fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Where rank 0 of a built-in fine-tune writes its progress (read by `super::training`).
pub(super) fn progress_file(dirs: &AllocDirs) -> PathBuf {
    dirs.tb.join("progress.json")
}

/// The most recently modified entry of `dir` (a checkpoint file or directory), if any.
pub(super) fn newest_entry(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// Where a rank's program comes from, beside its spec.
pub(super) struct Sources<'a> {
    /// The built-in executor's staged model file.
    pub(super) staged: Option<&'a Path>,
    /// The built-in executor's adapter, fetched from the node that holds it.
    pub(super) staged_adapter: Option<&'a Path>,
    /// The directory the job's manifest was applied from (its annotation).
    pub(super) manifest_dir: Option<&'a Path>,
    /// The nodelet's `--python`.
    pub(super) python: Option<&'a Path>,
    /// The nodelet's `--engine-threads`: a built-in rank's CPU threads, unless its spec's
    /// environment says otherwise.
    pub(super) engine_threads: Option<u32>,
    /// Rank 0 of a service: what its OpenAI endpoint serves with.
    pub(super) service: Option<&'a super::service_key::ServiceCredentials>,
}

/// The process to start: its directories, the MLX files and environment, the command, the
/// account.
pub(super) fn prepare(
    dir: &Path,
    namespace: &str,
    spec: &AllocationSpec,
    sources: &Sources,
    account: Option<&Account>,
    incarnation: &str,
) -> Result<(exec::Spec, AllocDirs), Prepare> {
    let (alloc_dirs, work) = dirs::prepare_alloc(dir, account, spec.working_dir.as_deref())?;
    let logs = alloc_dirs.logs.clone();
    let mut env = spec.env.clone();
    let job = if namespace == "default" {
        spec.job.name.clone()
    } else {
        format!("{namespace}/{}", spec.job.name)
    };
    let mut files = mlx::MlxFiles::default();
    let mut coordinator = None;
    let backend = spec.mlx.as_ref().map_or(Backend::Ring, |m| m.backend);
    if let Some(m) = &spec.mlx {
        let ranks = m
            .hosts
            .iter()
            .map(|h| mlx::parse_address(h))
            .collect::<Result<Vec<_>, _>>()
            .context("the allocation's MLX hosts")?;
        let hostfile = dir.join("hostfile.json");
        mlx::write_atomic(&hostfile, &mlx::ring_hostfile(&ranks)?)?;
        dirs::give_file(&hostfile, account)?;
        files.hostfile_path = Some(hostfile);
        if let Some(matrix) = &m.ibv_devices {
            let matrix: Vec<Vec<Vec<String>>> = matrix
                .iter()
                .map(|row| row.iter().map(|c| c.iter().cloned().collect()).collect())
                .collect();
            let devices = dir.join("ibv_devices.json");
            mlx::write_atomic(&devices, &mlx::ibv_devices(&matrix)?)?;
            dirs::give_file(&devices, account)?;
            files.ibv_devices_path = Some(devices);
        }
        coordinator = m.coordinator.clone();
    }
    let mlx_ready = match backend {
        Backend::Ring => files.hostfile_path.is_some(),
        _ => files.ibv_devices_path.is_some(),
    };
    let tb_env = if mlx_ready {
        mlx::env_for_rank(
            &job,
            spec.rank,
            spec.world_size,
            backend,
            &files,
            coordinator,
        )?
    } else {
        // No MLX setup, or JACCL without a device matrix (no RDMA topology known yet): tb's own
        // variables only.
        BTreeMap::from([
            ("TB_JOB".to_string(), job.clone()),
            ("TB_RANK".to_string(), spec.rank.to_string()),
            ("TB_WORLD_SIZE".to_string(), spec.world_size.to_string()),
            ("MLX_RANK".to_string(), spec.rank.to_string()),
        ])
    };
    env.extend(tb_env);
    env.insert("TB_EPOCH".into(), spec.epoch.to_string());
    // A job that keeps checkpoints resumes from the newest one after a restart or preemption.
    if let Some(newest) = env
        .get("TB_CHECKPOINT_DIR")
        .and_then(|d| newest_entry(Path::new(d)))
    {
        env.insert("TB_RESUME_FROM".into(), newest.display().to_string());
    }
    env.insert("TB_ALLOCATION_DIR".into(), dir.display().to_string());
    env.insert(contain::MARKER_ENV.into(), incarnation.to_string());
    if let Some(a) = account {
        // The nodelet's HOME and TMPDIR are not the job's to use.
        env.entry("HOME".into())
            .or_insert_with(|| alloc_dirs.work.display().to_string());
        env.entry("TMPDIR".into())
            .or_insert_with(|| alloc_dirs.tmp().display().to_string());
        if let Some(name) = &a.name {
            env.insert("USER".into(), name.clone());
            env.insert("LOGNAME".into(), name.clone());
        }
    }
    let command = if spec.executor == Executor::Builtin {
        if let Some(n) = sources.engine_threads {
            env.entry(tb_engine::THREADS_ENV.into())
                .or_insert_with(|| n.to_string());
        }
        env.insert(
            TERMINATION_MESSAGE_ENV.into(),
            alloc_dirs.termination_message().display().to_string(),
        );
        if spec.job.kind == tb_api::Kind::TrainingJob.as_str() {
            // A built-in TrainingJob's rank trains (data parallel); a service's serves.
            let progress = progress_file(&alloc_dirs);
            let _ = std::fs::remove_file(&progress);
            env.insert(PROGRESS_FILE_ENV.into(), progress.display().to_string());
            let paths = TrainPaths {
                working_dir: &work,
                manifest_dir: sources.manifest_dir.filter(|d| d.is_dir()),
                progress: &progress,
            };
            train_command(&sibling_binary("tb-train"), spec, sources.staged, &paths)
                .map_err(Prepare::Model)?
        } else {
            let mut cmd = shard_command(
                &shard_binary(),
                spec,
                sources.staged,
                sources.staged_adapter,
            )
            .map_err(Prepare::Model)?;
            if let Some(credentials) = sources.service {
                cmd.extend(super::service_key::write(dir, credentials, account)?);
            }
            cmd
        }
    } else {
        let path = env
            .get("PATH")
            .map(std::ffi::OsString::from)
            .unwrap_or_else(exec::process::inherited_path);
        let lookup = program::Lookup {
            working_dir: &work,
            // Used only where this Mac has it.
            manifest_dir: sources.manifest_dir.filter(|d| d.is_dir()),
            python: sources.python,
            path: &path,
            account: account.map(|a| (a.uid, a.gid)),
        };
        match program::resolve(&spec.command, &lookup) {
            Ok(command) => command,
            Err(e) => {
                // Where `tbctl logs` looks, as well as in the allocation's condition.
                if let Err(log) = exec::logs::note_stderr(&logs, &format!("tb: {e}")) {
                    tracing::warn!(dir = %logs.display(), "cannot write the rank's log: {log}");
                }
                return Err(Prepare::Program(e.to_string()));
            }
        }
    };
    let mut s = exec::Spec::new(command, work, logs);
    s.env = env;
    s.run_as = account.map(Account::run_as);
    Ok((s, alloc_dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_restarted_rank_resumes_from_the_newest_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(newest_entry(dir.path()), None, "no checkpoint yet");
        for (i, name) in ["step-100", "step-200", ".partial"].iter().enumerate() {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
            let t = std::time::SystemTime::UNIX_EPOCH
                + std::time::Duration::from_secs(1_000 + i as u64);
            let f = std::fs::File::open(dir.path().join(name)).expect("open");
            f.set_modified(t).expect("mtime");
        }
        assert_eq!(newest_entry(dir.path()), Some(dir.path().join("step-200")));
        assert_eq!(newest_entry(&dir.path().join("missing")), None);
    }
}
