//! The fuzz targets: one function per parser that takes outside input, each `fn(&[u8]) ->
//! String`. The string is the outcome with numbers and quoted text stripped (`ok`, or the kind
//! of error); the driver keeps inputs whose outcome it has not seen before as new seeds, a cheap
//! stand-in for coverage feedback. A target must never panic and never allocate from a claimed
//! size; an `Err` is the expected answer to most inputs.

use std::io::Cursor;
use std::path::Path;

use tb_api::CronSchedule;
use tb_api::gguf::GgufHeader;
use tb_api::lab::LabFile;
use tb_engine::gguf::{GgufIndex, parse_content};
use tb_engine::{ChatMessage, ChatTemplate, Tokenizer};
use tb_nodelet::builtin::messages::Step;
use tb_nodelet::builtin::openai::{parse_chat_request, parse_completion_request};
use tb_transport::bootstrap::{parse_greeting, read_answer};
use tb_transport::rdma::header::Header;
use tb_transport::rdma::qpinfo::QpInfo;
use tb_transport::wire::{FrameHeader, Hello, TensorHeader};

/// A target: parses the bytes, returns its outcome.
pub type Target = fn(&[u8]) -> String;

/// Every target, by name (the name is also its corpus and regression directory).
pub const TARGETS: &[(&str, Target)] = &[
    ("manifest", manifest),
    ("lab", lab),
    ("gguf_header", gguf_header),
    ("gguf_engine", gguf_engine),
    ("hf_config", hf_config),
    ("safetensors", safetensors),
    ("wire", wire),
    ("rdma_header", rdma_header),
    ("qpinfo", qpinfo),
    ("bootstrap", bootstrap),
    ("pipeline_step", pipeline_step),
    ("openai_chat", openai_chat),
    ("openai_completions", openai_completions),
    ("cron", cron),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The outcome's shape: letters and spaces only, quoted text dropped, at most 80 characters.
pub fn outcome<E: std::fmt::Display>(r: Result<impl Sized, E>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => shape(&e.to_string()),
    }
}

fn shape(text: &str) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in text.chars() {
        if std::mem::take(&mut escaped) {
            continue;
        }
        match quote {
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if matches!(c, '"' | '`' | '\'') => quote = Some(c),
            None if c.is_ascii_alphabetic() || c == ' ' => out.push(c),
            None => {}
        }
        if out.len() >= 80 {
            break;
        }
    }
    out
}

/// tb manifests: `tbctl apply -f` of any file (YAML documents with file:line errors).
pub fn manifest(data: &[u8]) -> String {
    outcome(tb_api::load_reader("fuzz.yaml", data))
}

/// Lab files (`tbctl lab`, the simulator): parsed, then checked for planning.
pub fn lab(data: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(data) else {
        return "not utf".into();
    };
    let strict = LabFile::parse("fuzz-lab.yaml", text).map(|l| {
        // What the nodelet (`--topology`) and the planner read from a lab.
        for m in &l.macs {
            let _ = l.mac(&m.name);
            let _ = l.ports_of(&m.name);
            let _ = (m.memory_bytes(), m.allocatable_bytes(), m.free_bytes());
            let _ = m.memory_bandwidth_gbs();
        }
        for link in &l.links {
            let _ = link.ends();
        }
        l.check_capacity()
    });
    let planning = LabFile::parse_for_planning("fuzz-lab.yaml", text);
    format!("{} / {}", outcome(strict), outcome(planning))
}

/// tb-api's std-only GGUF header reader (`tbctl model inspect`), and what is derived from it.
pub fn gguf_header(data: &[u8]) -> String {
    let header = GgufHeader::parse(Path::new("fuzz.gguf"), data);
    if let Ok(h) = &header {
        let _ = h.model_facts();
        let _ = h.missing_data();
        for t in &h.tensors {
            let _ = t.bytes();
        }
    }
    outcome(header)
}

/// tb-api's reader of a Hugging Face / MLX `config.json` (`tbctl model inspect DIR`).
pub fn hf_config(data: &[u8]) -> String {
    outcome(tb_api::hf::parse_config(Path::new("config.json"), data))
}

/// tb-api's reader of a `.safetensors` file's tensor table.
pub fn safetensors(data: &[u8]) -> String {
    outcome(tb_api::hf::parse_safetensors(
        Path::new("model.safetensors"),
        data,
    ))
}

/// The engine's GGUF path: candle's header parser, the model config, the tensor index, the
/// shard plans, the tokenizer and the chat template built from the header.
pub fn gguf_engine(data: &[u8]) -> String {
    let path = Path::new("fuzz.gguf");
    let content = match parse_content(path, data) {
        Ok(c) => c,
        Err(e) => return shape(&e.to_string()),
    };
    let index = match GgufIndex::from_content(path, content, data.len() as u64) {
        Ok(i) => i,
        Err(e) => return shape(&e.to_string()),
    };
    let layers = index.config().n_layers;
    for (first, count) in [
        (0, 1),
        (0, layers),
        (layers.saturating_sub(1), 1),
        (layers, 2),
    ] {
        let _ = index.tensors_for_blocks(first, count, layers);
        if let Ok(entries) = index.shard_tensors(first, count) {
            for e in entries {
                let _ = index.check_in_file(e);
            }
        }
    }
    let tokenizer = Tokenizer::from_gguf(index.content()).map(|t| {
        let ids = t.encode("Hello, world! ünïcödé 123").unwrap_or_default();
        let _ = t.decode(&ids);
    });
    let template = ChatTemplate::from_gguf(index.content())
        .map(|t| t.render(&[ChatMessage::new("user", "hi")], true));
    format!(
        "index ok, tokenizer {}, template {}",
        outcome(tokenizer),
        outcome(template)
    )
}

/// The TCP data plane's decoders: the hello, a frame header and a tensor header, each fed the
/// input.
pub fn wire(data: &[u8]) -> String {
    let mut hello = [0u8; Hello::LEN];
    let n = data.len().min(Hello::LEN);
    hello[..n].copy_from_slice(&data[..n]);
    let mut frame = [0u8; FrameHeader::LEN];
    let n = data.len().min(FrameHeader::LEN);
    frame[..n].copy_from_slice(&data[..n]);
    let h = Hello::decode(&hello, "fuzz");
    let f = FrameHeader::decode(&frame, 1, 1 << 30);
    let t = TensorHeader::decode(data, 1);
    if let Ok((t, _)) = &t {
        let _ = (t.numel(), t.payload_len(), t.len());
    }
    format!("{} / {} / {}", outcome(h), outcome(f), outcome(t))
}

/// The RDMA transport's 24-byte SEND header, for SENDs of every length up to the buffer's.
pub fn rdma_header(data: &[u8]) -> String {
    let mut last = String::new();
    for cut in [0, 1, 24, data.len() / 2] {
        last = outcome(Header::decode(data, data.len().saturating_sub(cut), 1));
    }
    let _ = Header::decode(data, data.len() + 1, 1);
    last
}

/// The RDMA queue-pair blob ranks exchange at bootstrap. The rank and world the decoder
/// expects are taken from the blob itself (bounded) so that most inputs get past that check.
pub fn qpinfo(data: &[u8]) -> String {
    let u32_at = |at: usize| {
        data.get(at..at + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let world = (u32_at(12) as usize).min(4096);
    let from = u32_at(8) as usize;
    outcome(QpInfo::decode(data, from, world))
}

/// The bootstrap all-gather: a joining rank's greeting as rank 0 reads it, and rank 0's answer
/// as a joining rank reads it (world taken from the input, bounded).
pub fn bootstrap(data: &[u8]) -> String {
    let mut head = [0u8; 16];
    let n = data.len().min(16);
    head[..n].copy_from_slice(&data[..n]);
    let world = data
        .get(4..8)
        .map_or(1, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .clamp(1, 4096);
    let greeting = parse_greeting(&head, world.max(2));
    let answer = read_answer(&mut Cursor::new(data), world).map_err(|e| format!("{e:?}"));
    format!("{} / {}", outcome(greeting), outcome(answer))
}

/// The control messages pipeline stages of a built-in service send each other.
pub fn pipeline_step(data: &[u8]) -> String {
    outcome(Step::decode(data))
}

/// The body of `POST /v1/chat/completions`.
pub fn openai_chat(data: &[u8]) -> String {
    outcome(
        parse_chat_request(data, "smollm2").map_err(|e| format!("{} {}", e.code(), e.message())),
    )
}

/// The body of `POST /v1/completions`.
pub fn openai_completions(data: &[u8]) -> String {
    outcome(
        parse_completion_request(data, "smollm2")
            .map_err(|e| format!("{} {}", e.code(), e.message())),
    )
}

/// Cron expressions of Schedule objects, then matched against a few minutes.
pub fn cron(data: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(data) else {
        return "not utf".into();
    };
    let schedule = CronSchedule::parse(text);
    if let Ok(s) = &schedule {
        for (mi, h, dom, mo, dow) in [(0, 0, 1, 1, 0), (59, 23, 31, 12, 6), (30, 2, 29, 2, 7)] {
            let _ = s.matches(mi, h, dom, mo, dow);
        }
    }
    outcome(schedule)
}
