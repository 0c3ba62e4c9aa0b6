//! `tbctl model inspect FILE|DIR`: reads a GGUF file's header (tb-api's `gguf` reader), or a
//! Hugging Face / MLX directory's `config.json` and safetensors headers (tb-api's `hf` reader) —
//! no ML runtime, no tensor data — and prints a Model manifest for it, ready for `tbctl apply`.
//! The facts the Model spec has no field for (feed-forward width, quantisation, parameter
//! counts) go in annotations, labels and a comment. Needs no server.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use tb_api::gguf::{GgufHeader, ModelFacts};
use tb_api::specs::model::{ModelFormat, ModelSource, ModelSpec};
use tb_api::{API_VERSION, Kind, Object, ObjectMeta, Quantity};

use crate::args::{ModelCommand, ModelInspectArgs};
use crate::output::emit;

pub fn run(cmd: &ModelCommand) -> Result<()> {
    match cmd {
        ModelCommand::Inspect(a) => emit(&inspect(a)?),
    }
}

/// The manifest text for the file (or the one .gguf file in the directory, or the Hugging
/// Face / MLX model in it) `args` names.
pub fn inspect(args: &ModelInspectArgs) -> Result<String> {
    if args.target.join("config.json").is_file() {
        return inspect_dir(args);
    }
    let file = gguf_file(&args.target)?;
    let header = GgufHeader::read(&file)?;
    if let Some(m) = header.missing_data() {
        bail!(
            "{}: truncated: tensor {} needs the file to reach byte {}, but it has {} bytes (an \
             interrupted download or copy? fetch it again)",
            file.display(),
            m.tensor,
            m.ends_at,
            m.file_bytes
        );
    }
    let facts = header.model_facts();
    if facts.architecture.is_empty() {
        bail!(
            "{}: no general.architecture in the GGUF header: not a model's weights (a LoRA \
             adapter or a vocabulary-only file?)",
            file.display()
        );
    }
    let absolute =
        std::fs::canonicalize(&file).with_context(|| format!("resolving {}", file.display()))?;
    let source_path = match &args.path {
        Some(p) => p.clone(),
        None => absolute.display().to_string(),
    };
    let name = match &args.name {
        Some(n) => n.clone(),
        None => name_from_file(&absolute)?,
    };
    tb_api::name::validate_name(&name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let (metadata, spec) = manifest(&name, &source_path, &facts, header.file_bytes);
    finish(&file, metadata, spec, &comment(&absolute, &header, &facts))
}

/// Checks the manifest as `tbctl apply` would and prints it under `comment`.
fn finish(file: &Path, metadata: ObjectMeta, spec: ModelSpec, comment: &str) -> Result<String> {
    let manifest = Manifest {
        api_version: API_VERSION,
        kind: Kind::Model.as_str(),
        metadata,
        spec,
    };
    // What `tbctl apply` will check, checked now: a file whose facts make no valid Model
    // (say, heads not divisible by kv heads) is reported here, naming the file.
    let object = Object {
        api_version: API_VERSION.into(),
        kind: Kind::Model.as_str().into(),
        metadata: manifest.metadata.clone(),
        spec: serde_json::to_value(&manifest.spec).context("encoding the Model spec")?,
        status: serde_json::Value::Null,
    };
    tb_api::validate_object(&object).map_err(|e| {
        anyhow::anyhow!(
            "{}: the manifest made from this file is not valid: {e}",
            file.display()
        )
    })?;
    let yaml = serde_yaml::to_string(&manifest).context("encoding the manifest")?;
    Ok(format!("{comment}{yaml}"))
}

/// A Hugging Face or MLX model directory: its `config.json`, and its safetensors headers when
/// the weights are there.
fn inspect_dir(args: &ModelInspectArgs) -> Result<String> {
    let dir = &args.target;
    let facts = tb_api::hf::read_dir(dir)?;
    let absolute =
        std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None => {
            let dir_name = absolute.file_name().map(|n| n.to_string_lossy());
            name_from(&absolute, &dir_name.unwrap_or_default())?
        }
    };
    tb_api::name::validate_name(&name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let format = if facts.precision.starts_with("mlx") {
        ModelFormat::Mlx
    } else {
        ModelFormat::Safetensors
    };
    let quantity = |b: u64| (b > 0).then(|| Quantity::from_bytes(b));
    let spec = ModelSpec {
        format,
        source: ModelSource {
            path: Some(match &args.path {
                Some(p) => p.clone(),
                None => absolute.display().to_string(),
            }),
            nodes: Vec::new(),
        },
        architecture: Some(facts.architecture.clone()),
        layers: Some(facts.layers),
        bytes_per_layer: quantity(facts.bytes_per_layer),
        total_bytes: quantity(facts.total_bytes),
        hidden_size: Some(facts.hidden_size),
        heads: Some(facts.heads),
        kv_heads: Some(facts.kv_heads),
        context_length: facts.context_length,
        vocab_size: Some(facts.vocab_size),
        head_dim: (facts.head_dim != facts.hidden_size / facts.heads).then_some(facts.head_dim),
        kv_lora_rank: facts.kv_lora_rank,
        qk_rope_head_dim: facts.qk_rope_head_dim,
        sliding_window: facts.sliding_window,
        sliding_window_layers: facts.sliding_window_layers,
        experts: facts.experts,
        experts_per_token: facts.experts_per_token,
        active_bytes: (facts.active_bytes < facts.total_bytes)
            .then(|| Quantity::from_bytes(facts.active_bytes)),
        tied_embeddings: facts.tied_embeddings.then_some(true),
    };
    let mut metadata = ObjectMeta {
        name,
        ..ObjectMeta::default()
    };
    let notes = [
        ("parameters", facts.parameters.to_string()),
        ("active-parameters", facts.active_parameters.to_string()),
        ("precision", facts.precision.clone()),
    ];
    for (key, value) in notes {
        if key != "active-parameters" || facts.active_parameters < facts.parameters {
            metadata.annotations.insert(key.into(), value);
        }
    }
    let sizes = match facts.bytes_from {
        tb_api::hf::BytesFrom::Safetensors(n) => {
            format!("sizes from the headers of {n} .safetensors file(s)")
        }
        tb_api::hf::BytesFrom::Shape => format!(
            "no .safetensors here: sizes counted from the shape, in {}",
            facts.precision
        ),
    };
    let active = if facts.active_parameters < facts.parameters {
        format!(
            ", {:.2}B of them used per token",
            facts.active_parameters as f64 / 1e9
        )
    } else {
        String::new()
    };
    let comment = format!(
        "# Read from {}/config.json by `tbctl model inspect`\n# ({sizes}).\n\
         # {:.2}B parameters{active}.\n\
         # source.path is where this machine has the directory: every node that serves the\n\
         # model needs it there (or name the nodes that hold it in source.nodes).\n",
        absolute.display(),
        facts.parameters as f64 / 1e9,
    );
    finish(&absolute.join("config.json"), metadata, spec, &comment)
}

/// The printed manifest: fields in the order people write them (apiVersion, kind, metadata,
/// spec), no namespace (`apply -n` chooses it), no status.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta,
    spec: ModelSpec,
}

/// FILE itself, or the single `.gguf` file in DIR.
fn gguf_file(target: &Path) -> Result<PathBuf> {
    let meta =
        std::fs::metadata(target).with_context(|| format!("reading {}", target.display()))?;
    if !meta.is_dir() {
        return Ok(target.to_path_buf());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(target)
        .with_context(|| format!("listing {}", target.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                && p.is_file()
        })
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!(
            "{}: no .gguf file and no config.json in this directory; tbctl model inspect \
             reads a GGUF file, or a Hugging Face / MLX model directory (config.json and its \
             .safetensors files)",
            target.display()
        ),
        _ => bail!(
            "{}: {} .gguf files here ({}); name one of them",
            target.display(),
            found.len(),
            found
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// An object name from the file's name: `SmolLM2-135M-Instruct.Q4_1.gguf` →
/// `smollm2-135m-instruct-q4-1`.
pub fn name_from_file(path: &Path) -> Result<String> {
    let stem = path.file_stem().map(|s| s.to_string_lossy());
    name_from(path, &stem.unwrap_or_default())
}

/// An object name from `text` (a file's stem, a directory's name): lower case, runs of other
/// characters made one `-`.
fn name_from(path: &Path, text: &str) -> Result<String> {
    let stem = text.to_ascii_lowercase();
    let mut name = String::new();
    for c in stem.chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c);
        } else if !name.ends_with('-') && !name.is_empty() {
            name.push('-');
        }
    }
    name.truncate(63);
    let name = name.trim_end_matches('-').to_string();
    if name.is_empty() {
        bail!(
            "{}: cannot make a Model name from the file name; pass --name",
            path.display()
        );
    }
    Ok(name)
}

/// The Model's metadata and spec; fields the file does not give are left out (placement then
/// estimates).
fn manifest(
    name: &str,
    path: &str,
    facts: &ModelFacts,
    file_bytes: u64,
) -> (ObjectMeta, ModelSpec) {
    let spec = facts.model_spec(path, file_bytes);
    let mut metadata = ObjectMeta {
        name: name.to_string(),
        ..ObjectMeta::default()
    };
    if let Some(q) = &facts.quantization
        && tb_api::name::validate_label_value(q).is_ok()
    {
        metadata.labels.insert("quantization".into(), q.clone());
    }
    let notes = [
        ("head-dim", facts.head_dim),
        ("feed-forward", facts.feed_forward),
    ];
    for (key, value) in notes {
        if let Some(v) = value {
            metadata.annotations.insert(key.into(), v.to_string());
        }
    }
    (metadata, spec)
}

/// The comment above the manifest: where it came from and what is not in the spec.
fn comment(path: &Path, header: &GgufHeader, f: &ModelFacts) -> String {
    let mut out = format!(
        "# Read from the GGUF header of {}\n# by `tbctl model inspect` (GGUF v{}, {} tensors{}).\n",
        path.display(),
        header.version,
        header.tensors.len(),
        f.name
            .as_deref()
            .map(|n| format!(", \"{n}\""))
            .unwrap_or_default()
    );
    let mut missing = Vec::new();
    for (field, v) in [
        ("layers", f.layers),
        ("hiddenSize", f.hidden_size),
        ("heads", f.heads),
        ("contextLength", f.context_length),
        ("vocabSize", f.vocab_size),
    ] {
        if tb_api::gguf::spec_count(v).is_none() {
            missing.push(field);
        }
    }
    if !missing.is_empty() {
        out.push_str(&format!(
            "# Not in the file (left out): {}.\n",
            missing.join(", ")
        ));
    }
    out.push_str(&format!(
        "# quantisation {}, head dim {}; source.path is where this machine has the file: every\n\
         # node that serves the model needs it there (or name the nodes that hold it in\n\
         # source.nodes; tb stages the layers to the others).\n",
        f.quantization.as_deref().unwrap_or("unknown"),
        f.head_dim
            .map(|d| d.to_string())
            .unwrap_or_else(|| "unknown".into())
    ));
    out
}

#[cfg(test)]
mod tests;
