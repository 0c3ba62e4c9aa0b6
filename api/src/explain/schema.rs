//! Turns the JSON schemas schemars derives from the api types into the field tree `tbctl
//! explain` prints: for each field its serde name, a type as users write it, what happens when
//! it is left out (required, a default) and its doc comment.
//!
//! Everything shown comes from the types: names and requiredness from serde, defaults from the
//! `#[serde(default)]` values, descriptions from `///` comments. Where the default is not a value
//! (`the queue's priority`) or the field is set by tb, the field says so with
//! `#[schemars(extend("x-explain-note" = "..."))]`.

use schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value};

use super::order::FIELD_ORDER;
use crate::kind::Kind;
use crate::object::Object;
use crate::specs::{
    AllocationSpec, EventSpec, InferenceServiceSpec, LinkSpec, ModelSpec, NodeSpec, QueueSpec,
    ScheduleSpec, TrainingJobSpec,
};
use crate::status::StatusSummary;

/// The schema keyword a field uses to say what its absence means, when a default value or
/// `required` cannot say it.
pub const NOTE: &str = "x-explain-note";

/// One documented field: name, type as shown to users, requirement or default, description.
#[derive(Debug, Clone)]
pub(super) struct Field {
    pub name: String,
    pub ty: String,
    pub note: String,
    pub doc: String,
    pub fields: Vec<Field>,
}

/// What a kind is for, and its top-level fields (apiVersion, kind, metadata, spec, status).
pub(super) struct KindDoc {
    pub doc: String,
    pub fields: Vec<Field>,
}

/// The documentation of `kind`, generated from `Object`, the kind's spec type and the status
/// fields every kind has.
pub(super) fn kind_doc(kind: Kind) -> KindDoc {
    let mut generator = SchemaGenerator::new(SchemaSettings::draft2020_12());
    let object = generator.subschema_for::<Object>().to_value();
    let spec = spec_schema(kind, &mut generator).to_value();
    let status = generator.subschema_for::<StatusSummary>().to_value();
    let walker = Walker {
        defs: generator.take_definitions(false),
    };
    let spec_fields = walker.fields(&spec);
    let status_fields = walker.fields(&status);
    let mut fields = walker.fields(&object);
    for field in &mut fields {
        // The stored object keeps spec and status as JSON of any shape; what shape each kind
        // takes is the spec type's (and the common status fields').
        match field.name.as_str() {
            "spec" => field.fields = spec_fields.clone(),
            "status" => field.fields = status_fields.clone(),
            _ => continue,
        }
        field.ty = "object".into();
    }
    KindDoc {
        doc: walker.description(&spec),
        fields,
    }
}

/// The spec type of `kind`, as a reference into the generator's definitions.
fn spec_schema(kind: Kind, generator: &mut SchemaGenerator) -> schemars::Schema {
    fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> schemars::Schema {
        generator.subschema_for::<T>()
    }
    match kind {
        Kind::Model => of::<ModelSpec>(generator),
        Kind::InferenceService => of::<InferenceServiceSpec>(generator),
        Kind::TrainingJob => of::<TrainingJobSpec>(generator),
        Kind::Schedule => of::<ScheduleSpec>(generator),
        Kind::Queue => of::<QueueSpec>(generator),
        Kind::Node => of::<NodeSpec>(generator),
        Kind::Link => of::<LinkSpec>(generator),
        Kind::Event => of::<EventSpec>(generator),
        Kind::Allocation => of::<AllocationSpec>(generator),
    }
}

/// Reads schemas, following `$ref`s into the generator's definitions.
struct Walker {
    defs: Map<String, Value>,
}

impl Walker {
    /// The schema a `$ref` points to (the schema itself when it is no reference), with the
    /// `null` alternative of an `Option` taken away.
    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        let schema = without_null(schema);
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference.rsplit('/').next().unwrap_or(reference);
                self.defs
                    .get(name)
                    .map(|target| self.resolve(target))
                    .unwrap_or(schema)
            }
            None => schema,
        }
    }

    /// The name of the type a `$ref` points to.
    fn type_name(schema: &Value) -> Option<&str> {
        let reference = without_null(schema).get("$ref")?.as_str()?;
        reference.rsplit('/').next()
    }

    /// The type as users write it: string, integer, quantity, []string, map[string]string, or
    /// the name of a nested object type (NodeRange).
    fn ty(&self, schema: &Value) -> String {
        let target = self.resolve(schema);
        if target.get("properties").is_some()
            && let Some(name) = Self::type_name(schema)
        {
            return name.to_string();
        }
        if is_enum(target) {
            return "string".into();
        }
        match primary_type(target) {
            Some("array") => match target.get("items") {
                Some(items) => format!("[]{}", self.ty(items)),
                None => "[]any".into(),
            },
            Some("object") => match target.get("additionalProperties") {
                Some(values @ Value::Object(_)) => format!("map[string]{}", self.ty(values)),
                _ => "map[string]any".into(),
            },
            Some("string") => match target.get("format").and_then(Value::as_str) {
                Some("date-time") => "timestamp".into(),
                Some(format) => format.into(),
                None => "string".into(),
            },
            Some(other) => other.into(),
            None => "any".into(),
        }
    }

    /// A schema's description, or that of the type it refers to.
    fn description(&self, schema: &Value) -> String {
        let own = schema
            .get("description")
            .or_else(|| without_null(schema).get("description"))
            .or_else(|| self.resolve(schema).get("description"));
        own.and_then(Value::as_str)
            .map(one_line)
            .unwrap_or_default()
    }

    /// The fields of an object schema (of the items, for an array of objects), in the order
    /// the type declares them.
    fn fields(&self, schema: &Value) -> Vec<Field> {
        let mut target = self.resolve(schema);
        if primary_type(target) == Some("array")
            && let Some(items) = target.get("items")
        {
            target = self.resolve(items);
        }
        let Some(properties) = target.get("properties").and_then(Value::as_object) else {
            return Vec::new();
        };
        let required: Vec<&str> = target
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let order: Vec<&str> = target
            .get(FIELD_ORDER)
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut names: Vec<&String> = properties.keys().collect();
        // Declared fields in declaration order; any the order misses (none today) after them.
        names.sort_by_key(|name| order.iter().position(|o| o == name).unwrap_or(usize::MAX));
        names
            .into_iter()
            .map(|name| {
                let schema = &properties[name.as_str()];
                Field {
                    name: name.clone(),
                    ty: self.ty(schema),
                    note: note(schema, required.contains(&name.as_str())),
                    doc: self.description(schema),
                    fields: self.fields(schema),
                }
            })
            .collect()
    }
}

/// What leaving the field out means: the field's own note, `required`, or its default.
fn note(schema: &Value, required: bool) -> String {
    if let Some(note) = schema.get(NOTE).and_then(Value::as_str) {
        return note.to_string();
    }
    if required {
        return "required".into();
    }
    match schema.get("default") {
        Some(value) if !is_empty_value(value) => format!("default {}", show_value(value)),
        _ => String::new(),
    }
}

/// A default worth showing: not null, not an empty string, list or mapping.
fn is_empty_value(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// A default value as it would be written in a manifest: `ring`, `1`, `{min: 1}`.
fn show_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(show_value).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}: {}", show_value(v)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        other => other.to_string(),
    }
}

/// A unit-variant enum: `enum: [...]`, or, when variants have docs, `oneOf` of `const`s (and an
/// `enum` of the undocumented ones).
fn is_enum(schema: &Value) -> bool {
    let fixed = |s: &Value| s.get("enum").is_some() || s.get("const").is_some();
    fixed(schema)
        || schema
            .get("oneOf")
            .and_then(Value::as_array)
            .is_some_and(|variants| variants.iter().all(fixed))
}

/// The JSON type of a schema, ignoring the `null` an `Option` adds.
fn primary_type(schema: &Value) -> Option<&str> {
    match schema.get("type")? {
        Value::String(t) => Some(t),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null"),
        _ => None,
    }
}

/// `anyOf: [X, {type: null}]` (how schemars writes an `Option` of a reference) is X.
fn without_null(schema: &Value) -> &Value {
    let Some(alternatives) = schema.get("anyOf").and_then(Value::as_array) else {
        return schema;
    };
    let mut rest = alternatives
        .iter()
        .filter(|alt| alt.get("type").and_then(Value::as_str) != Some("null"));
    match (rest.next(), rest.next()) {
        (Some(only), None) => only,
        _ => schema,
    }
}

/// A doc comment as one line of plain text: rustdoc's line breaks and code marks are not
/// meant for a terminal.
fn one_line(doc: &str) -> String {
    doc.replace('`', "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
