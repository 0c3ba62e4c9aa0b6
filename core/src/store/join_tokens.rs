//! Join tokens as the replicated state keeps them, and the deterministic rules of a join: a
//! token allows a number of joins (one by default), each join spends one in the same command
//! that registers the Node, so two nodelets racing with a single-use token cannot both get in;
//! a token bound to a node name joins only as that name, and only such a token may replace the
//! credential of a Node that already joined (a reinstalled Mac). Anyone else's join under an
//! existing name is refused and the live credential stays.
//!
//! Tokens made before tokens had uses (`uses_left: None`) keep their old meaning until they
//! expire (any number of joins, replacing), so replaying an old log gives the same state.

use serde::{Deserialize, Deserializer, Serialize};

use super::command::StoreError;
use super::state::State;

/// How many unexpired join tokens the store keeps; creating more is refused.
pub const MAX_JOIN_TOKENS: usize = 10_000;
/// The most joins one token may allow.
pub const MAX_TOKEN_USES: u32 = 10_000;

/// A join token, kept by the hash of its secret. Never listed, never sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    /// RFC 3339, UTC.
    pub expires_at: String,
    /// Joins left; `Some(0)`: spent (kept until it expires, so a reuse is told so).
    /// None: a token from before uses existed.
    #[serde(default)]
    pub uses_left: Option<u32>,
    /// How many joins it allowed, for messages.
    #[serde(default)]
    pub uses: u32,
    /// The only node it joins as; empty: any node not yet joined.
    #[serde(default)]
    pub node: String,
}

/// A stored token: a record, or (in snapshots from before records) its expiry alone.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stored {
    Record(JoinToken),
    Legacy(String),
}

/// Read `join_tokens` from a snapshot of any version.
pub(crate) fn deserialize_tokens<'de, D>(
    d: D,
) -> Result<std::collections::BTreeMap<String, JoinToken>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw = std::collections::BTreeMap::<String, Stored>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(hash, t)| {
            let t = match t {
                Stored::Record(r) => r,
                Stored::Legacy(expires_at) => JoinToken {
                    expires_at,
                    uses_left: None,
                    uses: 0,
                    node: String::new(),
                },
            };
            (hash, t)
        })
        .collect())
}

impl State {
    /// Keep a new join token; expired ones are dropped first.
    pub(crate) fn create_join_token(
        &mut self,
        now: &str,
        hash: &str,
        expires_at: &str,
        uses: Option<u32>,
        node: &str,
    ) -> Result<(), StoreError> {
        if let Some(n) = uses
            && !(1..=MAX_TOKEN_USES).contains(&n)
        {
            return Err(StoreError::Invalid(format!(
                "uses: expected 1 to {MAX_TOKEN_USES}, got {n}"
            )));
        }
        if !node.is_empty()
            && let Err(e) = tb_api::name::validate_name(node)
        {
            return Err(StoreError::Invalid(format!("node: {e}")));
        }
        // Timestamps share one format (UTC, "Z"), so string order is time order.
        self.join_tokens.retain(|_, t| t.expires_at.as_str() > now);
        if self.join_tokens.len() >= MAX_JOIN_TOKENS {
            return Err(StoreError::Invalid(format!(
                "{MAX_JOIN_TOKENS} join tokens are live; let some expire first"
            )));
        }
        self.join_tokens.insert(
            hash.to_string(),
            JoinToken {
                expires_at: expires_at.to_string(),
                uses_left: uses,
                uses: uses.unwrap_or(0),
                node: node.to_string(),
            },
        );
        Ok(())
    }

    /// Whether a join as `name` with the token `hash` may go ahead at `now`; nothing changes.
    pub(crate) fn check_join(&self, now: &str, hash: &str, name: &str) -> Result<(), StoreError> {
        let token = self
            .join_tokens
            .get(hash)
            .filter(|t| t.expires_at.as_str() > now)
            .ok_or_else(|| {
                StoreError::Unauthenticated("the join token is unknown or expired".into())
            })?;
        if token.uses_left == Some(0) {
            let allowed = match token.uses {
                1 => "its one join".to_string(),
                n => format!("all {n} of its joins"),
            };
            return Err(StoreError::Unauthenticated(format!(
                "join token already used ({allowed}); create another with `tbctl token create`"
            )));
        }
        if !token.node.is_empty() && token.node != name {
            return Err(StoreError::PermissionDenied(format!(
                "this join token is for node {}, not {name}",
                token.node
            )));
        }
        let legacy = token.uses_left.is_none();
        if !legacy && token.node.is_empty() && self.node_joined(name) {
            return Err(StoreError::AlreadyExists(format!(
                "node {name} already joined; to replace a reinstalled Mac create a token with \
                 `tbctl token create --node {name}`"
            )));
        }
        Ok(())
    }

    /// Spend one use of the token `hash` (after [`State::check_join`] passed).
    pub(crate) fn spend_join_token(&mut self, hash: &str) {
        if let Some(t) = self.join_tokens.get_mut(hash)
            && let Some(n) = t.uses_left.as_mut()
        {
            *n = n.saturating_sub(1);
        }
    }

    /// Whether a node of this name holds a credential or has a Node object.
    fn node_joined(&self, name: &str) -> bool {
        let key = tb_api::ObjectKey {
            kind: tb_api::Kind::Node.as_str().into(),
            namespace: String::new(),
            name: name.to_string(),
        };
        self.node_credentials.contains_key(name) || self.objects.contains_key(&key.storage_key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Command, Op, Response};
    use tb_api::{Object, ObjectMeta};

    const NOW: &str = "2026-01-01T00:00:00.000Z";

    fn node(name: &str) -> Object {
        Object {
            api_version: "tb/v1".into(),
            kind: "Node".into(),
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            spec: serde_json::json!({"address": "127.0.0.1:1"}),
            status: serde_json::json!({}),
        }
    }

    fn run(s: &mut State, index: u64, op: Op) -> Response {
        let cmd = Command {
            request_id: String::new(),
            now: NOW.into(),
            op,
            user: String::new(),
        };
        s.apply(index, &cmd).0
    }

    fn create(s: &mut State, index: u64, hash: &str, uses: Option<u32>, node: &str) -> Response {
        run(
            s,
            index,
            Op::CreateToken {
                token_hash: hash.into(),
                expires_at: "2026-01-02T00:00:00.000Z".into(),
                description: String::new(),
                uses,
                node: node.into(),
            },
        )
    }

    fn join(s: &mut State, index: u64, hash: &str, name: &str, cred: &str) -> Response {
        run(
            s,
            index,
            Op::Join {
                token_hash: hash.into(),
                node: node(name),
                credential_hash: cred.into(),
            },
        )
    }

    fn rejected(r: &Response) -> &StoreError {
        match r {
            Response::Rejected(e) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_single_use_token_joins_once() {
        let mut s = State::default();
        create(&mut s, 1, "t", Some(1), "");
        assert!(matches!(
            join(&mut s, 2, "t", "a", "ca"),
            Response::Status { .. }
        ));
        let before = s.clone();
        let r = join(&mut s, 3, "t", "b", "cb");
        let e = rejected(&r);
        assert!(matches!(e, StoreError::Unauthenticated(_)), "{e:?}");
        assert!(e.to_string().contains("join token already used"), "{e}");
        // Nothing changed but the revision.
        assert_eq!(s.node_credentials, before.node_credentials);
        assert_eq!(s.objects, before.objects);
        // An unknown token reads differently.
        let r = join(&mut s, 4, "nope", "b", "cb");
        assert!(rejected(&r).to_string().contains("unknown or expired"));
    }

    #[test]
    fn a_token_with_two_uses_joins_twice() {
        let mut s = State::default();
        create(&mut s, 1, "t", Some(2), "");
        assert!(matches!(
            join(&mut s, 2, "t", "a", "ca"),
            Response::Status { .. }
        ));
        assert!(matches!(
            join(&mut s, 3, "t", "b", "cb"),
            Response::Status { .. }
        ));
        let r = join(&mut s, 4, "t", "c", "cc");
        assert!(rejected(&r).to_string().contains("all 2 of its joins"));
    }

    #[test]
    fn an_existing_name_is_kept_unless_the_token_names_it() {
        let mut s = State::default();
        create(&mut s, 1, "t1", Some(1), "");
        join(&mut s, 2, "t1", "mac", "old");
        create(&mut s, 3, "t2", Some(5), "");
        let r = join(&mut s, 4, "t2", "mac", "thief");
        let e = rejected(&r);
        assert!(matches!(e, StoreError::AlreadyExists(_)), "{e:?}");
        assert!(
            e.to_string().contains("tbctl token create --node mac"),
            "{e}"
        );
        assert_eq!(
            s.node_credentials["mac"], "old",
            "the live credential stays"
        );
        assert_eq!(
            s.join_tokens["t2"].uses_left,
            Some(5),
            "a refusal spends nothing"
        );
        // A token bound to another node cannot join as this one.
        create(&mut s, 5, "t3", Some(1), "other");
        let r = join(&mut s, 6, "t3", "mac", "x");
        assert!(matches!(rejected(&r), StoreError::PermissionDenied(_)));
        // The token made for it replaces it.
        create(&mut s, 7, "t4", Some(1), "mac");
        assert!(matches!(
            join(&mut s, 8, "t4", "mac", "new"),
            Response::Status { .. }
        ));
        assert_eq!(s.node_credentials["mac"], "new");
    }

    #[test]
    fn uses_and_names_are_validated() {
        let mut s = State::default();
        assert!(matches!(
            rejected(&create(&mut s, 1, "t", Some(0), "")),
            StoreError::Invalid(_)
        ));
        assert!(matches!(
            rejected(&create(&mut s, 2, "t", Some(MAX_TOKEN_USES + 1), "")),
            StoreError::Invalid(_)
        ));
        assert!(matches!(
            rejected(&create(&mut s, 3, "t", Some(1), "Not A Name")),
            StoreError::Invalid(_)
        ));
        assert!(s.join_tokens.is_empty());
    }

    #[test]
    fn old_tokens_and_snapshots_keep_their_meaning() {
        // A snapshot from before records: hash -> expiry.
        let json = serde_json::json!({"objects": {}, "events": [], "event_seq": 0, "dedup": {},
            "dedup_order": [], "revision": 0,
            "join_tokens": {"h": "2026-01-02T00:00:00.000Z"}});
        let mut s: State = serde_json::from_value(json).expect("old snapshot");
        assert_eq!(s.join_tokens["h"].uses_left, None);
        join(&mut s, 1, "h", "a", "c1");
        assert!(matches!(
            join(&mut s, 2, "h", "a", "c2"),
            Response::Status { .. }
        ));
        assert_eq!(s.node_credentials["a"], "c2");
        // A log entry from before uses: no `uses` field.
        let op: Op = serde_json::from_value(serde_json::json!({"CreateToken": {
            "token_hash": "g", "expires_at": "2026-01-02T00:00:00.000Z", "description": ""}}))
        .expect("old entry");
        assert!(matches!(op, Op::CreateToken { uses: None, .. }));
    }
}
