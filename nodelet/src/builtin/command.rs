//! How the nodelet runs a built-in allocation: the `tb-shard` command line of a service's rank,
//! from the allocation's [`BuiltinAssignment`] and layer range, or the `tb-train` command line
//! of a TrainingJob's.

use std::path::{Path, PathBuf};

use tb_api::specs::AllocationSpec;

/// Environment variable through which `tb-shard` reports why it could not start: it writes
/// `Reason\nmessage` to the file it names, and the nodelet puts both in the allocation status.
pub const TERMINATION_MESSAGE_ENV: &str = "TB_TERMINATION_MESSAGE";

/// Expands a leading `~/` to the home directory.
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// The command that runs rank `spec.rank` of a built-in service with the `tb-shard` binary at
/// `shard_bin`, loading `staged` when the shard was staged here (else the Model's path), and
/// the adapter from `staged_adapter` when it was fetched here (else its path, which tb-shard
/// reads as the job's account: the nodelet does not look at it).
/// Errors say which field of the assignment is wrong.
pub fn shard_command(
    shard_bin: &Path,
    spec: &AllocationSpec,
    staged: Option<&Path>,
    staged_adapter: Option<&Path>,
) -> Result<Vec<String>, String> {
    let b = spec
        .builtin
        .as_ref()
        .ok_or("the allocation has no built-in assignment")?;
    if b.hosts.len() != spec.world_size as usize {
        return Err(format!(
            "builtin.hosts lists {} hosts for a world of {}",
            b.hosts.len(),
            spec.world_size
        ));
    }
    let model = staged.map_or_else(|| expand_home(&b.model_path), Path::to_path_buf);
    if !model.is_file() {
        return Err(format!(
            "the model file {} (Model {}'s source.path) is not on this node",
            model.display(),
            b.model
        ));
    }
    let mut cmd = vec![
        shard_bin.display().to_string(),
        "--model".into(),
        model.display().to_string(),
        "--model-name".into(),
        b.model.clone(),
        "--rank".into(),
        spec.rank.to_string(),
        "--hosts".into(),
        b.hosts.join(","),
        "--coordinator".into(),
        b.coordinator.clone(),
    ];
    if let Some(l) = spec.layers {
        cmd.extend([
            "--first".into(),
            l.first.to_string(),
            "--count".into(),
            l.count.to_string(),
        ]);
    }
    if spec.rank == 0 {
        let port = b
            .endpoint_port
            .ok_or("rank 0 of a built-in service needs builtin.endpointPort")?;
        let host = b.hosts.first().ok_or("builtin.hosts is empty")?;
        cmd.extend(["--http".into(), format!("{host}:{port}")]);
    }
    if let Some(c) = b.context {
        cmd.extend(["--context".into(), c.to_string()]);
    }
    if let Some(n) = b.batch {
        cmd.extend(["--batch".into(), n.to_string()]);
    }
    if b.tensor_parallel {
        cmd.push("--tensor-parallel".into());
    }
    if spec.memory_bytes > 0 {
        cmd.extend(["--memory-limit".into(), spec.memory_bytes.to_string()]);
    }
    if let Some(a) = &b.adapter {
        let dir = match (staged_adapter, &a.source) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, None) if Path::new(&a.path).is_absolute() => PathBuf::from(&a.path),
            (None, None) => {
                return Err(format!(
                    "builtin.adapter.path {:?} is not an absolute directory",
                    a.path
                ));
            }
            (None, Some(source)) => {
                return Err(format!(
                    "the adapter {} was to be fetched from {source} but was not",
                    a.path
                ));
            }
        };
        cmd.extend(["--adapter".into(), dir.display().to_string()]);
    }
    Ok(cmd)
}

/// Where a built-in fine-tune's rank finds its files: the dataset (relative: the manifest's
/// directory when it has the file, else the working directory) and the adapter's directory
/// (relative: the working directory).
pub struct TrainPaths<'a> {
    pub working_dir: &'a Path,
    pub manifest_dir: Option<&'a Path>,
    /// Rank 0's progress file.
    pub progress: &'a Path,
}

/// The command that runs rank `spec.rank` of a built-in TrainingJob with the `tb-train` binary
/// at `train_bin`, loading `staged` when the model was staged here (else the Model's path).
pub fn train_command(
    train_bin: &Path,
    spec: &AllocationSpec,
    staged: Option<&Path>,
    paths: &TrainPaths,
) -> Result<Vec<String>, String> {
    let b = spec
        .builtin
        .as_ref()
        .ok_or("the allocation has no built-in assignment")?;
    if b.hosts.len() != spec.world_size as usize {
        return Err(format!(
            "builtin.hosts lists {} hosts for a world of {}",
            b.hosts.len(),
            spec.world_size
        ));
    }
    let finetune = b
        .finetune
        .as_ref()
        .ok_or("a built-in TrainingJob's rank needs builtin.finetune")?;
    let parsed: tb_api::specs::FineTuneSpec =
        serde_json::from_value(finetune.clone()).map_err(|e| format!("builtin.finetune: {e}"))?;
    let dataset = b
        .dataset
        .as_deref()
        .ok_or("a built-in TrainingJob's rank needs builtin.dataset")?;
    let model = staged.map_or_else(|| expand_home(&b.model_path), Path::to_path_buf);
    if !model.is_file() {
        return Err(format!(
            "the model file {} (Model {}'s source.path) is not on this node",
            model.display(),
            b.model
        ));
    }
    let dataset = {
        let p = expand_home(dataset);
        if p.is_absolute() {
            p
        } else {
            paths
                .manifest_dir
                .map(|d| d.join(&p))
                .filter(|c| c.is_file())
                .unwrap_or_else(|| paths.working_dir.join(&p))
        }
    };
    let output = {
        let p = expand_home(parsed.output());
        if p.is_absolute() {
            p
        } else {
            paths.working_dir.join(p)
        }
    };
    let mut cmd = vec![
        train_bin.display().to_string(),
        "--model".into(),
        model.display().to_string(),
        "--model-name".into(),
        b.model.clone(),
        "--rank".into(),
        spec.rank.to_string(),
        "--hosts".into(),
        b.hosts.join(","),
        "--coordinator".into(),
        b.coordinator.clone(),
        "--dataset".into(),
        dataset.display().to_string(),
        "--output".into(),
        output.display().to_string(),
        "--finetune".into(),
        finetune.to_string(),
    ];
    if let Some(source) = &b.dataset_source {
        // The path is the holder's: this rank fetches its examples from there.
        cmd.extend(["--dataset-source".into(), source.clone()]);
    }
    if spec.rank == 0 {
        cmd.extend(["--progress".into(), paths.progress.display().to_string()]);
    }
    if spec.memory_bytes > 0 {
        cmd.extend(["--memory-limit".into(), spec.memory_bytes.to_string()]);
    }
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tb_api::specs::{BuiltinAssignment, Executor, JobRef, LayerRange};

    fn spec(rank: u32, model_path: &str) -> AllocationSpec {
        AllocationSpec {
            job: JobRef {
                kind: "InferenceService".into(),
                name: "chat".into(),
                uid: String::new(),
            },
            node: "mac1".into(),
            rank,
            world_size: 2,
            epoch: 1,
            executor: Executor::Builtin,
            layers: Some(LayerRange {
                first: 15 * rank,
                count: 15,
            }),
            builtin: Some(BuiltinAssignment {
                model: "smollm2".into(),
                model_path: model_path.into(),
                hosts: vec!["127.0.0.1".into(), "127.0.0.2".into()],
                coordinator: "127.0.0.1:7101".into(),
                endpoint_port: Some(8080),
                context: Some(2048),
                batch: None,
                sources: Vec::new(),
                replicate: false,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn commands_name_the_layers_the_peers_and_the_endpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"x").expect("write");
        let m = model.display().to_string();
        let cmd =
            shard_command(Path::new("/bin/tb-shard"), &spec(0, &m), None, None).expect("command");
        let line = cmd.join(" ");
        assert!(line.starts_with("/bin/tb-shard --model "), "{line}");
        assert!(line.contains("--first 0 --count 15"), "{line}");
        assert!(line.contains("--hosts 127.0.0.1,127.0.0.2"), "{line}");
        assert!(line.contains("--http 127.0.0.1:8080"), "{line}");
        assert!(line.contains("--context 2048"), "{line}");
        let cmd =
            shard_command(Path::new("/bin/tb-shard"), &spec(1, &m), None, None).expect("command");
        let line = cmd.join(" ");
        assert!(
            line.contains("--rank 1") && line.contains("--first 15"),
            "{line}"
        );
        assert!(!line.contains("--http"), "{line}");

        let err = shard_command(
            Path::new("/bin/tb-shard"),
            &spec(0, "/nope/m.gguf"),
            None,
            None,
        )
        .unwrap_err();
        assert!(
            err.contains("/nope/m.gguf") && err.contains("smollm2"),
            "{err}"
        );
    }

    #[test]
    fn training_ranks_find_the_dataset_beside_the_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"x").expect("write");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(manifests.join("data")).expect("mkdir");
        std::fs::write(manifests.join("data/facts.jsonl"), b"{}").expect("write");
        let mut s = spec(1, &model.display().to_string());
        s.job.kind = "TrainingJob".into();
        s.layers = None;
        if let Some(b) = s.builtin.as_mut() {
            b.dataset = Some("data/facts.jsonl".into());
            b.finetune = Some(serde_json::json!({"steps": 3, "output": "out"}));
        }
        let work = dir.path().join("work");
        let paths = TrainPaths {
            working_dir: &work,
            manifest_dir: Some(&manifests),
            progress: &dir.path().join("progress.json"),
        };
        let line = train_command(Path::new("/bin/tb-train"), &s, None, &paths)
            .expect("command")
            .join(" ");
        assert!(line.starts_with("/bin/tb-train --model "), "{line}");
        assert!(
            line.contains(&format!(
                "--dataset {}",
                manifests.join("data/facts.jsonl").display()
            )),
            "{line}"
        );
        assert!(
            line.contains(&format!("--output {}", work.join("out").display())),
            "{line}"
        );
        assert!(!line.contains("--progress"), "only rank 0 reports: {line}");
        if let Some(b) = s.builtin.as_mut() {
            b.finetune = None;
        }
        let err = train_command(Path::new("/bin/tb-train"), &s, None, &paths).unwrap_err();
        assert!(err.contains("builtin.finetune"), "{err}");
    }

    #[test]
    fn an_adapter_is_passed_from_its_path_or_where_it_was_fetched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"x").expect("write");
        let mut s = spec(1, &model.display().to_string());
        let b = s.builtin.as_mut().expect("builtin");
        b.adapter = Some(tb_api::specs::AdapterAssignment {
            path: "/Users/Shared/adapters/z".into(),
            source: None,
        });
        let bin = Path::new("/bin/tb-shard");
        let line = shard_command(bin, &s, None, None)
            .expect("command")
            .join(" ");
        assert!(
            line.ends_with("--adapter /Users/Shared/adapters/z"),
            "{line}"
        );
        s.builtin.as_mut().expect("builtin").adapter = Some(tb_api::specs::AdapterAssignment {
            path: "/Users/Shared/adapters/z".into(),
            source: Some("10.0.0.1:7602".into()),
        });
        let err = shard_command(bin, &s, None, None).unwrap_err();
        assert!(err.contains("10.0.0.1:7602"), "{err}");
        let line = shard_command(bin, &s, None, Some(Path::new("/var/tb/adapters/ab")))
            .expect("command")
            .join(" ");
        assert!(line.ends_with("--adapter /var/tb/adapters/ab"), "{line}");
    }
}
