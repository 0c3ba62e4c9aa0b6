//! Reading JSON sent to the API (objects, statuses, events) as strictly as tbctl reads YAML:
//! serde_json keeps the last of two equal keys in a mapping without a word, where YAML refuses
//! them, so one pass looks for duplicates (with the path of the mapping that has them) before
//! the text is read into a value.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::bounds::Quoted;
use crate::serde_util::{json_message, render_path};
use crate::validate::ValidationError;

/// Any JSON value, read only to find a mapping with the same key twice.
struct NoDuplicateKeys;

impl<'de> de::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeys)
    }
}

impl<'de> Visitor<'de> for NoDuplicateKeys {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(de::Error::custom(format!(
                    "duplicate entry with key {}",
                    Quoted(&key)
                )));
            }
            map.next_value::<NoDuplicateKeys>()?;
            seen.insert(key);
        }
        Ok(self)
    }
}

/// Refuses a JSON text that names one key twice in a mapping, reporting the mapping's path.
pub(crate) fn check_duplicate_keys(text: &str) -> Result<(), ValidationError> {
    let mut de = serde_json::Deserializer::from_str(text);
    // Deep nesting is refused by serde_json's recursion limit (128), as for any JSON it reads.
    serde_path_to_error::deserialize::<_, NoDuplicateKeys>(&mut de).map_err(|e| {
        let message = json_message(e.inner());
        ValidationError::new(render_path(e.path(), &message), message)
    })?;
    Ok(())
}

/// Reads JSON into `T` after [`check_duplicate_keys`], with the path of the first bad field.
pub(crate) fn from_json_strict<T: DeserializeOwned>(text: &str) -> Result<T, ValidationError> {
    check_duplicate_keys(text)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let message = json_message(e.inner());
        ValidationError::new(render_path(e.path(), &message), message)
    })?;
    de.end()
        .map_err(|e| ValidationError::new("", json_message(&e)))?;
    Ok(value)
}

/// Reads JSON sent to the API strictly (no duplicate keys) and bounded like an object, for
/// kinds of input that are not objects to apply (events).
pub fn parse_json_strict<T: DeserializeOwned>(text: &str) -> Result<T, ValidationError> {
    if text.len() > crate::bounds::MAX_OBJECT_BYTES {
        return Err(ValidationError::new(
            "",
            format!(
                "{} bytes; at most {} may be sent",
                text.len(),
                crate::bounds::describe_bytes(crate::bounds::MAX_OBJECT_BYTES)
            ),
        ));
    }
    from_json_strict(text)
}

/// A status as the API receives it: strict JSON, bounded in size, of the shape every kind's
/// status shares.
pub fn parse_status_json(kind: crate::Kind, text: &str) -> Result<Value, ValidationError> {
    let status: Value = from_json_strict(text).map_err(|e| e.under("status"))?;
    crate::validate::validate_status_size(&status)?;
    crate::validate::validate_status(kind, &status)?;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_with_their_mapping() {
        let err =
            check_duplicate_keys(r#"{"spec": {"ranks": 1, "x": [1], "ranks": 2}}"#).unwrap_err();
        assert_eq!(err.path, "spec");
        assert!(
            err.message
                .starts_with("duplicate entry with key \"ranks\""),
            "{err}"
        );
        let err = check_duplicate_keys(r#"{"a": [{"b": 1}, {"c": 1, "c": 1}]}"#).unwrap_err();
        assert_eq!(err.path, "a[1]");
        // The same key in different mappings is fine.
        check_duplicate_keys(r#"{"a": {"k": 1}, "b": {"k": 1}, "k": null}"#).unwrap();
    }

    #[test]
    fn statuses_are_read_strictly() {
        let err = parse_status_json(crate::Kind::TrainingJob, r#"{"phase": "a", "phase": "b"}"#)
            .unwrap_err();
        assert_eq!(err.path, "status");
        assert!(err.message.contains("duplicate entry"), "{err}");
        let big = format!(r#"{{"message": "{}"}}"#, "x".repeat(2 << 20));
        let err = parse_status_json(crate::Kind::TrainingJob, &big).unwrap_err();
        assert!(err.message.contains("at most 1.5 MiB"), "{err}");
        assert!(parse_status_json(crate::Kind::TrainingJob, r#"{"phase": "Running"}"#).is_ok());
    }
}
