//! The GGUF header reader against files written here: a small llama, every truncation of it,
//! and hostile headers (wrong magic, huge counts, huge strings, deep arrays).

use super::*;

/// Writes GGUF bytes the way llama.cpp lays them out.
#[derive(Default)]
struct Writer {
    kv: Vec<u8>,
    kv_count: u64,
    tensors: Vec<u8>,
    tensor_count: u64,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    fn key(&mut self, key: &str, ty: u32) -> &mut Vec<u8> {
        self.kv_count += 1;
        string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        &mut self.kv
    }
    fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.key(key, 4).extend(v.to_le_bytes());
        self
    }
    fn str(&mut self, key: &str, v: &str) -> &mut Self {
        let out = self.key(key, 8);
        string(out, v);
        self
    }
    fn strings(&mut self, key: &str, items: &[&str]) -> &mut Self {
        let out = self.key(key, 9);
        out.extend(8u32.to_le_bytes());
        out.extend((items.len() as u64).to_le_bytes());
        for s in items {
            string(out, s);
        }
        self
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32) -> &mut Self {
        self.tensor_count += 1;
        string(&mut self.tensors, name);
        self.tensors.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.tensors.extend(d.to_le_bytes());
        }
        self.tensors.extend(ty.to_le_bytes());
        self.tensors.extend(0u64.to_le_bytes());
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.tensor_count.to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.tensors);
        out
    }
}

/// A two-block llama: hidden 64, 4 heads of 16, 2 kv heads, Q4_1 blocks.
fn tiny_llama() -> Vec<u8> {
    let mut w = Writer::default();
    w.str("general.architecture", "llama")
        .str("general.name", "Tiny Llama")
        .u32("general.file_type", 3)
        .u32("llama.block_count", 2)
        .u32("llama.embedding_length", 64)
        .u32("llama.attention.head_count", 4)
        .u32("llama.attention.head_count_kv", 2)
        .u32("llama.feed_forward_length", 128)
        .u32("llama.context_length", 2048)
        .strings("tokenizer.ggml.tokens", &["<s>", "</s>", "a", "b", "c"]);
    w.tensor("token_embd.weight", &[64, 5], 0);
    for b in 0..2 {
        w.tensor(&format!("blk.{b}.attn_q.weight"), &[64, 64], 3)
            .tensor(&format!("blk.{b}.attn_norm.weight"), &[64], 0);
    }
    w.bytes()
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

#[test]
fn reads_a_small_llama() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(&dir, "tiny.gguf", &tiny_llama());
    let h = GgufHeader::read(&path).expect("valid");
    assert_eq!(h.version, 3);
    assert_eq!(h.tensors.len(), 5);
    let f = h.model_facts();
    assert_eq!(f.architecture, "llama");
    assert_eq!(f.name.as_deref(), Some("Tiny Llama"));
    assert_eq!(
        (f.layers, f.hidden_size, f.heads, f.kv_heads, f.head_dim),
        (Some(2), Some(64), Some(4), Some(2), Some(16))
    );
    assert_eq!(
        (f.feed_forward, f.context_length, f.vocab_size),
        (Some(128), Some(2048), Some(5))
    );
    assert_eq!(f.quantization.as_deref(), Some("Q4_1"));
    // 64×64 Q4_1: 128 blocks of 20 bytes; the norm 64 F32.
    assert_eq!(f.bytes_per_layer, Some(128 * 20 + 64 * 4));
    assert_eq!(f.tensor_bytes, 64 * 5 * 4 + 2 * (128 * 20 + 64 * 4));
    // Every tensor here claims offset 0 and the file holds no data at all.
    let missing = h.missing_data().expect("no tensor data in the file");
    assert_eq!(missing.file_bytes, h.file_bytes);
    assert!(missing.ends_at > h.file_bytes);
}

#[test]
fn an_embedding_table_without_an_output_head_is_tied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tied = GgufHeader::read(&write(&dir, "tied.gguf", &tiny_llama())).expect("valid");
    assert!(tied.model_facts().tied_embeddings);
    let mut w = Writer::default();
    w.str("general.architecture", "llama")
        .tensor("token_embd.weight", &[64, 5], 0)
        .tensor("output.weight", &[64, 5], 0);
    let untied = GgufHeader::read(&write(&dir, "untied.gguf", &w.bytes())).expect("valid");
    assert!(!untied.model_facts().tied_embeddings);
}

#[test]
fn without_file_type_the_blocks_dominant_type_is_the_quantisation() {
    let mut w = Writer::default();
    w.str("general.architecture", "qwen2")
        .tensor("blk.0.ffn_up.weight", &[256, 256], 12)
        .tensor("blk.0.attn_q.weight", &[256, 32], 14)
        .tensor("blk.0.attn_norm.weight", &[256], 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(&dir, "q.gguf", &w.bytes());
    let f = GgufHeader::read(&path).expect("valid").model_facts();
    assert_eq!(f.quantization.as_deref(), Some("Q4_K"));
    assert_eq!(f.layers, None, "no block_count in the file");
}

#[test]
fn every_truncation_is_an_error_naming_the_file() {
    let bytes = tiny_llama();
    let dir = tempfile::tempdir().expect("tempdir");
    for cut in 0..bytes.len() {
        let path = write(&dir, "cut.gguf", &bytes[..cut]);
        let e = GgufHeader::read(&path).expect_err(&format!("cut at {cut}"));
        let msg = e.to_string();
        assert!(msg.contains("cut.gguf"), "cut at {cut}: {msg}");
        if cut < 4 {
            assert!(
                matches!(e, GgufError::NotGguf { .. }),
                "cut at {cut}: {msg}"
            );
        } else {
            assert!(
                matches!(e, GgufError::Truncated { .. } | GgufError::Corrupt { .. }),
                "cut at {cut}: {msg}"
            );
        }
    }
}

#[test]
fn a_file_that_is_not_gguf_says_what_it_starts_with() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(&dir, "model.safetensors", b"{\"__metadata__\": {}}");
    let msg = GgufHeader::read(&path).expect_err("json").to_string();
    assert!(msg.contains("model.safetensors"), "{msg}");
    assert!(
        msg.contains("not a GGUF file") && msg.contains("\"GGUF\""),
        "{msg}"
    );
}

#[test]
fn old_versions_are_refused_by_number() {
    let mut bytes = tiny_llama();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(&dir, "v1.gguf", &bytes);
    let msg = GgufHeader::read(&path).expect_err("v1").to_string();
    assert!(msg.contains("version 1") && msg.contains("2 or 3"), "{msg}");
}

#[test]
fn huge_counts_and_lengths_are_refused_before_allocating() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A metadata count of 2^63.
    let mut bytes = MAGIC.to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend((1u64 << 63).to_le_bytes());
    let path = write(&dir, "count.gguf", &bytes);
    let msg = GgufHeader::read(&path).expect_err("count").to_string();
    assert!(
        msg.contains("metadata entries") && msg.contains("byte 16"),
        "{msg}"
    );

    // A key claiming 2^40 bytes.
    let mut bytes = MAGIC.to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend((1u64 << 40).to_le_bytes());
    bytes.extend([0u8; 16]);
    let path = write(&dir, "key.gguf", &bytes);
    let msg = GgufHeader::read(&path).expect_err("key").to_string();
    assert!(
        msg.contains("metadata key #0") && msg.contains("claims"),
        "{msg}"
    );

    // An array of 2^60 u64.
    let mut w = Writer::default();
    let out = w.key("x", 9);
    out.extend(10u32.to_le_bytes());
    out.extend((1u64 << 60).to_le_bytes());
    let path = write(&dir, "array.gguf", &w.bytes());
    let msg = GgufHeader::read(&path).expect_err("array").to_string();
    assert!(msg.contains("x:") && msg.contains("claimed"), "{msg}");

    // A tensor with 9 dimensions.
    let mut w = Writer {
        tensor_count: 1,
        ..Writer::default()
    };
    string(&mut w.tensors, "t");
    w.tensors.extend(9u32.to_le_bytes());
    w.tensors.extend([0u8; 100]);
    let path = write(&dir, "dims.gguf", &w.bytes());
    let msg = GgufHeader::read(&path).expect_err("dims").to_string();
    assert!(msg.contains("tensor t: 9 dimensions"), "{msg}");
}

#[test]
fn unknown_types_and_deep_arrays_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = Writer::default();
    w.key("odd", 99).extend([0u8; 16]);
    let path = write(&dir, "type.gguf", &w.bytes());
    let msg = GgufHeader::read(&path).expect_err("type").to_string();
    assert!(msg.contains("odd: unknown value type 99"), "{msg}");

    let mut w = Writer::default();
    let out = w.key("deep", 9);
    for _ in 0..5 {
        out.extend(9u32.to_le_bytes());
        out.extend(1u64.to_le_bytes());
    }
    out.extend([0u8; 64]);
    let path = write(&dir, "deep.gguf", &w.bytes());
    let msg = GgufHeader::read(&path).expect_err("deep").to_string();
    assert!(msg.contains("deep: arrays nested deeper"), "{msg}");
}

#[test]
fn a_directory_is_not_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let msg = GgufHeader::read(dir.path()).expect_err("dir").to_string();
    assert!(msg.contains("directory"), "{msg}");
}
