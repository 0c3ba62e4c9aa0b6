//! The generic stored object: typed metadata, spec and status as JSON values.
//!
//! The store and the wire deal in this shape so that they need no change when a kind grows a
//! field; typed views of each kind's spec live in `specs` and are checked by `validate`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kind::Kind;
use crate::meta::ObjectMeta;

pub const API_VERSION: &str = "tb/v1";

/// Any tb object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct Object {
    /// Always tb/v1.
    pub api_version: String,
    /// The kind of object, as named above.
    pub kind: String,
    /// Name, namespace, labels and annotations; the rest is set by tb.
    pub metadata: ObjectMeta,
    /// What you want.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub spec: Value,
    /// What tb observes; written by tb's components, not by users.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub status: Value,
}

impl Object {
    /// The kind, if it is one tb knows.
    pub fn kind(&self) -> Option<Kind> {
        Kind::parse(&self.kind)
    }

    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            kind: self.kind.clone(),
            namespace: self.metadata.namespace.clone(),
            name: self.metadata.name.clone(),
        }
    }

    /// `kind/name`, as tbctl prints it.
    pub fn display_name(&self) -> String {
        format!("{}/{}", self.kind.to_ascii_lowercase(), self.metadata.name)
    }

    pub fn to_json(&self) -> String {
        // Serialising a tree of strings, maps and JSON values cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(s: &str) -> Result<Object, serde_json::Error> {
        serde_json::from_str(s)
    }
}

/// Where an object lives: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    /// The store's key: `Kind/namespace/name`, ordered so that a kind's (and a namespace's)
    /// objects are contiguous.
    pub fn storage_key(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}
