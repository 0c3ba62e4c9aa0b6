//! The GGUF index: header length, tensor byte ranges, and which tensors a shard needs.

mod common;

use tb_engine::GgufIndex;

#[test]
fn config_and_header() {
    let index = GgufIndex::open(&common::model_path()).expect("index");
    let c = index.config();
    assert_eq!(c.architecture, "llama");
    assert_eq!(
        (c.n_layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn),
        (30, 576, 9, 3, 64, 1536)
    );
    assert_eq!((c.vocab, c.context), (49152, 8192));
    assert_eq!(c.rope_theta, 100_000.0);
    let first = index.tensors().map(|t| t.offset).min().expect("tensors");
    assert_eq!(first, index.header_len());
    let end = index.tensors().map(|t| t.end()).max().expect("tensors");
    assert_eq!(
        end,
        index.file_len(),
        "tensor data runs to the end of the file"
    );
}

#[test]
fn middle_shard_lists_exactly_its_blocks() {
    let index = GgufIndex::open(&common::model_path()).expect("index");
    let n = index.config().n_layers;
    let (first, count) = (10, 5);
    let got = index.tensors_for_blocks(first, count, n);
    let mut names: Vec<&str> = got.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    let mut want: Vec<String> = index
        .tensors()
        .filter(|t| {
            tb_engine::gguf::block_index(&t.name)
                .is_some_and(|i| (first..first + count).contains(&i))
        })
        .map(|t| t.name.clone())
        .collect();
    want.sort();
    assert_eq!(names, want);
    assert_eq!(names.len(), count * 9, "9 tensors per llama block");
    assert!(
        got.windows(2).all(|w| w[0].offset < w[1].offset),
        "sorted by offset"
    );
    let all_blocks: u64 = index
        .tensors()
        .filter(|t| t.name.starts_with("blk."))
        .map(|t| t.len)
        .sum();
    let shard: u64 = got.iter().map(|t| t.len).sum();
    let expected = all_blocks as f64 * count as f64 / n as f64;
    assert!(
        (shard as f64 - expected).abs() / expected < 0.01,
        "shard {shard} bytes vs {expected}"
    );
}

#[test]
fn first_and_last_shards_have_embedding_and_head() {
    let index = GgufIndex::open(&common::model_path()).expect("index");
    let n = index.config().n_layers;
    let names = |f, c| -> Vec<String> {
        index
            .tensors_for_blocks(f, c, n)
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    let first = names(0, 3);
    assert!(first.contains(&"token_embd.weight".to_string()));
    assert!(!first.contains(&"output_norm.weight".to_string()));
    let last = names(20, 10);
    assert!(last.contains(&"output_norm.weight".to_string()));
    // SmolLM2 ties the output head to the embedding.
    assert!(index.tensor("output.weight").is_none());
    assert!(last.contains(&"token_embd.weight".to_string()));
    let whole = names(0, n);
    assert_eq!(whole.len(), index.tensors().count());
    assert!(index.shard_tensors(25, 10).is_err());
}
