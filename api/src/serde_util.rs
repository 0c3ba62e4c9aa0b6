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
    if e.is_syntax() || e.is_eof() {
        return text;
    }
    if e.line() == 0 {
        return integer_message(&text).unwrap_or(text);
    }
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text);
    integer_message(message).unwrap_or_else(|| message.to_string())
}

/// serde's words for a number that does not fit an integer field (`invalid value: integer
/// `99999999999999999999999` as u128, expected u32`, or `floating point `1e23`` from JSON,
/// which reads big numbers as floats) in the words of tb's other errors: `expected an integer
/// from 0 to 4294967295, found 99999999999999999999999`.
pub(crate) fn integer_message(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("invalid value: ")
        .or_else(|| message.strip_prefix("invalid type: "))?;
    let rest = rest
        .strip_prefix("integer `")
        .or_else(|| rest.strip_prefix("floating point `"))?;
    let (found, rest) = rest.split_once('`')?;
    let rest = rest
        .strip_prefix(" as u128")
        .or_else(|| rest.strip_prefix(" as i128"))
        .unwrap_or(rest);
    let expected = rest.strip_prefix(", expected ")?;
    let (min, max): (i128, i128) = match expected {
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" => (0, u64::MAX.into()),
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" => (i64::MIN.into(), i64::MAX.into()),
        // A field of any value (hyperparameters): it holds 64-bit numbers at most.
        "any YAML value" | "any valid JSON value" => (i64::MIN.into(), u64::MAX.into()),
        _ => return None,
    };
    Some(format!(
        "expected an integer from {min} to {max}, found {found}"
    ))
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
