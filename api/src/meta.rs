//! Object metadata and status conditions, shared by every kind.

use std::collections::BTreeMap;

use crate::timestamp::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// Metadata every object carries. `name`, `namespace`, `labels` and `annotations` come from the
/// user; the rest is set by the server and ignored (or checked, for `resourceVersion`) on input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct ObjectMeta {
    /// Unique within the kind (and namespace): lower-case letters, digits, '-' and '.'.
    pub name: String,
    // Empty for cluster-scoped kinds; validation fills in `default` for the others.
    /// The namespace of a namespaced kind; Node and Queue have none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("x-explain-note" = "default \"default\""))]
    pub namespace: String,
    /// Key/value pairs for selecting objects (tbctl get -l app=web).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Free-form notes for people and tools; not used for selection.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Unique for the lifetime of the object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub uid: String,
    // The log index of the write that last changed this object; a non-zero value on input
    // asks for optimistic concurrency (the write fails if the stored object has moved on).
    /// Changes on every write; send it back to update only if nothing changed since.
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        deserialize_with = "u64_from_number_or_string"
    )]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub resource_version: u64,
    /// Bumped when the spec changes.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub generation: u64,
    /// When the object was created (RFC 3339).
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<Timestamp>")]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub creation_timestamp: Option<Timestamp>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// `resourceVersion` is a string in Kubernetes manifests; accept either form. A visitor (rather
/// than an untagged enum) keeps the YAML position of a bad value in the error.
fn u64_from_number_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct ResourceVersion;
    impl serde::de::Visitor<'_> for ResourceVersion {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a resourceVersion (a non-negative integer)")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<u64, E> {
            if s.is_empty() {
                return Ok(0);
            }
            s.parse().map_err(|_| {
                E::custom(format!(
                    "expected a resourceVersion (a non-negative integer), got {}",
                    crate::bounds::Quoted(s)
                ))
            })
        }
    }
    d.deserialize_any(ResourceVersion)
}

/// One observation about an object, in the Kubernetes style.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct Condition {
    /// What is reported, e.g. Ready, Scheduled, Complete, Failed.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// A CamelCase cause, for programs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// A sentence, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When status last changed (RFC 3339).
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<Timestamp>")]
    pub last_transition_time: Option<Timestamp>,
}
