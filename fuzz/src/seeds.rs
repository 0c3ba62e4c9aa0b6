//! Seeds that are made rather than copied: a small but complete GGUF file (llama metadata, a
//! byte-level BPE vocabulary, a chat template, a tensor table and zeroed data), and encoded
//! transport frames. `tb-fuzz seed` writes them into the corpus; they are checked in.

use tb_transport::rdma::header::{FLAG_FIRST, FLAG_LAST, Header, KIND_CREDIT, KIND_DATA};
use tb_transport::rdma::qpinfo::QpInfo;
use tb_transport::rdma::verbs::{QpEndpoint, QpType};
use tb_transport::wire::{DType, FrameHeader, Hello, TensorHeader};

/// A GGUF metadata value, as written.
enum Meta<'a> {
    U32(u32),
    F32(f32),
    Str(&'a str),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_meta(out: &mut Vec<u8>, key: &str, v: &Meta) {
    put_str(out, key);
    match v {
        Meta::U32(x) => {
            out.extend_from_slice(&4u32.to_le_bytes());
            out.extend_from_slice(&x.to_le_bytes());
        }
        Meta::F32(x) => {
            out.extend_from_slice(&6u32.to_le_bytes());
            out.extend_from_slice(&x.to_le_bytes());
        }
        Meta::Str(s) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            put_str(out, s);
        }
        Meta::Strs(v) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&8u32.to_le_bytes());
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for s in v {
                put_str(out, s);
            }
        }
        Meta::I32s(v) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&5u32.to_le_bytes());
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
}

/// A GGUF v3 file of a two-layer llama with hidden size 8 and a 300-token byte-level vocabulary:
/// small, and valid for every GGUF reader tb has (all tensors F32, data zeroed).
pub fn tiny_gguf() -> Vec<u8> {
    const HIDDEN: u64 = 8;
    const FFN: u64 = 16;
    // GPT-2's byte alphabet: printable ASCII stands for itself; enough for a tokenizer to build.
    let mut tokens: Vec<String> = (0x21u8..=0x7e).map(|b| (b as char).to_string()).collect();
    tokens.extend(
        [
            "Ġ",
            "Ċ",
            "He",
            "ll",
            "llo",
            "Hello",
            "<|im_start|>",
            "<|im_end|>",
        ]
        .map(String::from),
    );
    let vocab = tokens.len() as u64;
    let types = vec![1i32; tokens.len()];
    let merges = vec![
        "H e".to_string(),
        "l l".to_string(),
        "ll o".to_string(),
        "He llo".to_string(),
    ];
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let meta: Vec<(&str, Meta)> = vec![
        ("general.architecture", Meta::Str("llama")),
        ("general.name", Meta::Str("tiny")),
        ("general.alignment", Meta::U32(32)),
        ("llama.block_count", Meta::U32(2)),
        ("llama.embedding_length", Meta::U32(HIDDEN as u32)),
        ("llama.attention.head_count", Meta::U32(2)),
        ("llama.attention.head_count_kv", Meta::U32(1)),
        ("llama.feed_forward_length", Meta::U32(FFN as u32)),
        ("llama.context_length", Meta::U32(64)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.pre", Meta::Str("smollm")),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.token_type", Meta::I32s(types)),
        ("tokenizer.ggml.merges", Meta::Strs(merges)),
        ("tokenizer.ggml.bos_token_id", Meta::U32(vocab as u32 - 2)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(vocab as u32 - 1)),
        ("tokenizer.chat_template", Meta::Str(template)),
    ];
    let mut tensors: Vec<(String, Vec<u64>)> =
        vec![("token_embd.weight".into(), vec![HIDDEN, vocab])];
    for b in 0..2 {
        tensors.push((format!("blk.{b}.attn_norm.weight"), vec![HIDDEN]));
        tensors.push((format!("blk.{b}.attn_q.weight"), vec![HIDDEN, HIDDEN]));
        tensors.push((format!("blk.{b}.ffn_up.weight"), vec![HIDDEN, FFN]));
    }
    tensors.push(("output_norm.weight".into(), vec![HIDDEN]));
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in &meta {
        put_meta(&mut out, k, v);
    }
    let mut offset = 0u64;
    for (name, dims) in &tensors {
        put_str(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&0u32.to_le_bytes()); // F32
        out.extend_from_slice(&offset.to_le_bytes());
        let bytes = dims.iter().product::<u64>() * 4;
        offset += bytes.div_ceil(32) * 32;
    }
    let data_start = out.len().div_ceil(32) * 32;
    out.resize(data_start + offset as usize, 0);
    out
}

/// Encoded transport messages, by target: what a well-behaved peer sends.
pub fn transport_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut seeds = Vec::new();
    let hello = Hello {
        rank: 1,
        world: 4,
        rail: 0,
        rails: 2,
    };
    seeds.push(("wire", "hello", hello.encode().to_vec()));
    let frame = FrameHeader {
        seq: 7,
        offset: 0,
        stripe_len: 64,
        total_len: 128,
    };
    seeds.push(("wire", "frame", frame.encode().to_vec()));
    let tensor = TensorHeader {
        dtype: DType::F32,
        shape: vec![2, 3],
    };
    let mut msg = vec![0u8; tensor.len() + 24];
    tensor.encode_into(&mut msg);
    seeds.push(("wire", "tensor-f32-2x3", msg));
    let scalar = TensorHeader {
        dtype: DType::U8,
        shape: vec![],
    };
    let mut msg = vec![0u8; scalar.len() + 1];
    scalar.encode_into(&mut msg);
    seeds.push(("wire", "tensor-u8-scalar", msg));

    let data = Header {
        kind: KIND_DATA,
        flags: FLAG_FIRST | FLAG_LAST,
        credits: 3,
        seq: 9,
        payload: 16,
        msg: 2,
        total: 16,
    };
    let mut send = vec![0u8; 24 + 16];
    data.encode(&mut send);
    seeds.push(("rdma_header", "data", send));
    let credit = Header {
        kind: KIND_CREDIT,
        flags: 0,
        credits: 8,
        seq: 10,
        payload: 0,
        msg: 0,
        total: 0,
    };
    let mut send = vec![0u8; 24];
    credit.encode(&mut send);
    seeds.push(("rdma_header", "credit", send));

    let endpoint = QpEndpoint {
        qpn: 0x1234,
        psn: 0x42,
        lid: 1,
        gid: [0xfe; 16],
        qp_type: QpType::Rc,
    };
    let info = QpInfo {
        rank: 1,
        world: 3,
        chunk: 65536,
        recv_depth: 64,
        endpoints: vec![Some(endpoint), None, Some(endpoint)],
    };
    seeds.push(("qpinfo", "rank1-of-3", info.encode()));

    // A greeting (rank 1 of 2, a 3-byte blob) and an answer for a world of 2.
    let mut greeting = Vec::new();
    for v in [u32::from_le_bytes(*b"TBB1"), 1, 2, 3] {
        greeting.extend_from_slice(&v.to_le_bytes());
    }
    greeting.extend_from_slice(b"abc");
    seeds.push(("bootstrap", "greeting", greeting));
    let mut answer = Vec::new();
    for v in [u32::from_le_bytes(*b"TBB1"), 2, 2] {
        answer.extend_from_slice(&v.to_le_bytes());
    }
    answer.extend_from_slice(b"r0");
    answer.extend_from_slice(&3u32.to_le_bytes());
    answer.extend_from_slice(b"abc");
    seeds.push(("bootstrap", "answer", answer));
    seeds
}
