//! The model's tokenizer, built from the GGUF metadata (`tokenizer.ggml.*`): a byte-level BPE
//! (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizer named by `tokenizer.ggml.pre`, control
//! tokens (`<|im_start|>`, ...) matched whole, and a streaming [`Decoder`] that yields text only at
//! UTF-8 boundaries.
//!
//! candle's `TokenizerFromGguf` is not used because it does not know SmolLM2's pre-tokenizer
//! (`smollm`): for it the pre-tokenizer must be `Sequence[Digits(individual_digits=true),
//! ByteLevel(add_prefix_space=false, use_regex=true)]`, as in SmolLM2's `tokenizer.json`.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::AddedToken;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::tokenizer::SplitDelimiterBehavior;

use crate::error::{EngineError, Result};
use crate::gguf::{read_content, value_as_u64};

const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token type of a control token in `tokenizer.ggml.token_type` (llama.cpp's enum).
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

fn tok_err(detail: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer {
        detail: detail.to_string(),
    }
}

/// A byte-level BPE tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bytes: Arc<Vec<Vec<u8>>>,
    bos: Option<u32>,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.bytes.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

fn string_array(content: &Content, key: &str) -> Result<Vec<String>> {
    let v = content
        .metadata
        .get(key)
        .ok_or_else(|| tok_err(format!("GGUF metadata key {key} is missing")))?;
    let arr = v
        .to_vec()
        .map_err(|_| tok_err(format!("{key} is not an array")))?;
    arr.iter()
        .map(|x| {
            x.to_string()
                .cloned()
                .map_err(|_| tok_err(format!("{key} has a non-string element {x:?}")))
        })
        .collect()
}

fn id_key(content: &Content, key: &str) -> Option<u32> {
    content
        .metadata
        .get(key)
        .and_then(value_as_u64)
        .and_then(|x| u32::try_from(x).ok())
}

fn pre_tokenizer(pre: &str) -> Result<(PreTokenizerWrapper, bool)> {
    let split = |re: &str| {
        Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tok_err)
    };
    Ok(match pre {
        "smollm" => (
            Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            false,
        ),
        "qwen2" | "deepseek-r1-qwen" => (
            Sequence::new(vec![
                split(REGEX_QWEN2)?.into(),
                ByteLevel::new(false, false, false).into(),
            ])
            .into(),
            true,
        ),
        "llama-bpe" | "llama3" | "smaug-bpe" => (
            Sequence::new(vec![
                split(REGEX_LLAMA3)?.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into(),
            false,
        ),
        other => {
            if other != "gpt2" && other != "default" {
                tracing::warn!(
                    pre = other,
                    "unknown tokenizer.ggml.pre; using the GPT-2 byte-level pre-tokenizer"
                );
            }
            (ByteLevel::new(false, true, true).into(), false)
        }
    })
}

/// GPT-2's byte <-> printable-char table: the char that stands for each byte.
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + extra).unwrap_or('\u{FFFD}');
            extra += 1;
            c
        };
    }
    table
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let model = content
            .metadata
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if model != "gpt2" {
            return Err(tok_err(format!(
                "tokenizer.ggml.model is {model:?}; only byte-level BPE (\"gpt2\") is supported"
            )));
        }
        let tokens = string_array(content, "tokenizer.ggml.tokens")?;
        let merges = string_array(content, "tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| tok_err(format!("invalid merge {m:?} in tokenizer.ggml.merges")))
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let pre = content
            .metadata
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_else(|| "gpt2".into());
        let (pre_tok, nfc) = pre_tokenizer(&pre)?;
        inner.with_pre_tokenizer(Some(pre_tok));
        if nfc {
            inner.with_normalizer(Some(NFC)).map_err(tok_err)?;
        }
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let types: Vec<u64> = match content.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().map(|v| value_as_u64(v).unwrap_or(1)).collect(),
            _ => Vec::new(),
        };
        let bos = id_key(content, "tokenizer.ggml.bos_token_id");
        let eos_id = id_key(content, "tokenizer.ggml.eos_token_id");
        let mut special_ids: HashSet<u32> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == TOKEN_TYPE_CONTROL)
            .map(|(i, _)| i as u32)
            .collect();
        special_ids.extend(bos.iter().chain(eos_id.iter()));
        let mut specials: Vec<u32> = special_ids
            .iter()
            .copied()
            .filter(|&i| (i as usize) < tokens.len())
            .collect();
        specials.sort_unstable();
        inner
            .add_special_tokens(
                specials
                    .iter()
                    .map(|&i| AddedToken::from(tokens[i as usize].clone(), true))
                    .collect::<Vec<_>>(),
            )
            .map_err(tok_err)?;
        let user: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == TOKEN_TYPE_USER_DEFINED)
            .filter_map(|(i, _)| tokens.get(i))
            .map(|t| AddedToken::from(t.clone(), false).normalized(false))
            .collect();
        if !user.is_empty() {
            inner.add_tokens(user).map_err(tok_err)?;
        }

        let chars = byte_chars();
        let char_to_byte: std::collections::HashMap<char, u8> = chars
            .iter()
            .enumerate()
            .map(|(b, c)| (*c, b as u8))
            .collect();
        let bytes: Vec<Vec<u8>> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if special_ids.contains(&(i as u32))
                    || types.get(i) == Some(&TOKEN_TYPE_USER_DEFINED)
                {
                    t.as_bytes().to_vec()
                } else {
                    let mut out = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match char_to_byte.get(&c) {
                            Some(b) => out.push(*b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                }
            })
            .collect();

        let mut eos: Vec<u32> = eos_id.into_iter().collect();
        for name in [
            "<|im_end|>",
            "<|endoftext|>",
            "<|eot_id|>",
            "<|end_of_text|>",
        ] {
            if let Some(id) = tokens.iter().position(|t| t == name).map(|i| i as u32)
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        tracing::debug!(
            vocab = tokens.len(),
            pre,
            ?bos,
            ?eos,
            "tokenizer built from GGUF"
        );
        Ok(Self {
            inner,
            bytes: Arc::new(bytes),
            bos,
            eos,
        })
    }

    /// Reads the GGUF header at `path` and builds the tokenizer.
    pub fn from_file(path: &Path) -> Result<Self> {
        let (content, _) = read_content(path)?;
        Self::from_gguf(&content)
    }

    /// Token ids of `text`; special tokens written in the text (e.g. `<|im_start|>`) are matched
    /// whole; no BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens included as text).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.bytes.len()) {
            return Err(EngineError::BadToken {
                id,
                vocab: self.bytes.len(),
            });
        }
        self.inner.decode(ids, false).map_err(tok_err)
    }

    /// The raw bytes a token stands for.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(Vec::as_slice)
    }

    /// The id of a token by its text (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// Ids that end generation: `tokenizer.ggml.eos_token_id` plus `<|im_end|>`,
    /// `<|endoftext|>`, `<|eot_id|>`, `<|end_of_text|>` where the vocabulary has them.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The underlying `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// A streaming decoder.
    pub fn decoder(&self) -> Decoder {
        Decoder {
            bytes: self.bytes.clone(),
            pending: Vec::new(),
        }
    }
}

/// Incremental detokenizer: feed token ids, get text only when it forms complete UTF-8.
#[derive(Debug, Clone)]
pub struct Decoder {
    bytes: Arc<Vec<Vec<u8>>>,
    pending: Vec<u8>,
}

impl Decoder {
    /// Adds a token; returns the text that became complete (possibly empty). Unknown ids are
    /// ignored.
    pub fn push(&mut self, id: u32) -> String {
        if let Some(b) = self.bytes.get(id as usize) {
            self.pending.extend_from_slice(b);
        }
        self.take_valid()
    }

    fn take_valid(&mut self) -> String {
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Bytes that can never become valid UTF-8 are emitted lossily; an incomplete
                    // sequence at the end waits for the next token.
                    let take = match e.error_len() {
                        Some(bad) => valid + bad,
                        None => valid,
                    };
                    out.push_str(&String::from_utf8_lossy(&self.pending[..take]));
                    self.pending.drain(..take);
                    if e.error_len().is_none() {
                        return out;
                    }
                }
            }
        }
    }

    /// Flushes any incomplete trailing bytes (lossily).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::{Decoder, byte_chars};
    use std::sync::Arc;

    #[test]
    fn decoder_emits_at_utf8_boundaries() {
        let mut d = Decoder {
            bytes: Arc::new(vec![
                vec![0xE2],
                vec![0x82],
                vec![0xAC],
                vec![0xFF],
                b"ok".to_vec(),
            ]),
            pending: Vec::new(),
        };
        assert_eq!(d.push(0), "");
        assert_eq!(d.push(1), "");
        assert_eq!(d.push(2), "\u{20AC}");
        assert_eq!(d.push(3), "\u{FFFD}");
        assert_eq!(d.push(0), "");
        assert_eq!(d.push(4), "\u{FFFD}ok");
        assert_eq!(d.push(0), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    #[test]
    fn byte_table_is_gpt2() {
        let t = byte_chars();
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[b' ' as usize], '\u{120}');
        assert_eq!(t[b'\n' as usize], '\u{10A}');
        let set: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(set.len(), 256);
    }
}
