//! tb's shared vocabulary: the object model (apiVersion `tb/v1`), YAML loading and validation,
//! quantities, label selectors, and the gRPC API generated from `proto/tb.proto`.
//!
//! Every other crate speaks through these types; nothing here does I/O beyond reading the files
//! a user asks to load — but for [`https`] (feature `https`): TLS with the cluster CA for the
//! HTTP endpoints of the controllers and of rank 0 of a built-in service.

pub mod bounds;
pub mod chips;
pub mod controller_files;
pub mod cron;
pub mod duration;
pub mod explain;
pub mod gguf;
pub mod hf;
#[cfg(feature = "https")]
pub mod https;
pub mod kind;
pub mod lab;
pub mod load;
pub mod meta;
pub mod name;
pub mod object;
pub mod quantity;
pub mod reason;
pub mod secret;
pub mod selector;
mod serde_util;
pub mod snapshot_file;
pub mod specs;
pub mod status;
pub mod timestamp;
pub mod tls_failure;
pub mod validate;
pub mod version;

#[cfg(test)]
mod testdata;

/// The gRPC API (tonic + prost), generated at build time.
pub mod proto {
    tonic::include_proto!("tb.v1");
}

pub use cron::CronSchedule;
pub use explain::{explain, explain_path};
pub use kind::Kind;
pub use load::{
    LoadError, LoadedObject, LocatedError, load_path, load_reader, load_str, load_typed_str,
    parse_object_json, to_yaml,
};
pub use meta::{Condition, ObjectMeta};
pub use object::{API_VERSION, Object, ObjectKey};
pub use quantity::{Quantity, QuantityError};
pub use selector::LabelSelector;
pub use specs::{Spec, TypedSpec, parse_spec};
pub use timestamp::{Timestamp, TimestampError};
pub use validate::{DEFAULT_NAMESPACE, ValidationError, validate_object, validate_status};
