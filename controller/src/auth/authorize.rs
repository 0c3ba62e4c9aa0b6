//! The one place that decides what a caller may do: a pure function of the caller and the
//! access asked for, called by every handler before it acts.
//!
//! - admin users and other controllers: everything;
//! - members: read everything but users, tokens and the audit log; apply and delete jobs
//!   (Model, InferenceService, TrainingJob, Schedule) in their own namespaces;
//! - viewers: read everything but users, tokens and the audit log;
//! - nodes (a nodelet's credential): read objects, write the status of their own Node, of
//!   Allocations assigned to them and of Links whose end `a` they are, record Events;
//! - anonymous callers: nothing.

use super::Caller;
use crate::store::Role;
use tb_api::bounds::{Quoted, excerpt};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Apply,
    Delete,
    UpdateStatus,
    RecordEvent,
    Create,
}

impl Verb {
    pub const ALL: [Verb; 8] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Apply,
        Verb::Delete,
        Verb::UpdateStatus,
        Verb::RecordEvent,
        Verb::Create,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Apply => "apply",
            Verb::Delete => "delete",
            Verb::UpdateStatus => "update-status",
            Verb::RecordEvent => "record-event",
            Verb::Create => "create",
        }
    }

    pub fn parse(s: &str) -> Option<Verb> {
        let s = s.to_ascii_lowercase();
        Verb::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .or(match s.as_str() {
                "status" | "updatestatus" => Some(Verb::UpdateStatus),
                "event" | "recordevent" => Some(Verb::RecordEvent),
                "update" => Some(Verb::Apply),
                _ => None,
            })
    }

    pub fn is_read(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Kinds that are not objects but are guarded the same way.
pub const USER: &str = "User";
pub const TOKEN: &str = "Token";
pub const JOIN_TOKEN: &str = "JoinToken";
pub const AUDIT_LOG: &str = "AuditLog";
pub const CLUSTER_MEMBER: &str = "ClusterMember";
/// A copy of the whole store (`tbctl snapshot save`): every object and every credential's hash.
pub const CLUSTER_SNAPSHOT: &str = "ClusterSnapshot";

/// The controller join token (`tbctl cluster join-token`): it gets a controller the CA key and
/// the cluster secret.
pub const MEMBER_JOIN_TOKEN: &str = "MemberJoinToken";

/// What only admins may read.
const ADMIN_READ: [&str; 6] = [
    USER,
    TOKEN,
    JOIN_TOKEN,
    AUDIT_LOG,
    CLUSTER_SNAPSHOT,
    MEMBER_JOIN_TOKEN,
];
/// What members may write in their namespaces.
const JOB_KINDS: [&str; 4] = ["Model", "InferenceService", "TrainingJob", "Schedule"];

/// One access asked for. `kind` is canonical (`TrainingJob`) or one of the kinds above; empty
/// means every object kind (a watch of everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access<'a> {
    pub verb: Option<Verb>,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The node an object belongs to: an Allocation's `spec.node`, a Link's end `a`.
    pub owner: Option<&'a str>,
}

impl<'a> Access<'a> {
    pub fn new(verb: Verb, kind: &'a str, namespace: &'a str, name: &'a str) -> Access<'a> {
        Access {
            verb: Some(verb),
            kind,
            namespace,
            name,
            owner: None,
        }
    }

    pub fn owned_by(mut self, owner: Option<&'a str>) -> Access<'a> {
        self.owner = owner;
        self
    }
}

/// A refusal; the message names the caller, the verb and the kind (and the namespace).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{caller} may not {verb} {kind}{where_}")]
pub struct Denied {
    pub caller: String,
    pub verb: String,
    pub kind: String,
    where_: String,
}

pub fn authorize(caller: &Caller, access: &Access<'_>) -> Result<(), Denied> {
    let Some(verb) = access.verb else {
        return Err(denied(caller, access));
    };
    let admin_read = ADMIN_READ.contains(&access.kind);
    let allowed = match caller {
        Caller::Controller => true,
        Caller::Anonymous => false,
        Caller::User {
            role: Role::Admin, ..
        } => true,
        Caller::User {
            role: Role::Viewer, ..
        } => verb.is_read() && !admin_read,
        Caller::User {
            role: Role::Member,
            namespaces,
            ..
        } => {
            (verb.is_read() && !admin_read)
                || (matches!(verb, Verb::Apply | Verb::Delete)
                    && JOB_KINDS.contains(&access.kind)
                    && namespaces.iter().any(|n| n == access.namespace))
        }
        Caller::Node { name } => match verb {
            Verb::Get | Verb::List | Verb::Watch => !admin_read,
            Verb::UpdateStatus => match access.kind {
                "Node" => access.name == name,
                "Allocation" | "Link" => access.owner == Some(name.as_str()),
                _ => false,
            },
            Verb::RecordEvent => access.kind == "Event",
            _ => false,
        },
    };
    if allowed {
        Ok(())
    } else {
        Err(denied(caller, access))
    }
}

fn denied(caller: &Caller, access: &Access<'_>) -> Denied {
    let kind = if access.kind.is_empty() {
        "every kind".to_string()
    } else {
        access.kind.to_string()
    };
    // What the caller sent is repeated in part only (a refusal must not echo 10 MiB).
    let (name, namespace) = (Quoted(access.name), Quoted(access.namespace));
    let where_ = match (access.namespace.is_empty(), access.name.is_empty()) {
        (false, false) => format!(" {name} in namespace {namespace}"),
        (false, true) => format!(" in namespace {namespace}"),
        (true, false) => format!(" {name}"),
        (true, true) => String::new(),
    };
    Denied {
        caller: caller.to_string(),
        verb: access
            .verb
            .map(|v| v.as_str().to_string())
            .unwrap_or_else(|| "(unknown verb)".into()),
        kind: excerpt(&kind),
        where_,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(role: Role, namespaces: &[&str]) -> Caller {
        Caller::User {
            name: "u".into(),
            role,
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn node(name: &str) -> Caller {
        Caller::Node { name: name.into() }
    }

    #[test]
    fn the_table() {
        use Verb::*;
        let admin = user(Role::Admin, &[]);
        let member = user(Role::Member, &["vision"]);
        let viewer = user(Role::Viewer, &[]);
        let mac1 = node("mac1");
        // (caller, verb, kind, namespace, name, owner, allowed)
        type Row<'a> = (
            &'a Caller,
            Verb,
            &'a str,
            &'a str,
            &'a str,
            Option<&'a str>,
            bool,
        );
        let table: Vec<Row> = vec![
            (&admin, Apply, "Queue", "", "q", None, true),
            (&admin, Create, USER, "", "bob", None, true),
            (&admin, List, AUDIT_LOG, "", "", None, true),
            (&admin, UpdateStatus, "Node", "", "mac2", None, true),
            (
                &Caller::Controller,
                Apply,
                "TrainingJob",
                "x",
                "j",
                None,
                true,
            ),
            (
                &Caller::Anonymous,
                Get,
                "TrainingJob",
                "default",
                "j",
                None,
                false,
            ),
            (&Caller::Anonymous, List, "Node", "", "", None, false),
            // Members: read everything, write jobs in their namespaces only.
            (&member, Get, "TrainingJob", "default", "j", None, true),
            (&member, List, "Node", "", "", None, true),
            (&member, Watch, "", "", "", None, true),
            (&member, Get, CLUSTER_MEMBER, "", "", None, true),
            (&member, Apply, "TrainingJob", "vision", "j", None, true),
            (
                &member,
                Apply,
                "InferenceService",
                "vision",
                "s",
                None,
                true,
            ),
            (&member, Apply, "Model", "vision", "m", None, true),
            (&member, Apply, "Schedule", "vision", "s", None, true),
            (&member, Delete, "TrainingJob", "vision", "j", None, true),
            (&member, Apply, "TrainingJob", "default", "j", None, false),
            (&member, Delete, "TrainingJob", "default", "j", None, false),
            (&member, Apply, "Queue", "", "q", None, false),
            (&member, Apply, "Node", "", "mac1", None, false),
            (
                &member,
                UpdateStatus,
                "TrainingJob",
                "vision",
                "j",
                None,
                false,
            ),
            (&member, Create, USER, "", "bob", None, false),
            (&member, Create, JOIN_TOKEN, "", "", None, false),
            (&member, List, USER, "", "", None, false),
            (&member, List, AUDIT_LOG, "", "", None, false),
            (&member, Create, CLUSTER_MEMBER, "", "", None, false),
            // The store's copy holds every credential's hash: admins only.
            (&member, Get, CLUSTER_SNAPSHOT, "", "", None, false),
            (&viewer, Get, CLUSTER_SNAPSHOT, "", "", None, false),
            (&mac1, Get, CLUSTER_SNAPSHOT, "", "", None, false),
            // The controller join token hands out the CA key and the cluster secret.
            (&admin, Get, MEMBER_JOIN_TOKEN, "", "", None, true),
            (&member, Get, MEMBER_JOIN_TOKEN, "", "", None, false),
            (&viewer, Get, MEMBER_JOIN_TOKEN, "", "", None, false),
            (&mac1, Get, MEMBER_JOIN_TOKEN, "", "", None, false),
            (
                &Caller::Anonymous,
                Get,
                MEMBER_JOIN_TOKEN,
                "",
                "",
                None,
                false,
            ),
            // Viewers: read only.
            (&viewer, Get, "TrainingJob", "default", "j", None, true),
            (&viewer, Watch, "Allocation", "", "", None, true),
            (&viewer, Apply, "TrainingJob", "default", "j", None, false),
            (&viewer, Delete, "Model", "default", "m", None, false),
            (&viewer, List, TOKEN, "", "", None, false),
            // Nodes: their own Node, Allocations and Links.
            (&mac1, Watch, "Allocation", "", "", None, true),
            (&mac1, Get, "Node", "", "mac2", None, true),
            (&mac1, UpdateStatus, "Node", "", "mac1", None, true),
            (&mac1, UpdateStatus, "Node", "", "mac2", None, false),
            (
                &mac1,
                UpdateStatus,
                "Allocation",
                "default",
                "a",
                Some("mac1"),
                true,
            ),
            (
                &mac1,
                UpdateStatus,
                "Allocation",
                "default",
                "a",
                Some("mac2"),
                false,
            ),
            (
                &mac1,
                UpdateStatus,
                "Allocation",
                "default",
                "a",
                None,
                false,
            ),
            (&mac1, UpdateStatus, "Link", "", "l", Some("mac1"), true),
            (&mac1, UpdateStatus, "Link", "", "l", Some("mac2"), false),
            (
                &mac1,
                UpdateStatus,
                "TrainingJob",
                "default",
                "j",
                None,
                false,
            ),
            (&mac1, RecordEvent, "Event", "default", "", None, true),
            (&mac1, Apply, "Node", "", "mac1", None, false),
            (
                &mac1,
                Delete,
                "Allocation",
                "default",
                "a",
                Some("mac1"),
                false,
            ),
            (&mac1, Create, JOIN_TOKEN, "", "", None, false),
            (&mac1, List, USER, "", "", None, false),
        ];
        for (caller, verb, kind, ns, name, owner, want) in table {
            let access = Access::new(verb, kind, ns, name).owned_by(owner);
            assert_eq!(
                authorize(caller, &access).is_ok(),
                want,
                "{caller} {verb} {kind} {ns}/{name} owner {owner:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_verb_kind_and_namespace() {
        let member = user(Role::Member, &["vision"]);
        let e = authorize(
            &member,
            &Access::new(Verb::Apply, "TrainingJob", "default", "j"),
        )
        .expect_err("denied");
        assert_eq!(
            e.to_string(),
            "user \"u\" (member) may not apply TrainingJob \"j\" in namespace \"default\""
        );
        let e =
            authorize(&member, &Access::new(Verb::List, AUDIT_LOG, "", "")).expect_err("denied");
        assert_eq!(e.to_string(), "user \"u\" (member) may not list AuditLog");
    }

    #[test]
    fn verbs_parse() {
        for v in Verb::ALL {
            assert_eq!(Verb::parse(v.as_str()), Some(v));
        }
        assert_eq!(Verb::parse("status"), Some(Verb::UpdateStatus));
        assert_eq!(Verb::parse("Apply"), Some(Verb::Apply));
        assert_eq!(Verb::parse("frobnicate"), None);
    }
}
