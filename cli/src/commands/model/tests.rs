//! `model inspect` on small GGUF files written here (a llama header, a cut one, a directory),
//! on files that are not GGUF, and on the real SmolLM2 file when scripts/fetch-model.sh has
//! fetched it.

use super::*;

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A GGUF v3 header of a 2-block llama (hidden 64, 4 heads, 2 kv heads, Q4_1) followed by
/// `data` bytes of tensor data.
fn tiny_gguf(data: usize) -> Vec<u8> {
    let mut kv = Vec::new();
    let mut n_kv = 0u64;
    let kv_str = |kv: &mut Vec<u8>, k: &str, v: &str| {
        string(kv, k);
        kv.extend(8u32.to_le_bytes());
        string(kv, v);
    };
    kv_str(&mut kv, "general.architecture", "llama");
    n_kv += 1;
    for (k, v) in [
        ("general.file_type", 3u32),
        ("llama.block_count", 2),
        ("llama.embedding_length", 64),
        ("llama.attention.head_count", 4),
        ("llama.attention.head_count_kv", 2),
        ("llama.context_length", 2048),
        ("llama.vocab_size", 32),
        ("llama.feed_forward_length", 128),
    ] {
        string(&mut kv, k);
        kv.extend(4u32.to_le_bytes());
        kv.extend(v.to_le_bytes());
        n_kv += 1;
    }
    let mut tensors = Vec::new();
    let mut offset = 0u64;
    for b in 0..2 {
        string(&mut tensors, &format!("blk.{b}.attn_q.weight"));
        tensors.extend(2u32.to_le_bytes());
        tensors.extend(64u64.to_le_bytes());
        tensors.extend(64u64.to_le_bytes());
        tensors.extend(3u32.to_le_bytes());
        tensors.extend(offset.to_le_bytes());
        offset += 128 * 20;
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(2u64.to_le_bytes());
    out.extend(n_kv.to_le_bytes());
    out.extend(kv);
    out.extend(tensors);
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out.extend(vec![0u8; data]);
    out
}

/// Both blocks' data: 2 × 128 blocks of 20 bytes.
const FULL_DATA: usize = 2 * 128 * 20;

fn args(target: &Path) -> ModelInspectArgs {
    ModelInspectArgs {
        target: target.to_path_buf(),
        name: None,
        path: None,
    }
}

fn parse_manifest(text: &str) -> Object {
    let mut loaded = tb_api::load_str("inspect.yaml", text)
        .unwrap_or_else(|e| panic!("not a valid manifest ({e}):\n{text}"));
    assert_eq!(loaded.len(), 1, "{text}");
    loaded.remove(0).object
}

#[test]
fn a_small_llama_becomes_a_valid_model_manifest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("Tiny-Llama.Q4_1.gguf");
    std::fs::write(&file, tiny_gguf(FULL_DATA)).expect("write");
    let text = inspect(&args(&file)).expect("inspect");
    let obj = parse_manifest(&text);
    assert_eq!(obj.kind, "Model");
    assert_eq!(obj.metadata.name, "tiny-llama-q4-1");
    assert_eq!(obj.metadata.labels["quantization"], "Q4_1");
    assert_eq!(obj.metadata.annotations["head-dim"], "16");
    let spec = &obj.spec;
    assert_eq!(spec["architecture"], "llama");
    assert_eq!(spec["layers"], 2);
    assert_eq!(spec["hiddenSize"], 64);
    assert_eq!(
        (spec["heads"].clone(), spec["kvHeads"].clone()),
        (4.into(), 2.into())
    );
    assert_eq!(spec["contextLength"], 2048);
    assert_eq!(spec["vocabSize"], 32);
    assert!(
        spec.get("tiedEmbeddings").is_none(),
        "no embedding table in the file, so nothing tied"
    );
    assert_eq!(spec["bytesPerLayer"], "2560");
    let canonical = std::fs::canonicalize(&file).expect("canonical");
    assert_eq!(spec["source"]["path"], canonical.display().to_string());
    assert!(
        text.starts_with("# Read from the GGUF header of "),
        "{text}"
    );

    // A directory with that one file reads it; --name and --path replace the defaults.
    let a = ModelInspectArgs {
        target: dir.path().to_path_buf(),
        name: Some("tiny".into()),
        path: Some("~/models/tiny.gguf".into()),
    };
    let obj = parse_manifest(&inspect(&a).expect("dir"));
    assert_eq!(obj.metadata.name, "tiny");
    assert_eq!(obj.spec["source"]["path"], "~/models/tiny.gguf");
}

#[test]
fn bad_files_are_named_with_what_was_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = |path: &Path| format!("{:#}", inspect(&args(path)).expect_err("bad file"));

    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, tiny_gguf(100)).expect("write");
    let e = err(&cut);
    assert!(
        e.contains("cut.gguf: truncated") && e.contains("blk.1.attn_q.weight"),
        "{e}"
    );

    let header_cut = dir.path().join("header.gguf");
    std::fs::write(&header_cut, &tiny_gguf(0)[..60]).expect("write");
    let e = err(&header_cut);
    assert!(
        e.contains("header.gguf: ") && e.contains("truncated"),
        "{e}"
    );

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, world").expect("write");
    let e = err(&text);
    assert!(
        e.contains("notes.txt: not a GGUF file") && e.contains("\"hell\""),
        "{e}"
    );

    let e = err(&dir.path().join("absent.gguf"));
    assert!(e.contains("absent.gguf"), "{e}");

    let empty = tempfile::tempdir().expect("tempdir");
    let e = err(empty.path());
    assert!(
        e.contains("no .gguf file") && e.contains("safetensors"),
        "{e}"
    );

    // The directory now holds two: it must be told which.
    let e = err(dir.path());
    assert!(
        e.contains(".gguf files here") && e.contains("cut.gguf"),
        "{e}"
    );

    let good = empty.path().join("good.gguf");
    std::fs::write(&good, tiny_gguf(FULL_DATA)).expect("write");
    let bad_name = ModelInspectArgs {
        target: good,
        name: Some("Not A Name".into()),
        path: None,
    };
    let e = format!("{:#}", inspect(&bad_name).expect_err("bad name"));
    assert!(e.starts_with("--name:"), "{e}");
}

#[test]
fn names_from_file_names() {
    let n = |s: &str| name_from_file(Path::new(s)).ok();
    assert_eq!(
        n("/m/SmolLM2-135M-Instruct.Q4_1.gguf").as_deref(),
        Some("smollm2-135m-instruct-q4-1")
    );
    assert_eq!(n("/m/__x__.gguf").as_deref(), Some("x"));
    assert_eq!(n("/m/___.gguf"), None);
    let long = format!("/m/{}.gguf", "a".repeat(100));
    assert_eq!(n(&long).map(|s| s.len()), Some(63));
}

/// The model scripts/fetch-model.sh fetches (also used by the engine's and the end-to-end tests).
fn smollm2() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

#[test]
fn smollm2_matches_the_checked_in_manifest() {
    let obj = parse_manifest(&inspect(&args(&smollm2())).expect("inspect SmolLM2"));
    let spec = &obj.spec;
    assert_eq!(obj.metadata.name, "smollm2-135m-instruct-q4-1");
    assert_eq!(obj.metadata.annotations["head-dim"], "64");
    // manifests/model-smollm2.yaml states the same facts.
    let checked_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/model-smollm2.yaml"),
    )
    .expect("read the manifest");
    let manifest = parse_manifest(&checked_in);
    for field in [
        "architecture",
        "layers",
        "hiddenSize",
        "heads",
        "kvHeads",
        "contextLength",
        "vocabSize",
        "tiedEmbeddings",
    ] {
        assert_eq!(spec[field], manifest.spec[field], "spec.{field}");
    }
    let bytes = std::fs::metadata(smollm2()).expect("size").len();
    let total = tb_api::Quantity::parse(spec["totalBytes"].as_str().expect("totalBytes"))
        .expect("quantity");
    assert_eq!(total.bytes(), bytes);

    // Cut short, the same file is refused as truncated.
    let dir = tempfile::tempdir().expect("tempdir");
    let cut = dir.path().join("smollm2-cut.gguf");
    let all = std::fs::read(smollm2()).expect("read");
    std::fs::write(&cut, &all[..all.len() / 2]).expect("write");
    let e = format!("{:#}", inspect(&args(&cut)).expect_err("cut"));
    assert!(e.contains("smollm2-cut.gguf: truncated: tensor"), "{e}");
}

/// The KV cache one layer reserves for 4096 tokens of one sequence, as placement sizes it from
/// the manifest `tbctl model inspect` prints for a fixture directory.
fn kv_per_layer(fixture: &str, context: u32) -> (Object, u64) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../api/tests/fixtures/hf")
        .join(fixture);
    let obj = parse_manifest(&inspect(&args(&dir)).expect("inspect"));
    let spec: tb_api::specs::ModelSpec =
        serde_json::from_value(obj.spec.clone()).expect("a Model spec");
    let shape = tb_core::placement::ModelShape::from_spec(fixture, &spec, Some(context), Some(1))
        .expect("placeable");
    (obj, shape.kv_bytes_per_layer())
}

#[test]
fn model_directories_become_manifests_that_size_the_kv_cache_right() {
    // K and V (2) × KV heads × head size × tokens × 2 bytes, worked by hand from each config.
    let cases: [(&str, u64); 7] = [
        ("llama-3.1-8b", 2 * 8 * 128 * 4096 * 2),
        // 128-value heads, not 5120 / 64 = 80.
        ("qwen3-32b", 2 * 8 * 128 * 4096 * 2),
        ("qwen3-0.6b-mlx-4bit", 2 * 8 * 128 * 4096 * 2),
        // One latent of 512 + 64 per token, whatever the 128 heads.
        ("deepseek-v3", (512 + 64) * 4096 * 2),
        ("kimi-k2", (512 + 64) * 4096 * 2),
        // Half the layers keep 128 tokens, half all 4096: 2112 on average.
        ("gpt-oss-120b", 2 * 8 * 64 * 2112 * 2),
        ("mistral-7b-v0.1", 2 * 8 * 128 * 4096 * 2),
    ];
    for (fixture, expected) in cases {
        let (obj, kv) = kv_per_layer(fixture, 4096);
        assert_eq!(kv, expected, "{fixture}");
        assert_eq!(obj.metadata.name, fixture.replace('.', "-"));
    }
    // Mistral's window caps its cache at 4096 tokens whatever the context.
    assert_eq!(
        kv_per_layer("mistral-7b-v0.1", 32_768).1,
        kv_per_layer("mistral-7b-v0.1", 4096).1
    );
    // The MLX conversion is an mlx Model; the others safetensors.
    let (mlx, _) = kv_per_layer("qwen3-0.6b-mlx-4bit", 4096);
    assert_eq!(mlx.spec["format"], "mlx");
    let (deepseek, _) = kv_per_layer("deepseek-v3", 4096);
    assert_eq!(deepseek.spec["format"], "safetensors");
    assert_eq!(deepseek.spec["expertsPerToken"], 8);
    assert!(deepseek.spec.get("activeBytes").is_some());
    assert_eq!(deepseek.metadata.annotations["parameters"], "671026419200");
}
