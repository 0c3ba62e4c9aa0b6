use super::*;

fn fixture(name: &str) -> HfFacts {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name);
    read_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Within `percent` of `published`.
fn near(what: &str, got: u64, published: f64, percent: f64) {
    let off = (got as f64 - published).abs() / published * 100.0;
    assert!(
        off <= percent,
        "{what}: {got} is {off:.2} % from the published {published}"
    );
}

/// Published "active" counts leave out the input embedding (it is indexed, not multiplied).
fn active_without_embedding(f: &HfFacts) -> u64 {
    f.active_parameters - u64::from(f.vocab_size) * u64::from(f.hidden_size)
}

#[test]
fn llama_3_1_8b_counted_by_hand() {
    let f = fixture("llama-3.1-8b");
    // Per block: q and o 4096×4096, k and v 4096×1024, MLP 3×4096×14336, two norms.
    let block: u64 = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
    assert_eq!(block, 218_112_000);
    // 32 blocks, embeddings and head of 128256×4096 (not tied), the final norm.
    assert_eq!(f.parameters, 32 * block + 2 * 128_256 * 4096 + 4096);
    assert_eq!(
        f.parameters, 8_030_261_248,
        "Llama 3.1 8B's published count"
    );
    assert_eq!(f.bytes_per_layer, 2 * block, "bfloat16");
    assert_eq!(f.total_bytes, 2 * f.parameters);
    assert_eq!((f.heads, f.kv_heads, f.head_dim), (32, 8, 128));
    assert_eq!(f.active_bytes, f.total_bytes, "dense");
    assert_eq!(f.context_length, Some(131_072));
    assert_eq!(f.bytes_from, BytesFrom::Shape);
}

#[test]
fn qwen3_heads_are_not_hidden_over_heads() {
    let f = fixture("qwen3-32b");
    assert_eq!((f.hidden_size, f.heads, f.head_dim), (5120, 64, 128));
    assert_ne!(f.head_dim, f.hidden_size / f.heads);
    near("Qwen3-32B parameters", f.parameters, 32.8e9, 0.5);
    assert_eq!(f.sliding_window, None, "use_sliding_window is false");
    let small = fixture("qwen3-0.6b-mlx-4bit");
    assert!(small.tied_embeddings);
    assert_eq!(
        (small.hidden_size, small.heads, small.head_dim),
        (1024, 16, 128)
    );
    // 0.6B, of which 0.44B outside the embeddings (Qwen3's model card).
    near("Qwen3-0.6B parameters", small.parameters, 0.596e9, 0.5);
    near(
        "Qwen3-0.6B non-embedding",
        small.parameters - 151_936 * 1024,
        0.44e9,
        0.5,
    );
    // 4 bits + a 16-bit scale and bias per 64: 4.5 bits for nearly everything.
    assert_eq!(small.precision, "mlx 4-bit (group 64)");
    near(
        "MLX 4-bit bytes",
        small.total_bytes,
        0.596e9 * 4.5 / 8.0,
        1.0,
    );
}

#[test]
fn deepseek_v3_and_kimi_k2_use_latent_attention_and_experts() {
    let f = fixture("deepseek-v3");
    assert_eq!((f.kv_lora_rank, f.qk_rope_head_dim), (Some(512), Some(64)));
    assert_eq!(
        (f.experts, f.experts_per_token, f.shared_experts),
        (Some(256), Some(8), Some(1))
    );
    assert_eq!(f.head_dim, 128 + 64);
    // 671B in all, 37B activated (36.6B without the embedding), from DeepSeek-V3's report.
    near("DeepSeek-V3 parameters", f.parameters, 671e9, 0.5);
    near(
        "DeepSeek-V3 active",
        active_without_embedding(&f),
        36.6e9,
        0.5,
    );
    // fp8 in the blocks: about a byte a parameter.
    near("DeepSeek-V3 bytes", f.total_bytes, 673e9, 1.0);
    assert!(f.active_bytes < f.total_bytes / 15);

    let k = fixture("kimi-k2");
    assert_eq!((k.experts, k.experts_per_token), (Some(384), Some(8)));
    assert_eq!(k.kv_lora_rank, Some(512));
    // Kimi-K2: 1T in all (1.03T counted), 32B activated.
    near("Kimi-K2 parameters", k.parameters, 1.026e12, 0.5);
    near("Kimi-K2 active", active_without_embedding(&k), 32e9, 1.0);
}

#[test]
fn gpt_oss_slides_every_other_layer_and_stores_experts_in_four_bits() {
    let f = fixture("gpt-oss-120b");
    assert_eq!(
        (f.sliding_window, f.sliding_window_layers),
        (Some(128), Some(18))
    );
    assert_eq!((f.heads, f.kv_heads, f.head_dim), (64, 8, 64));
    assert_eq!((f.experts, f.experts_per_token), (Some(128), Some(4)));
    // OpenAI's model card: 116.83B in all, 5.13B active per token.
    near("gpt-oss-120b parameters", f.parameters, 116.83e9, 0.1);
    near(
        "gpt-oss-120b active",
        active_without_embedding(&f),
        5.13e9,
        0.5,
    );
    // mxfp4 experts (4.25 bits) and bfloat16 elsewhere: the 120b checkpoint is about 65 GB.
    near("gpt-oss-120b bytes", f.total_bytes, 65.2e9, 1.0);
}

#[test]
fn mistral_7b_slides_every_layer() {
    let f = fixture("mistral-7b-v0.1");
    assert_eq!(f.parameters, 7_241_732_096, "Mistral 7B's published count");
    assert_eq!(
        (f.sliding_window, f.sliding_window_layers),
        (Some(4096), Some(32))
    );
}

/// A safetensors file: the header for `tensors` (name, bytes), then that many zero bytes.
fn safetensors(tensors: &[(&str, u64)]) -> Vec<u8> {
    let mut offset = 0;
    let mut table = serde_json::Map::new();
    table.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    for (name, bytes) in tensors {
        table.insert(
            (*name).into(),
            serde_json::json!({"dtype": "BF16", "shape": [bytes / 2], "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let header = serde_json::to_vec(&table).expect("json");
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.resize(out.len() + offset as usize, 0);
    out
}

#[test]
fn safetensors_headers_give_the_real_sizes() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 8,
            "num_attention_heads": 2, "vocab_size": 16, "num_local_experts": 4,
            "num_experts_per_tok": 1}"#,
    )
    .expect("config");
    std::fs::write(
        dir.path().join("model-00001-of-00002.safetensors"),
        safetensors(&[
            ("model.embed_tokens.weight", 256),
            ("model.layers.0.self_attn.q_proj.weight", 100),
            ("model.layers.0.block_sparse_moe.experts.0.w1.weight", 40),
            ("model.layers.0.block_sparse_moe.experts.1.w1.weight", 40),
        ]),
    )
    .expect("shard 1");
    std::fs::write(
        dir.path().join("model-00002-of-00002.safetensors"),
        safetensors(&[
            ("model.layers.0.block_sparse_moe.experts.2.w1.weight", 40),
            ("model.layers.0.block_sparse_moe.experts.3.w1.weight", 40),
            ("model.layers.1.self_attn.q_proj.weight", 100),
            ("lm_head.weight", 256),
        ]),
    )
    .expect("shard 2");
    let f = read_dir(dir.path()).expect("reads");
    assert_eq!(f.bytes_from, BytesFrom::Safetensors(2));
    assert_eq!(f.total_bytes, 256 + 100 + 4 * 40 + 100 + 256);
    assert_eq!(f.bytes_per_layer, 100 + 4 * 40, "layer 0, the larger");
    // One expert of four per token: three quarters of 160 bytes are not read.
    assert_eq!(f.active_bytes, f.total_bytes - 120);
}

#[test]
fn hostile_files_are_refused_with_the_file_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.safetensors");
    // A header length past the end of the file.
    let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
    bytes.extend(b"{}");
    std::fs::write(&path, &bytes).expect("write");
    let err = read_safetensors_header(&path)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("x.safetensors") && err.contains("cut short"),
        "{err}"
    );
    // Offsets outside the data.
    let header = br#"{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1600]}}"#;
    let err = parse_safetensors_header(&path, header, 16)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("outside the 16 bytes"), "{err}");
    // A config that is not a model's.
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "bert"}"#).expect("write");
    let err = read_dir(dir.path()).expect_err("refused").to_string();
    assert!(
        err.contains("config.json") && err.contains("num_hidden_layers"),
        "{err}"
    );
    std::fs::write(dir.path().join("config.json"), "{ not json").expect("write");
    let err = read_dir(dir.path()).expect_err("refused").to_string();
    assert!(err.contains("not JSON") && err.contains("line 1"), "{err}");
}
