//! Turns serde errors into a field path and a plain message, the two halves of every error a
//! user sees (`spec.ranks: invalid type: string "two", expected u32`).

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

use crate::validate::ValidationError;

/// Deserialises a JSON value, reporting the path of the first bad field relative to `v`.
pub(crate) fn from_value<T: DeserializeOwned>(v: &Value) -> Result<T, ValidationError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let message = json_message(e.inner());
        ValidationError::new(render_path(e.path(), &message), message)
    })
}

/// serde_json's message without its ` at line L column C` suffix, which means nothing to someone
/// who wrote YAML. Syntax errors keep it: there the position is all there is.
pub(crate) fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.is_syntax() || e.is_eof() || e.line() == 0 {
        return text;
    }
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// `spec.command[0]`. An unknown field is reported at the mapping that holds it
/// (`spec: unknown field "rnaks"`), because the name is in the message and the mapping is
/// where the fix goes.
pub(crate) fn render_path(path: &Path, message: &str) -> String {
    let mut segments: Vec<&Segment> = path.iter().collect();
    while matches!(segments.last(), Some(Segment::Unknown)) {
        segments.pop();
    }
    if message.starts_with("unknown field") && matches!(segments.last(), Some(Segment::Map { .. }))
    {
        segments.pop();
    }
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    out
}
