//! Pieces shared by several specs: the executor choice, serde defaults, and the small checks
//! (names, environment, selectors, commands) that more than one kind runs.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::name::{validate_label_key, validate_label_value, validate_name};
use crate::quantity::Quantity;
use crate::validate::ValidationError;

/// How a workload runs on each Mac.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Executor {
    /// tb's own engine runs the model shards.
    Builtin,
    /// tb supervises a process the user names in `command` (an MLX program, a training script).
    #[default]
    Exec,
}

pub(crate) fn one() -> u32 {
    1
}

pub(crate) type CheckResult = Result<(), ValidationError>;

fn err(path: &str, message: impl Into<String>) -> CheckResult {
    Err(ValidationError::new(path, message))
}

/// A reference to another object by name (a Model, a Queue, a Node).
pub(crate) fn object_name(path: &str, name: &str) -> CheckResult {
    validate_name(name).map_err(|m| ValidationError::new(path, m))
}

pub(crate) fn optional_object_name(path: &str, name: Option<&str>) -> CheckResult {
    name.map_or(Ok(()), |n| object_name(path, n))
}

/// A string the user may leave out but not leave blank.
pub(crate) fn not_blank(path: &str, value: Option<&str>) -> CheckResult {
    match value {
        Some(v) if v.trim().is_empty() => {
            err(path, "must not be empty (leave the field out instead)")
        }
        _ => Ok(()),
    }
}

/// Counts that are meaningless at zero (layers, tokens, ranks).
pub(crate) fn at_least_one<T: Into<u64> + Copy>(path: &str, value: Option<T>) -> CheckResult {
    match value {
        Some(v) if v.into() == 0 => err(path, "must be at least 1"),
        _ => Ok(()),
    }
}

/// Memory sizes that must hold something.
pub(crate) fn non_zero_quantity(path: &str, value: Option<&Quantity>) -> CheckResult {
    match value {
        Some(q) if q.bytes() == 0 => err(path, format!("must be more than 0 bytes, got {q}")),
        _ => Ok(()),
    }
}

/// Environment variable names; `TB_*` is reserved for what tb sets (rank, world size, ...).
pub(crate) fn env(path: &str, env: &BTreeMap<String, String>) -> CheckResult {
    for name in env.keys() {
        let at = format!("{path}.{}", crate::bounds::excerpt_to(name, 256));
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return err(
                &at,
                format!(
                    "{} is not a valid environment variable name: use letters, digits and '_', not starting with a digit",
                    crate::bounds::Quoted(name)
                ),
            );
        }
        if name.starts_with("TB_") {
            return err(
                &at,
                format!("{name} is reserved: tb sets the TB_* variables itself"),
            );
        }
    }
    Ok(())
}

/// `nodeSelector`: label keys and values that a Node's labels must carry.
pub(crate) fn node_selector(path: &str, selector: &BTreeMap<String, String>) -> CheckResult {
    for (key, value) in selector {
        let at = format!("{path}.{key}");
        validate_label_key(key).map_err(|m| ValidationError::new(&at, m))?;
        validate_label_value(value).map_err(|m| ValidationError::new(&at, m))?;
    }
    Ok(())
}

/// An exec workload needs a program to run; a built-in one must not name one.
pub(crate) fn command(path: &str, executor: Executor, command: &[String]) -> CheckResult {
    match executor {
        Executor::Exec if command.is_empty() => err(
            path,
            "required when executor is exec: the program and its arguments, e.g. [\"python3\", \"train.py\"]",
        ),
        Executor::Exec if command[0].trim().is_empty() => err(
            &format!("{path}[0]"),
            "the program to run must not be empty",
        ),
        Executor::Builtin if !command.is_empty() => err(
            path,
            "only used when executor is exec; remove it or set executor: exec",
        ),
        _ => Ok(()),
    }
}
