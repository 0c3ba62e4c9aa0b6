//! Chat prompts: renders the model's Jinja chat template (GGUF key `tokenizer.chat_template`)
//! with minijinja, configured like Hugging Face's `apply_chat_template` (trim_blocks,
//! lstrip_blocks, Python string methods, `raise_exception`). A GGUF without a template falls back
//! to ChatML ([`CHATML_TEMPLATE`]).

use candle_core::quantized::gguf_file::Content;
use minijinja::{Environment, ErrorKind, context};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::gguf::value_as_u64;

/// The ChatML template used when the GGUF has no `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const NAME: &str = "chat";

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    source: String,
}

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::ChatTemplate {
        detail: e.to_string(),
    }
}

fn token_text(content: &Content, key: &str) -> String {
    let id = content.metadata.get(key).and_then(value_as_u64);
    let tokens = content
        .metadata
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.to_vec().ok());
    match (id, tokens) {
        (Some(id), Some(tokens)) => tokens
            .get(id as usize)
            .and_then(|t| t.to_string().ok())
            .cloned()
            .unwrap_or_default(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// Compiles a Jinja template; `bos_token` / `eos_token` are visible to it.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(NAME, source.to_string())
            .map_err(err)?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            source: source.to_string(),
        })
    }

    /// ChatML (`<|im_start|>role\ncontent<|im_end|>\n`).
    pub fn chatml() -> Self {
        // The constant template is known to compile.
        Self::new(CHATML_TEMPLATE, "", "<|im_end|>")
            .unwrap_or_else(|e| panic!("ChatML template: {e}"))
    }

    /// The template of a GGUF file (`tokenizer.chat_template`); ChatML when the file has none.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let bos = token_text(content, "tokenizer.ggml.bos_token_id");
        let eos = token_text(content, "tokenizer.ggml.eos_token_id");
        match content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
        {
            Some(src) => Self::new(src, &bos, &eos),
            None => {
                tracing::info!("GGUF has no tokenizer.chat_template; using ChatML");
                Self::new(CHATML_TEMPLATE, &bos, &eos)
            }
        }
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; with `add_generation_prompt` the prompt ends where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(err)?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(err)
    }
}
