//! Training data: JSONL datasets in the formats mlx_lm.lora and TRL read, turned into
//! [`Example`]s (tokens + loss mask), and deterministic batching.
//!
//! One JSON object per line (blank lines are skipped), each in one of three formats:
//!
//! - `{"messages": [{"role": "...", "content": "..."}, ...]}`: rendered with the model's chat
//!   template; the loss is on the assistant messages only (each one's tokens through the end of
//!   its turn, e.g. `<|im_end|>`). The mask comes from rendering prefixes: the tokens of
//!   `messages[..i]` with the generation prompt and of `messages[..=i]` bracket assistant
//!   message i. A template that does not render prefixes as token prefixes is refused.
//! - `{"prompt": "...", "completion": "..."}`: like mlx_lm (which applies the chat template when
//!   the tokenizer has one, and tb's always has one, ChatML at worst), rendered as the
//!   conversation `[user: prompt, assistant: completion]`, loss on the completion's turn only.
//! - `{"text": "..."}`: the text's tokens plus an end-of-sequence token, loss on all of them.
//!
//! Errors name the file and line and say what was expected: not JSON, not an object, a missing
//! field or one of the wrong type, an empty file, no assistant tokens, and a sequence longer
//! than the maximum (refused, with its length — never truncated).
//!
//! Batching ([`Batches`]): the examples are visited in epochs, each a permutation of all of
//! them drawn from (seed, epoch); the global batch of step s is items `s·B .. (s+1)·B` of that
//! endless stream, so a resumed run needs only the step. Rank r of W takes items r, r+W, ... of
//! the global batch. [`split_eval`] holds out a fraction of the examples, chosen by the seed.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::tokenizer::Tokenizer;

use super::Example;
use super::rng::SplitMix64;

/// Larger dataset files are refused.
pub const MAX_FILE_BYTES: u64 = 4 << 30;

/// A dataset problem, with the file and (1-based) line where there is one.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    File { path: PathBuf, detail: String },
    #[error("{path}:{line}: {detail}")]
    Line {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    #[error(
        "{path}:{line}: the example is {tokens} tokens long, more than the maximum of {max} (it is refused, not truncated)"
    )]
    TooLong {
        path: PathBuf,
        line: usize,
        tokens: usize,
        max: usize,
    },
}

impl DataError {
    /// The line the error is about, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            DataError::Line { line, .. } | DataError::TooLong { line, .. } => Some(*line),
            _ => None,
        }
    }
}

/// Reads the JSONL dataset at `path` (see the module doc). `max_len` caps an example's tokens.
pub fn load_jsonl(
    path: &Path,
    tok: &Tokenizer,
    template: &ChatTemplate,
    max_len: usize,
) -> Result<Vec<Example>, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_FILE_BYTES {
        return Err(DataError::File {
            path: path.to_path_buf(),
            detail: format!("{size} bytes; at most {MAX_FILE_BYTES} are read"),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let text = String::from_utf8(bytes).map_err(|e| DataError::File {
        path: path.to_path_buf(),
        detail: format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
    })?;
    parse_jsonl(path, &text, tok, template, max_len)
}

/// One non-blank line of a dataset (line `line_no` of `path`, which name it in errors): a
/// record fetched from another Mac is read exactly as the same line of the whole file.
pub fn parse_record(
    path: &Path,
    line_no: usize,
    line: &str,
    tok: &Tokenizer,
    template: &ChatTemplate,
    max_len: usize,
) -> Result<Example, DataError> {
    let err = |detail: String| DataError::Line {
        path: path.to_path_buf(),
        line: line_no,
        detail,
    };
    let value: Value = serde_json::from_str(line)
        .map_err(|e| err(format!("not JSON (column {}): {e}", e.column())))?;
    let ex = example(&value, tok, template).map_err(err)?;
    if ex.tokens.len() > max_len {
        return Err(DataError::TooLong {
            path: path.to_path_buf(),
            line: line_no,
            tokens: ex.tokens.len(),
            max: max_len,
        });
    }
    if ex.target_count() == 0 {
        return Err(err("the example has no tokens to learn from".into()));
    }
    Ok(ex)
}

/// [`load_jsonl`] of text already read (`path` names it in errors).
pub fn parse_jsonl(
    path: &Path,
    text: &str,
    tok: &Tokenizer,
    template: &ChatTemplate,
    max_len: usize,
) -> Result<Vec<Example>, DataError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_record(path, i + 1, line, tok, template, max_len)?);
    }
    if out.is_empty() {
        return Err(DataError::File {
            path: path.to_path_buf(),
            detail: "no examples (the file is empty); expected one JSON object per line".into(),
        });
    }
    Ok(out)
}

const FORMATS: &str =
    "expected an object with \"messages\", with \"prompt\" and \"completion\", or with \"text\"";

fn string_field(obj: &serde_json::Map<String, Value>, key: &str) -> Result<String, String> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!(
            "field \"{key}\" is {}, expected a string",
            kind(other)
        )),
        None => Err(format!("missing field \"{key}\"")),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One line's example.
fn example(value: &Value, tok: &Tokenizer, template: &ChatTemplate) -> Result<Example, String> {
    let Value::Object(obj) = value else {
        return Err(format!("{} is not an object; {FORMATS}", kind(value)));
    };
    if let Some(messages) = obj.get("messages") {
        let Value::Array(items) = messages else {
            return Err(format!(
                "field \"messages\" is {}, expected an array of {{\"role\", \"content\"}} objects",
                kind(messages)
            ));
        };
        let mut msgs = Vec::with_capacity(items.len());
        for (j, m) in items.iter().enumerate() {
            let Value::Object(m) = m else {
                return Err(format!(
                    "messages[{j}] is {}, expected an object with \"role\" and \"content\"",
                    kind(m)
                ));
            };
            let role = string_field(m, "role").map_err(|e| format!("messages[{j}]: {e}"))?;
            let content = string_field(m, "content").map_err(|e| format!("messages[{j}]: {e}"))?;
            msgs.push(ChatMessage::new(role, content));
        }
        if !msgs.iter().any(|m| m.role == "assistant") {
            return Err("\"messages\" has no assistant message to learn from".into());
        }
        return chat_example(&msgs, tok, template);
    }
    if obj.contains_key("prompt") || obj.contains_key("completion") {
        let prompt = string_field(obj, "prompt")?;
        let completion = string_field(obj, "completion")?;
        let msgs = [
            ChatMessage::new("user", prompt),
            ChatMessage::new("assistant", completion),
        ];
        return chat_example(&msgs, tok, template);
    }
    if obj.contains_key("text") {
        let text = string_field(obj, "text")?;
        let mut tokens = tok.encode(&text).map_err(|e| e.to_string())?;
        if let Some(&eos) = tok.eos_ids().first()
            && tokens.last() != Some(&eos)
        {
            tokens.push(eos);
        }
        let loss_mask = vec![true; tokens.len()];
        return Ok(Example { tokens, loss_mask });
    }
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    Err(format!("{FORMATS}; found the fields {keys:?}"))
}

/// A conversation with loss on its assistant messages (see the module doc).
fn chat_example(
    msgs: &[ChatMessage],
    tok: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Example, String> {
    let encode = |m: &[ChatMessage], generation_prompt: bool| -> Result<Vec<u32>, String> {
        let text = template
            .render(m, generation_prompt)
            .map_err(|e| format!("rendering with the chat template: {e}"))?;
        tok.encode(&text).map_err(|e| e.to_string())
    };
    let tokens = encode(msgs, false)?;
    let mut loss_mask = vec![false; tokens.len()];
    for (i, m) in msgs.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let before = encode(&msgs[..i], true)?;
        let through = encode(&msgs[..=i], false)?;
        if !through.starts_with(&before) || !tokens.starts_with(&through) {
            return Err(format!(
                "the chat template does not render the conversation up to message {i} as a \
                 prefix of the whole, so its assistant tokens cannot be found; \
                 use the \"text\" format for this data"
            ));
        }
        for flag in &mut loss_mask[before.len()..through.len()] {
            *flag = true;
        }
    }
    Ok(Example { tokens, loss_mask })
}

/// Deterministic batches over `n` examples (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Batches {
    n: usize,
    batch_size: usize,
    seed: u64,
}

impl Batches {
    /// Batches of `batch_size` (>= 1) over examples `0..n` (n >= 1), shuffled per epoch from
    /// `seed`.
    pub fn new(n: usize, batch_size: usize, seed: u64) -> Self {
        Self {
            n: n.max(1),
            batch_size: batch_size.max(1),
            seed,
        }
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The order of epoch `epoch`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.n).collect();
        SplitMix64::derive(self.seed, &[0xE90C, epoch]).shuffle(&mut order);
        order
    }

    /// The epoch (0-based) step `step` starts in.
    pub fn epoch_of(&self, step: u64) -> u64 {
        step * self.batch_size as u64 / self.n as u64
    }

    /// Indices of the examples of step `step`'s global batch.
    pub fn global_batch(&self, step: u64) -> Vec<usize> {
        let first = step * self.batch_size as u64;
        let n = self.n as u64;
        let mut out = Vec::with_capacity(self.batch_size);
        let mut cached: Option<(u64, Vec<usize>)> = None;
        for p in first..first + self.batch_size as u64 {
            let epoch = p / n;
            if cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
                cached = Some((epoch, self.epoch_order(epoch)));
            }
            if let Some((_, order)) = &cached {
                out.push(order[(p % n) as usize]);
            }
        }
        out
    }

    /// Rank `rank` of `world`'s share of step `step`: items rank, rank + world, ... of the
    /// global batch.
    pub fn rank_batch(&self, step: u64, rank: usize, world: usize) -> Vec<usize> {
        self.global_batch(step)
            .into_iter()
            .skip(rank)
            .step_by(world.max(1))
            .collect()
    }
}

/// Splits `0..n` into (train, eval) indices, both ascending: `round(n · fraction)` examples
/// chosen by `seed` are held out (at least one when fraction > 0, and never all of them).
pub fn split_eval(n: usize, fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::derive(seed, &[0xE7A1]).shuffle(&mut order);
    let mut k = (n as f64 * fraction.clamp(0.0, 1.0)).round() as usize;
    if fraction > 0.0 {
        k = k.max(1);
    }
    k = k.min(n.saturating_sub(1));
    let mut eval = order[..k].to_vec();
    let mut train = order[k..].to_vec();
    eval.sort_unstable();
    train.sort_unstable();
    (train, eval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_each_epoch_once_and_ranks_partition_the_batch() {
        let b = Batches::new(10, 4, 3);
        let mut seen: Vec<usize> = Vec::new();
        // Steps 0, 1 and the first half of 2 are epoch 0.
        seen.extend(b.global_batch(0));
        seen.extend(b.global_batch(1));
        seen.extend(b.global_batch(2).into_iter().take(2));
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(b.global_batch(5), Batches::new(10, 4, 3).global_batch(5));
        assert_ne!(b.epoch_order(0), b.epoch_order(1));
        let g = b.global_batch(7);
        let mut parts: Vec<usize> = (0..3).flat_map(|r| b.rank_batch(7, r, 3)).collect();
        parts.sort_unstable();
        let mut whole = g.clone();
        whole.sort_unstable();
        assert_eq!(parts, whole);
        assert_eq!(b.rank_batch(7, 1, 3), vec![g[1]]);
    }

    #[test]
    fn eval_split_is_seeded_and_disjoint() {
        let (t, e) = split_eval(20, 0.1, 9);
        assert_eq!(e.len(), 2);
        assert_eq!(t.len(), 18);
        assert!(e.iter().all(|i| !t.contains(i)));
        assert_eq!(split_eval(20, 0.1, 9), (t, e));
        assert_eq!(split_eval(1, 0.5, 0).1.len(), 0);
        assert_eq!(split_eval(5, 0.0, 0).1.len(), 0);
    }
}
