//! Event: something that happened to an object (scheduled, started, failed, re-placed), written
//! by tb's components and shown by `tbctl events` and `tbctl describe`.

use crate::timestamp::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::CheckResult;
use crate::kind::Kind;
use crate::validate::ValidationError;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EventType {
    #[default]
    Normal,
    Warning,
}

/// Which object an event, or anything else, is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct ObjectRef {
    /// Kind of the object.
    pub kind: String,
    /// Its namespace (none for cluster-scoped kinds).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid, telling apart objects that had the same name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

fn one() -> u32 {
    1
}

/// Something that happened to an object, written by tb.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct EventSpec {
    /// Normal or Warning.
    #[serde(rename = "type", default)]
    pub type_: EventType,
    /// A short CamelCase cause, e.g. Scheduled, BackOff, NodeLost.
    pub reason: String,
    /// What happened, for people.
    #[serde(default)]
    pub message: String,
    /// The object the event is about.
    pub involved_object: ObjectRef,
    /// How many times it happened.
    #[serde(default = "one")]
    pub count: u32,
    /// First time (RFC 3339).
    #[serde(default, with = "crate::timestamp::optional")]
    #[schemars(with = "Option<Timestamp>")]
    pub first_timestamp: Option<Timestamp>,
    /// Latest time (RFC 3339).
    #[serde(default, with = "crate::timestamp::optional")]
    #[schemars(with = "Option<Timestamp>")]
    pub last_timestamp: Option<Timestamp>,
    /// The component that saw it, e.g. scheduler or nodelet/mac-studio-1.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl Default for EventSpec {
    fn default() -> Self {
        EventSpec {
            type_: EventType::Normal,
            reason: String::new(),
            message: String::new(),
            involved_object: ObjectRef::default(),
            count: 1,
            first_timestamp: None,
            last_timestamp: None,
            source: String::new(),
        }
    }
}

impl EventSpec {
    pub(crate) fn check(&self) -> CheckResult {
        if self.reason.trim().is_empty() {
            return Err(ValidationError::new("reason", "must not be empty"));
        }
        let obj = &self.involved_object;
        if Kind::parse(&obj.kind).is_none() {
            return Err(ValidationError::new(
                "involvedObject.kind",
                crate::kind::UnknownKind(obj.kind.clone()).to_string(),
            ));
        }
        if obj.name.is_empty() {
            return Err(ValidationError::new(
                "involvedObject.name",
                "must not be empty",
            ));
        }
        if self.count == 0 {
            return Err(ValidationError::new("count", "must be at least 1"));
        }
        Ok(())
    }
}
