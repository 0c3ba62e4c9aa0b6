//! Users, their bearer tokens (kept as SHA-256 hashes only) and the audit log, as the
//! replicated state holds them, and the deterministic apply of the commands that change them.
//!
//! Tokens carry their expiry (RFC 3339, UTC, the one timestamp format of the store, so string
//! order is time order); expired tokens are dropped whenever a token is issued.

use serde::{Deserialize, Serialize};

use super::command::{Response, StoreError};
use super::state::State;

/// How many audit records the store keeps; older ones are dropped.
pub const MAX_AUDIT: usize = 10_000;
/// How many bytes of audit records the store keeps (counted as [`AuditRecord::size`]); older
/// records are dropped. Every field of a record is cut to 1 KiB, so one record weighs at most
/// about 7 KiB and a full log holds at least a thousand.
pub const MAX_AUDIT_BYTES: usize = 8 * 1024 * 1024;

/// The name of the user created with a new cluster.
pub const ADMIN_USER: &str = "admin";

/// What a user may do (the controller's `auth::authorize` decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything.
    Admin,
    /// Read the whole cluster; write jobs in its own namespaces.
    Member,
    /// Read only.
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "member" => Some(Role::Member),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    pub role: Role,
    /// Where a member may write jobs.
    #[serde(default)]
    pub namespaces: Vec<String>,
    pub created_at: String,
}

/// A bearer token; the map holding it is keyed by the token's hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    pub user: String,
    pub expires_at: String,
    pub created_at: String,
    #[serde(default)]
    pub description: String,
}

/// One line of the audit log: who did what, when, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub time: String,
    pub user: String,
    pub verb: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// `ok`, or the gRPC code of the refusal.
    pub result: String,
}

impl AuditRecord {
    /// The record with every field cut to [`tb_api::bounds::MAX_ECHO_BYTES`] (with the real
    /// length): what a caller sends is never stored whole in the audit log.
    pub fn bounded(self) -> AuditRecord {
        let cut = |s: String| {
            if s.len() > tb_api::bounds::MAX_ECHO_BYTES {
                tb_api::bounds::excerpt(&s)
            } else {
                s
            }
        };
        AuditRecord {
            time: cut(self.time),
            user: cut(self.user),
            verb: cut(self.verb),
            kind: cut(self.kind),
            namespace: cut(self.namespace),
            name: cut(self.name),
            result: cut(self.result),
        }
    }

    /// What the record weighs against [`MAX_AUDIT_BYTES`]: its text plus a little for the record.
    pub fn size(&self) -> usize {
        const RECORD: usize = 64;
        RECORD
            + self.time.len()
            + self.user.len()
            + self.verb.len()
            + self.kind.len()
            + self.namespace.len()
            + self.name.len()
            + self.result.len()
    }
}

/// The gRPC code name a store refusal becomes, for the audit log.
pub fn result_code(e: &StoreError) -> &'static str {
    match e {
        StoreError::NotFound(_) => "NotFound",
        StoreError::Conflict { .. } => "Aborted",
        StoreError::Invalid(_) => "InvalidArgument",
        StoreError::Unauthenticated(_) => "Unauthenticated",
        StoreError::AlreadyExists(_) => "AlreadyExists",
        StoreError::PermissionDenied(_) => "PermissionDenied",
    }
}

fn rejected(e: StoreError) -> Response {
    Response::Rejected(e)
}

impl State {
    pub(crate) fn create_user(
        &mut self,
        now: &str,
        name: &str,
        role: Role,
        namespaces: &[String],
    ) -> Response {
        if let Err(e) = tb_api::name::validate_name(name) {
            return rejected(StoreError::Invalid(format!("name: {e}")));
        }
        for ns in namespaces {
            if let Err(e) = tb_api::name::validate_name(ns) {
                return rejected(StoreError::Invalid(format!("namespaces: {ns:?}: {e}")));
            }
        }
        if self.users.contains_key(name) {
            return rejected(StoreError::AlreadyExists(format!(
                "user {name:?} already exists"
            )));
        }
        let mut namespaces = namespaces.to_vec();
        namespaces.sort();
        namespaces.dedup();
        self.users.insert(
            name.to_string(),
            User {
                name: name.to_string(),
                role,
                namespaces,
                created_at: now.to_string(),
            },
        );
        Response::Done
    }

    pub(crate) fn delete_user(&mut self, name: &str) -> Response {
        let Some(user) = self.users.get(name) else {
            return rejected(StoreError::NotFound(format!("user {name:?}")));
        };
        let admins = self
            .users
            .values()
            .filter(|u| u.role == Role::Admin)
            .count();
        if user.role == Role::Admin && admins == 1 {
            return rejected(StoreError::Invalid(format!(
                "user {name:?} is the last admin; create another admin first"
            )));
        }
        self.users.remove(name);
        self.user_tokens.retain(|_, t| t.user != name);
        Response::Done
    }

    pub(crate) fn issue_token(&mut self, now: &str, hash: &str, token: &TokenRecord) -> Response {
        if !self.users.contains_key(&token.user) {
            return rejected(StoreError::NotFound(format!("user {:?}", token.user)));
        }
        if self.user_tokens.values().any(|t| t.id == token.id) {
            return rejected(StoreError::AlreadyExists(format!(
                "token id {} is taken",
                token.id
            )));
        }
        self.user_tokens.retain(|_, t| t.expires_at.as_str() > now);
        let mut t = token.clone();
        t.created_at = now.to_string();
        self.user_tokens.insert(hash.to_string(), t);
        Response::Done
    }

    pub(crate) fn revoke_token(&mut self, id: &str) -> Response {
        let before = self.user_tokens.len();
        self.user_tokens.retain(|_, t| t.id != id);
        if self.user_tokens.len() == before {
            return rejected(StoreError::NotFound(format!("token {id:?}")));
        }
        Response::Done
    }

    /// The first admin and its token, once per cluster: later attempts are refused.
    pub(crate) fn bootstrap_admin(
        &mut self,
        now: &str,
        hash: &str,
        token: &TokenRecord,
        cluster_id: &str,
    ) -> Response {
        if self.bootstrapped {
            return rejected(StoreError::AlreadyExists(
                "the cluster already has its first admin".into(),
            ));
        }
        self.bootstrapped = true;
        self.cluster_id = cluster_id.to_string();
        if !self.users.contains_key(&token.user) {
            self.users.insert(
                token.user.clone(),
                User {
                    name: token.user.clone(),
                    role: Role::Admin,
                    namespaces: Vec::new(),
                    created_at: now.to_string(),
                },
            );
        }
        let mut t = token.clone();
        t.created_at = now.to_string();
        self.user_tokens.insert(hash.to_string(), t);
        Response::Done
    }

    pub(crate) fn audit(&mut self, record: AuditRecord) {
        self.audit.push_back(record.bounded());
        // Summed each time rather than kept in the state, so that snapshots written before
        // the byte bound existed are bounded too; 10,000 lengths are quickly added.
        let mut bytes: usize = self.audit.iter().map(AuditRecord::size).sum();
        while self.audit.len() > MAX_AUDIT || bytes > MAX_AUDIT_BYTES {
            match self.audit.pop_front() {
                Some(old) => bytes -= old.size(),
                None => break,
            }
        }
    }

    /// The user a token hash belongs to, if the token is known and unexpired at `now`.
    pub fn token_user(&self, hash: &str, now: &str) -> Option<&User> {
        let t = self.user_tokens.get(hash)?;
        if t.expires_at.as_str() <= now {
            return None;
        }
        self.users.get(&t.user)
    }

    /// The node whose credential has this hash.
    pub fn credential_node(&self, hash: &str) -> Option<&str> {
        self.node_credentials
            .iter()
            .find(|(_, h)| h.as_str() == hash)
            .map(|(n, _)| n.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Command, Op};

    fn run(state: &mut State, index: u64, user: &str, op: Op) -> Response {
        let cmd = Command {
            request_id: String::new(),
            now: format!("2026-01-01T00:00:{:02}.000Z", index % 60),
            op,
            user: user.into(),
        };
        state.apply(index, &cmd).0
    }

    fn token(id: &str, user: &str) -> TokenRecord {
        TokenRecord {
            id: id.into(),
            user: user.into(),
            expires_at: "2027-01-01T00:00:00.000Z".into(),
            created_at: String::new(),
            description: String::new(),
        }
    }

    #[test]
    fn the_first_admin_is_made_once() {
        let mut s = State::default();
        let op = |h: &str| Op::BootstrapAdmin {
            token_hash: h.into(),
            token: token("a1", ADMIN_USER),
            cluster_id: format!("cluster-{h}"),
        };
        assert_eq!(run(&mut s, 1, "", op("h1")), Response::Done);
        assert!(matches!(
            run(&mut s, 2, "", op("h2")),
            Response::Rejected(StoreError::AlreadyExists(_))
        ));
        assert_eq!(s.users[ADMIN_USER].role, Role::Admin);
        assert!(s.user_tokens.contains_key("h1") && !s.user_tokens.contains_key("h2"));
        assert_eq!(
            s.cluster_id, "cluster-h1",
            "the first to commit names the cluster"
        );
        // Not a user's doing: nothing audited.
        assert!(s.audit.is_empty());
    }

    #[test]
    fn users_and_tokens_come_and_go_and_are_audited() {
        let mut s = State::default();
        let create = |name: &str, role| Op::CreateUser {
            name: name.into(),
            role,
            namespaces: vec!["b".into(), "a".into(), "a".into()],
        };
        assert_eq!(
            run(&mut s, 1, "admin", create("root", Role::Admin)),
            Response::Done
        );
        assert_eq!(
            run(&mut s, 2, "admin", create("alice", Role::Member)),
            Response::Done
        );
        assert_eq!(s.users["alice"].namespaces, ["a", "b"]);
        assert!(matches!(
            run(&mut s, 3, "admin", create("alice", Role::Viewer)),
            Response::Rejected(StoreError::AlreadyExists(_))
        ));
        assert!(matches!(
            run(&mut s, 4, "admin", create("Not A Name", Role::Viewer)),
            Response::Rejected(StoreError::Invalid(_))
        ));
        let issue = |id: &str, user: &str| Op::IssueToken {
            token_hash: format!("hash-{id}"),
            token: token(id, user),
        };
        assert_eq!(
            run(&mut s, 5, "admin", issue("t1", "alice")),
            Response::Done
        );
        assert!(matches!(
            run(&mut s, 6, "admin", issue("t2", "nobody")),
            Response::Rejected(StoreError::NotFound(_))
        ));
        assert!(
            s.token_user("hash-t1", "2026-06-01T00:00:00.000Z")
                .is_some()
        );
        assert!(
            s.token_user("hash-t1", "2027-06-01T00:00:00.000Z")
                .is_none()
        );
        assert_eq!(
            run(&mut s, 7, "admin", Op::RevokeToken { id: "t1".into() }),
            Response::Done
        );
        assert!(
            s.token_user("hash-t1", "2026-06-01T00:00:00.000Z")
                .is_none()
        );
        assert_eq!(
            run(&mut s, 8, "admin", issue("t3", "alice")),
            Response::Done
        );
        assert_eq!(
            run(
                &mut s,
                9,
                "admin",
                Op::DeleteUser {
                    name: "alice".into()
                }
            ),
            Response::Done
        );
        assert!(s.user_tokens.is_empty());
        // The last admin stays.
        assert!(matches!(
            run(
                &mut s,
                10,
                "admin",
                Op::DeleteUser {
                    name: "root".into()
                }
            ),
            Response::Rejected(StoreError::Invalid(_))
        ));
        let results: Vec<(&str, &str, &str)> = s
            .audit
            .iter()
            .map(|r| (r.verb.as_str(), r.kind.as_str(), r.result.as_str()))
            .collect();
        assert_eq!(results.len(), 10);
        assert_eq!(results[2], ("create", "User", "AlreadyExists"));
        assert_eq!(results[6], ("delete", "Token", "ok"));
        assert_eq!(results[9], ("delete", "User", "InvalidArgument"));
        assert!(s.audit.iter().all(|r| r.user == "admin"));
    }

    #[test]
    fn the_audit_log_is_bounded() {
        let mut s = State::default();
        for i in 0..(MAX_AUDIT as u64 + 5) {
            let record = AuditRecord {
                time: String::new(),
                user: "u".into(),
                verb: "apply".into(),
                kind: "Model".into(),
                namespace: String::new(),
                name: i.to_string(),
                result: "PermissionDenied".into(),
            };
            run(&mut s, i + 1, "", Op::RecordAudit { record });
        }
        assert_eq!(s.audit.len(), MAX_AUDIT);
        assert_eq!(s.audit.front().map(|r| r.name.as_str()), Some("5"));
    }

    #[test]
    fn audit_records_are_cut_and_the_log_is_bounded_in_bytes() {
        let mut s = State::default();
        let record = |name: String| AuditRecord {
            time: String::new(),
            user: "viewer".into(),
            verb: "delete".into(),
            kind: "Model".into(),
            namespace: "default".into(),
            name,
            result: "PermissionDenied".into(),
        };
        run(
            &mut s,
            1,
            "",
            Op::RecordAudit {
                record: record("x".repeat(10 << 20)),
            },
        );
        let stored = &s.audit[0].name;
        assert!(stored.len() < 1100, "{}", stored.len());
        assert!(stored.ends_with("…(10485760 bytes)"), "{stored}");
        // Records of 1 KiB names: the byte bound is reached long before the count.
        for i in 0..(MAX_AUDIT as u64) {
            let op = Op::RecordAudit {
                record: record(format!("{i}-{}", "y".repeat(1000))),
            };
            run(&mut s, i + 2, "", op);
        }
        let bytes: usize = s.audit.iter().map(AuditRecord::size).sum();
        assert!(bytes <= MAX_AUDIT_BYTES, "{bytes}");
        assert!(s.audit.len() < MAX_AUDIT, "{}", s.audit.len());
        assert!(s.audit.len() > 7000, "{}", s.audit.len());
        let last = format!("{}-", MAX_AUDIT - 1);
        assert!(s.audit.back().is_some_and(|r| r.name.starts_with(&last)));
    }
}
