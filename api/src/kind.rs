//! The kinds of object tb stores, their names, aliases and scope.

use std::fmt;
use std::str::FromStr;

/// Every kind of object in `tb/v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Model,
    InferenceService,
    TrainingJob,
    Schedule,
    Queue,
    Node,
    Link,
    Event,
    Allocation,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Model,
        Kind::InferenceService,
        Kind::TrainingJob,
        Kind::Schedule,
        Kind::Queue,
        Kind::Node,
        Kind::Link,
        Kind::Event,
        Kind::Allocation,
    ];

    /// The canonical name, as written in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Model => "Model",
            Kind::InferenceService => "InferenceService",
            Kind::TrainingJob => "TrainingJob",
            Kind::Schedule => "Schedule",
            Kind::Queue => "Queue",
            Kind::Node => "Node",
            Kind::Link => "Link",
            Kind::Event => "Event",
            Kind::Allocation => "Allocation",
        }
    }

    /// Lower-case plural, as in `tbctl get inferenceservices`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Model => "models",
            Kind::InferenceService => "inferenceservices",
            Kind::TrainingJob => "trainingjobs",
            Kind::Schedule => "schedules",
            Kind::Queue => "queues",
            Kind::Node => "nodes",
            Kind::Link => "links",
            Kind::Event => "events",
            Kind::Allocation => "allocations",
        }
    }

    /// Short names accepted on the command line.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Kind::Model => &["model", "models", "mdl"],
            Kind::InferenceService => &["inferenceservice", "inferenceservices", "isvc"],
            Kind::TrainingJob => &["trainingjob", "trainingjobs", "tj", "job", "jobs"],
            Kind::Schedule => &["schedule", "schedules", "sched", "cronjob"],
            Kind::Queue => &["queue", "queues", "q"],
            Kind::Node => &["node", "nodes", "no"],
            Kind::Link => &["link", "links"],
            Kind::Event => &["event", "events", "ev"],
            Kind::Allocation => &["allocation", "allocations", "alloc", "allocs"],
        }
    }

    /// Node, Link and Queue belong to the cluster; every other kind lives in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, Kind::Node | Kind::Link | Kind::Queue)
    }

    /// Parse a canonical name (`InferenceService`) or any alias, case-insensitively.
    pub fn parse(s: &str) -> Option<Kind> {
        let lower = s.to_ascii_lowercase();
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s) || k.aliases().contains(&lower.as_str()))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds, as error messages list them.
pub const KIND_LIST: &str = "Model, InferenceService (isvc), TrainingJob (tj), Schedule, Queue, Node, Link, Event, Allocation (alloc)";

/// An unknown kind, with the list of known ones for the error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown kind {}; expected one of {KIND_LIST}", crate::bounds::Quoted(.0))]
pub struct UnknownKind(pub String);

impl FromStr for Kind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::parse(s).ok_or_else(|| UnknownKind(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_resolve() {
        assert_eq!(Kind::parse("isvc"), Some(Kind::InferenceService));
        assert_eq!(Kind::parse("TJ"), Some(Kind::TrainingJob));
        assert_eq!(
            Kind::parse("InferenceService"),
            Some(Kind::InferenceService)
        );
        assert_eq!(Kind::parse("nodes"), Some(Kind::Node));
        assert_eq!(Kind::parse("pods"), None);
    }

    #[test]
    fn every_alias_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for k in Kind::ALL {
            for a in k.aliases() {
                assert!(seen.insert(*a), "alias {a} used twice");
            }
        }
    }
}
