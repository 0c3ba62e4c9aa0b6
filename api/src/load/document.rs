//! Reads one YAML document into a checked object, turning every failure into an error at a
//! file position: YAML syntax first, then apiVersion and kind, then the kind's typed fields
//! (with serde_yaml's positions), then the semantic checks of `validate_object` (positions found
//! by searching the text for the field).

use std::fmt;

use serde::de::{self, DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::LocatedError;
use super::locate::{duplicate_key, locate};
use super::split::Document;
use crate::kind::{KIND_LIST, Kind, UnknownKind};
use crate::meta::ObjectMeta;
use crate::object::{API_VERSION, Object};
use crate::serde_util::{integer_message, render_path};
use crate::specs::{
    AllocationSpec, EventSpec, InferenceServiceSpec, LinkSpec, ModelSpec, NodeSpec, QueueSpec,
    ScheduleSpec, Spec, TrainingJobSpec,
};
use crate::validate::{api_version_message, validate_object};

/// Errors of one document, positioned in its file.
pub(crate) struct DocErrors<'a> {
    pub file: &'a str,
    pub doc: &'a Document,
}

impl DocErrors<'_> {
    /// An error at a position inside the document (1-based, relative to `doc.text`).
    fn at(&self, (line, column): (usize, usize), path: &str, message: &str) -> LocatedError {
        LocatedError {
            file: self.file.to_string(),
            line: self.doc.first_line + line - 1,
            column,
            path: path.to_string(),
            message: message.to_string(),
        }
    }

    /// An error at `path`, placed by searching the text (the document's start if not found).
    pub(crate) fn at_path(&self, path: &str, message: &str) -> LocatedError {
        let pos =
            locate(&self.doc.text, path).unwrap_or((self.doc.start - self.doc.first_line + 1, 1));
        self.at(pos, path, message)
    }

    /// A YAML syntax error: libyaml's problem, without its document-relative position.
    fn syntax(&self, err: &serde_yaml::Error) -> LocatedError {
        let (pos, message) = split_yaml_message(err);
        if message.starts_with("repetition limit exceeded") {
            // serde_yaml gives no position; the expansion starts at the first alias.
            let pos = first_alias(&self.doc.text)
                .unwrap_or((self.doc.start - self.doc.first_line + 1, 1));
            return self.at(
                pos,
                "",
                "repetition limit exceeded: the aliases (*name) of this document expand to more \
                 than tb reads (an alias bomb?); the first alias is here",
            );
        }
        let pos = pos.unwrap_or((1, 1));
        // serde_yaml places a duplicate key at the start of its mapping; point at the duplicate.
        let pos = duplicated_key_name(&message)
            .and_then(|key| duplicate_key(&self.doc.text, pos, key))
            .unwrap_or(pos);
        self.at(pos, "", &message)
    }

    /// A typed-deserialisation error, with the path of the field and the best position known.
    fn typed(&self, err: &serde_path_to_error::Error<serde_yaml::Error>) -> LocatedError {
        let (pos, text) = split_yaml_message(err.inner());
        let full_path = render_path(err.path(), "");
        // serde_yaml prefixes its own idea of the path; strip it to get the bare message.
        let (yaml_path, message) = strip_path_prefix(&text, &full_path);
        let integer = integer_message(message);
        let message = integer.as_deref().unwrap_or(message);
        let path = render_path(err.path(), message);
        let structural = ["unknown field", "missing field", "duplicate field"]
            .iter()
            .any(|p| message.starts_with(p));
        match pos {
            // serde_yaml knew where it was when the error was raised.
            Some(pos) if structural || yaml_path == full_path => self.at(pos, &path, message),
            // The error was raised after the value was read (outside serde_yaml's view), so its
            // position is that of an enclosing mapping; the text search does better.
            Some(pos) => match locate(&self.doc.text, &path) {
                Some(found) => self.at(found, &path, message),
                None => self.at(pos, &path, message),
            },
            None => self.at_path(&path, message),
        }
    }
}

/// The first character YAML does not allow in a document (NUL and the other control
/// characters but tab and line ends), with its 1-based line and column: libyaml reports it at
/// the start of the document, by character count.
fn control_character(text: &str) -> Option<((usize, usize), char)> {
    for (n, line) in text.split('\n').enumerate() {
        for (col, c) in line.chars().enumerate() {
            let allowed = matches!(c, '\t' | '\r' | '\u{85}')
                || !(c.is_control() || c == '\u{feff}' && (n, col) != (0, 0))
                    && c != '\u{fffe}'
                    && c != '\u{ffff}';
            if !allowed {
                return Some(((n + 1, col + 1), c));
            }
        }
    }
    None
}

/// The 1-based position of the first alias (`*name`) outside quotes and comments.
fn first_alias(text: &str) -> Option<(usize, usize)> {
    for (n, line) in text.split('\n').enumerate() {
        let mut quote = None;
        let mut prev = ' ';
        for (col, c) in line.chars().enumerate() {
            match (quote, c) {
                (None, '#') if prev.is_whitespace() => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, '*') if matches!(prev, ' ' | '\t' | '[' | '{' | ',' | ':' | '-') => {
                    return Some((n + 1, col + 1));
                }
                _ => {}
            }
            prev = c;
        }
    }
    None
}

/// The first, YAML-only reading of a document: syntax errors, placed.
fn check_syntax(errors: &DocErrors<'_>) -> Result<(), LocatedError> {
    let text = &errors.doc.text;
    if let Some((pos, c)) = control_character(text) {
        let name = if c == '\0' { " (NUL)" } else { "" };
        return Err(errors.at(
            pos,
            "",
            &format!(
                "control character U+{:04X}{name} is not allowed in YAML; write it as an escape \
                 (\"\\u{:04X}\") inside double quotes if it belongs in a string",
                c as u32, c as u32
            ),
        ));
    }
    if let Some(pos) = super::depth::too_deep(text) {
        return Err(errors.at(
            pos,
            "",
            &format!(
                "[ and {{ nested more than {} levels deep; tb's objects need a handful",
                super::depth::MAX_FLOW_DEPTH
            ),
        ));
    }
    match serde_yaml::from_str::<serde_yaml::Value>(text) {
        Ok(_) => Ok(()),
        // serde_yaml's Value holds no integer wider than 64 bits; the typed reading says which
        // field it is and what range the field takes.
        Err(e)
            if e.to_string().contains(" as u128, expected any YAML value")
                || e.to_string().contains(" as i128, expected any YAML value") =>
        {
            Ok(())
        }
        Err(e) => Err(errors.syntax(&e)),
    }
}

/// serde_yaml's message and position, without the ` at line L column C` it appends.
fn split_yaml_message(err: &serde_yaml::Error) -> (Option<(usize, usize)>, String) {
    let text = err.to_string();
    match err.location() {
        Some(loc) => {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            let message = text.split(&suffix).next().unwrap_or(&text).to_string();
            (Some((loc.line(), loc.column())), message)
        }
        None => (None, text),
    }
}

/// `ranks` from serde_yaml's `spec: duplicate entry with key "ranks"`.
fn duplicated_key_name(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once("duplicate entry with key \"")?;
    rest.strip_suffix('"')
}

/// Removes a leading `PATH: ` where PATH is `full_path` or one of its ancestors, returning the
/// path that was removed ("" for none) and the rest.
fn strip_path_prefix<'t>(text: &'t str, full_path: &str) -> (String, &'t str) {
    let mut candidate = full_path.to_string();
    loop {
        if !candidate.is_empty()
            && let Some(rest) = text.strip_prefix(&format!("{candidate}: "))
        {
            return (candidate, rest);
        }
        match candidate.rfind(['.', '[']) {
            Some(cut) => candidate.truncate(cut),
            None if candidate.is_empty() => return (String::new(), text),
            None => candidate.clear(),
        }
    }
}

/// `apiVersion` that must be `tb/v1`; checked while reading so the error points at the value.
struct ApiVersion;

impl<'de> Deserialize<'de> for ApiVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ApiVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{API_VERSION:?}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ApiVersion, E> {
                if v == API_VERSION {
                    Ok(ApiVersion)
                } else {
                    Err(E::custom(api_version_message(v)))
                }
            }
        }
        d.deserialize_str(V)
    }
}

/// `kind`, resolved while reading so the error points at the value.
struct KindField(Kind);

impl<'de> Deserialize<'de> for KindField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KindField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a kind such as TrainingJob")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KindField, E> {
                Kind::parse(v)
                    .map(KindField)
                    .ok_or_else(|| E::custom(UnknownKind(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The first look at a document: only what decides how to read the rest.
#[derive(Deserialize)]
// serde's `expecting` takes only a literal, so the wording is repeated on TypedDocument.
#[serde(
    rename_all = "camelCase",
    expecting = "a tb object (a mapping with apiVersion, kind, metadata and spec)"
)]
struct Probe {
    api_version: Option<ApiVersion>,
    kind: Option<KindField>,
}

/// The whole document, with the kind's typed spec.
#[derive(Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    expecting = "a tb object (a mapping with apiVersion, kind, metadata and spec)"
)]
struct TypedDocument<S> {
    #[allow(dead_code)] // checked by Probe; listed so that it is not an unknown field
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: ObjectMeta,
    #[serde(default = "Option::default")]
    spec: Option<S>,
    #[serde(default)]
    status: Option<Value>,
}

fn deserialize<T: DeserializeOwned>(
    text: &str,
) -> Result<T, serde_path_to_error::Error<serde_yaml::Error>> {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
}

/// Reads the document as kind `S` and builds the generic object (not yet checked).
fn read_typed<S: Spec>(errors: &DocErrors<'_>) -> Result<Object, LocatedError> {
    let doc: TypedDocument<S> = deserialize(&errors.doc.text).map_err(|e| errors.typed(&e))?;
    let spec = match doc.spec {
        // A spec of strings, numbers and string-keyed maps always serialises.
        Some(spec) => {
            serde_json::to_value(spec).map_err(|e| errors.at_path("spec", &e.to_string()))?
        }
        None => Value::Null,
    };
    Ok(Object {
        api_version: API_VERSION.to_string(),
        kind: S::KIND.as_str().to_string(),
        metadata: doc.metadata,
        spec,
        status: doc.status.unwrap_or(Value::Null),
    })
}

/// Reads a whole file as one value of `T` (a file format that is not a tb object, such as a
/// lab description), then runs `check`, whose errors carry a field path; every error is placed
/// at its line and column.
pub(crate) fn load_typed_document<T: DeserializeOwned>(
    errors: &DocErrors<'_>,
    check: impl FnOnce(&T) -> Result<(), crate::validate::ValidationError>,
) -> Result<T, LocatedError> {
    let text = &errors.doc.text;
    check_syntax(errors)?;
    let value: T = deserialize(text).map_err(|e| errors.typed(&e))?;
    check(&value).map_err(|e| errors.at_path(&e.path, &e.message))?;
    Ok(value)
}

/// Reads and checks one document.
pub(crate) fn load_document(errors: &DocErrors<'_>) -> Result<Object, LocatedError> {
    let text = &errors.doc.text;
    check_syntax(errors)?;
    let probe: Probe = deserialize(text).map_err(|e| errors.typed(&e))?;
    if probe.api_version.is_none() {
        return Err(errors.at_path(
            "apiVersion",
            &format!("missing; expected apiVersion: {API_VERSION}"),
        ));
    }
    let Some(KindField(kind)) = probe.kind else {
        return Err(errors.at_path("kind", &format!("missing; expected one of {KIND_LIST}")));
    };
    let object = match kind {
        Kind::Model => read_typed::<ModelSpec>(errors),
        Kind::InferenceService => read_typed::<InferenceServiceSpec>(errors),
        Kind::TrainingJob => read_typed::<TrainingJobSpec>(errors),
        Kind::Schedule => read_typed::<ScheduleSpec>(errors),
        Kind::Queue => read_typed::<QueueSpec>(errors),
        Kind::Node => read_typed::<NodeSpec>(errors),
        Kind::Link => read_typed::<LinkSpec>(errors),
        Kind::Event => read_typed::<EventSpec>(errors),
        Kind::Allocation => read_typed::<AllocationSpec>(errors),
    }?;
    validate_object(&object).map_err(|e| errors.at_path(&e.path, &e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_only_path_prefixes() {
        assert_eq!(
            strip_path_prefix("spec: unknown field", "spec.rnaks"),
            ("spec".to_string(), "unknown field")
        );
        assert_eq!(
            strip_path_prefix("spec.ranks: invalid", "spec.ranks"),
            ("spec.ranks".to_string(), "invalid")
        );
        assert_eq!(
            strip_path_prefix("spec.command[2]: x", "spec.command[2]"),
            ("spec.command[2]".to_string(), "x")
        );
        assert_eq!(
            strip_path_prefix("unknown field", "spce"),
            (String::new(), "unknown field")
        );
        assert_eq!(
            strip_path_prefix("expected: x", ""),
            (String::new(), "expected: x")
        );
    }
}
