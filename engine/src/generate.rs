//! `Engine`: single-process generation over one [`Shard`] holding every block, with the
//! tokenizer and chat template from the same GGUF. It is the reference the pipeline runtime is
//! checked against, and what `tb-enginebench` measures: the prompt is prefilled in one forward
//! call, then tokens are decoded one by one until an end-of-sequence token, a stop string or
//! `max_tokens`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::{EngineError, Result};
use crate::gguf::GgufIndex;
use crate::sample::{Sampler, SamplingParams, StopMatcher};
use crate::shard::{LoadOptions, Shard, StageInput, StageOutput, default_device};
use crate::tokenizer::Tokenizer;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` (or the context length) was reached.
    Length,
}

/// The result of [`Engine::generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated token ids (an end-of-sequence token that ended generation is not included).
    pub tokens: Vec<u32>,
    /// Generated text (cut before a stop string).
    pub text: String,
    pub finish_reason: FinishReason,
    /// Logits from which the last token was sampled.
    pub last_logits: Vec<f32>,
    pub prompt_tokens: usize,
    /// Time to first token: prefill + sampling the first token.
    pub ttft: Duration,
    /// Tokens per second after the first one (0 when fewer than two were generated).
    pub decode_tokens_per_s: f64,
}

/// A whole model in one process.
#[derive(Debug)]
pub struct Engine {
    shard: Shard,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

const SEQ: u64 = 0;

fn logits(out: StageOutput) -> Result<Vec<f32>> {
    match out {
        StageOutput::Logits(l) => Ok(l),
        StageOutput::Hidden(_) => Err(EngineError::BadInput {
            detail: "the engine's shard did not produce logits".into(),
        }),
    }
}

impl Engine {
    /// Loads every block of the GGUF at `path`, its tokenizer and chat template.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self> {
        let index = GgufIndex::open(path)?;
        let tokenizer = Tokenizer::from_gguf(index.content())?;
        let template = ChatTemplate::from_gguf(index.content())?;
        let shard = Shard::from_index(&index, 0, index.config().n_layers, opts, &default_device())?;
        Ok(Self {
            shard,
            tokenizer,
            template,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    pub fn shard_mut(&mut self) -> &mut Shard {
        &mut self.shard
    }

    /// Renders `messages` with the chat template (with the generation prompt) and tokenizes it.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self.template.render(messages, true)?;
        self.tokenizer.encode(&text)
    }

    /// Generates a continuation of `prompt_tokens`.
    pub fn generate(
        &mut self,
        prompt_tokens: &[u32],
        params: &SamplingParams,
    ) -> Result<Generation> {
        self.generate_stream(prompt_tokens, params, |_| {})
    }

    /// [`Self::generate`], calling `on_text` with each piece of text as soon as it is final.
    pub fn generate_stream(
        &mut self,
        prompt_tokens: &[u32],
        params: &SamplingParams,
        mut on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        let context = self.shard.context();
        if prompt_tokens.len() > context {
            return Err(EngineError::ContextExceeded {
                tokens: prompt_tokens.len(),
                context,
            });
        }
        let started = Instant::now();
        let mut sampler = Sampler::new(params);
        let mut decoder = self.tokenizer.decoder();
        let mut stops = StopMatcher::new(&params.stop);
        let eos = self.tokenizer.eos_ids().to_vec();
        let mut text = String::new();
        let mut tokens = Vec::new();
        let mut finish = FinishReason::Length;
        let mut pos = 0;
        let mut last_logits = Vec::new();
        let mut ttft = Duration::ZERO;
        let mut first_at = started;
        let mut input = StageInput::Tokens(prompt_tokens.to_vec());
        let result = (|| -> Result<()> {
            while tokens.len() < params.max_tokens {
                let n = match &input {
                    StageInput::Tokens(t) => t.len(),
                    StageInput::Hidden(a) => a.tokens,
                };
                if pos + n > context {
                    break; // FinishReason::Length
                }
                let out = self.shard.forward(
                    SEQ,
                    std::mem::replace(&mut input, StageInput::Tokens(Vec::new())),
                    pos,
                )?;
                pos += n;
                last_logits = logits(out)?;
                let next = sampler.sample(&last_logits);
                if tokens.is_empty() {
                    ttft = started.elapsed();
                    first_at = Instant::now();
                }
                if eos.contains(&next) {
                    finish = FinishReason::Stop;
                    break;
                }
                tokens.push(next);
                let check = stops.push(&decoder.push(next));
                text.push_str(&check.text);
                on_text(&check.text);
                if check.stopped {
                    finish = FinishReason::Stop;
                    break;
                }
                input = StageInput::Tokens(vec![next]);
            }
            Ok(())
        })();
        self.shard.drop_sequence(SEQ);
        result?;
        if finish == FinishReason::Length || !stops.stopped() {
            let rest = stops.push(&decoder.finish());
            let mut tail = rest.text;
            if !rest.stopped {
                tail.push_str(&stops.finish());
            } else {
                finish = FinishReason::Stop;
            }
            text.push_str(&tail);
            on_text(&tail);
        }
        let decode_tokens_per_s = if tokens.len() > 1 {
            (tokens.len() - 1) as f64 / first_at.elapsed().as_secs_f64().max(1e-9)
        } else {
            0.0
        };
        tracing::debug!(
            prompt = prompt_tokens.len(),
            generated = tokens.len(),
            ?finish,
            ttft_ms = ttft.as_millis() as u64,
            decode_tokens_per_s,
            "generation done"
        );
        Ok(Generation {
            tokens,
            text,
            finish_reason: finish,
            last_logits,
            prompt_tokens: prompt_tokens.len(),
            ttft,
            decode_tokens_per_s,
        })
    }
}
