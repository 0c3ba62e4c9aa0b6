//! The order a struct declares its fields in, recorded in its JSON schema.
//!
//! schemars keeps an object's properties in a `serde_json::Map`, which sorts its keys unless
//! serde_json's `preserve_order` feature is on — and that feature would change the key order of
//! every JSON document tb writes (stored objects, `-o json`). So each documented struct carries
//! its serde field names, in declaration order, under [`FIELD_ORDER`]; `tbctl explain` lists
//! fields in that order, as the types (and the manifests in the docs) do.
//!
//! The names come from serde itself: a derived `Deserialize` hands the list of its (renamed)
//! field names to `Deserializer::deserialize_struct`, and [`FieldNames`] is a deserializer that
//! only takes that list.

use schemars::Schema;
use serde::Deserialize;
use serde::de::{self, Visitor};

/// The schema keyword holding the field names in declaration order.
pub const FIELD_ORDER: &str = "x-field-order";

/// A schemars transform: `#[schemars(transform = crate::explain::declaration_order::<Self>)]`
/// on a struct deriving both `Deserialize` and `JsonSchema`.
pub fn declaration_order<T: for<'de> Deserialize<'de>>(schema: &mut Schema) {
    if let Some(names) = serde_field_names::<T>() {
        schema.insert(FIELD_ORDER.into(), names.into());
    }
}

/// The serialized field names of a struct deriving `Deserialize`; None for other shapes.
fn serde_field_names<T: for<'de> Deserialize<'de>>() -> Option<&'static [&'static str]> {
    match T::deserialize(FieldNames) {
        Err(Probe::Fields(names)) => Some(names),
        _ => None,
    }
}

/// A deserializer that never produces a value: it stops at `deserialize_struct` with the names.
struct FieldNames;

#[derive(Debug)]
enum Probe {
    Fields(&'static [&'static str]),
    NotAStruct,
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("only reads the field names of a struct")
    }
}

impl std::error::Error for Probe {}

impl de::Error for Probe {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Probe::NotAStruct
    }
}

impl<'de> de::Deserializer<'de> for FieldNames {
    type Error = Probe;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probe> {
        Err(Probe::NotAStruct)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probe> {
        Err(Probe::Fields(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Sample {
        zebra: u32,
        #[serde(rename = "type")]
        type_: String,
        apple_pie: bool,
    }

    #[test]
    fn reads_serde_names_in_declaration_order() {
        assert_eq!(
            serde_field_names::<Sample>(),
            Some(&["zebra", "type", "applePie"][..])
        );
        assert_eq!(serde_field_names::<String>(), None);
    }
}
