//! Who is calling, and what they may do.
//!
//! Every gRPC call carries `authorization: Bearer SECRET`; the RPC layer
//! (`crate::interceptor`) turns it into a [`Caller`] with [`authenticate`], against this
//! member's applied state: `tbuser-…` is a user's token, `tbnode-…` a nodelet's credential,
//! `tbcluster-…` the secret controllers share. What a caller may do is decided in one place,
//! [`authorize::authorize`]. Secrets are random, shown once and stored as SHA-256 hashes.

pub mod authorize;

use std::path::Path;

use anyhow::Context;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::credentials::Credentials;
use crate::store::{Role, State};

pub use authorize::{Access, Denied, Verb, authorize};

/// The one message every authentication failure gets: it says nothing about why.
pub const UNAUTHENTICATED: &str = "invalid or missing credentials";

/// Prefixes of the secrets tb hands out, saying what each is.
pub const USER_TOKEN_PREFIX: &str = "tbuser-";
pub const NODE_CREDENTIAL_PREFIX: &str = "tbnode-";
pub const CLUSTER_SECRET_PREFIX: &str = "tbcluster-";

/// Who is calling. Handlers read it from the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    User {
        name: String,
        role: Role,
        namespaces: Vec<String>,
    },
    /// A nodelet, by the credential it got at join.
    Node { name: String },
    /// Another controller of this cluster.
    Controller,
    /// No credentials (only joining and heartbeats, which carry their own, are served).
    Anonymous,
}

impl Caller {
    /// The name the audit log records.
    pub fn audit_name(&self) -> String {
        match self {
            Caller::User { name, .. } => name.clone(),
            Caller::Node { name } => format!("node:{name}"),
            Caller::Controller => "controller".into(),
            Caller::Anonymous => "anonymous".into(),
        }
    }

    /// The user name for commands this caller proposes: only users' writes are audited.
    pub fn user(&self) -> String {
        match self {
            Caller::User { name, .. } => name.clone(),
            _ => String::new(),
        }
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::User { name, role, .. } => write!(f, "user {name:?} ({role})"),
            Caller::Node { name } => write!(f, "node {name:?}"),
            Caller::Controller => f.write_str("a controller"),
            Caller::Anonymous => f.write_str("an anonymous caller"),
        }
    }
}

/// A fresh secret: 32 random bytes, hex, with a prefix saying what it is.
pub fn secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// A short random id (for tokens): 8 hex digits.
pub fn short_id() -> String {
    let mut bytes = [0u8; 4];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Read the cluster secret from `path`, or create it there (mode 0600) when missing.
pub fn load_or_create_secret(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let s = s.trim().to_string();
            if !s.starts_with(CLUSTER_SECRET_PREFIX) || s.len() < CLUSTER_SECRET_PREFIX.len() + 32 {
                anyhow::bail!(
                    "{}: not a tb cluster secret (expected {CLUSTER_SECRET_PREFIX}…)",
                    path.display()
                );
            }
            Ok(s)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let s = secret(CLUSTER_SECRET_PREFIX);
            write_private(path, &format!("{s}\n"))?;
            tracing::info!(path = %path.display(), "created the cluster secret");
            Ok(s)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Write a file only its owner can read, failing if it exists.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// The caller an `authorization` header names, looked up in `state` at time `now` (RFC 3339,
/// UTC), with `credentials` telling the cluster secret. No header: anonymous. `Err(())`: a header that names nobody (unknown, expired or
/// revoked token, malformed) — callers answer with [`UNAUTHENTICATED`] and no detail.
#[allow(clippy::result_unit_err)]
pub fn authenticate(
    state: &State,
    credentials: &Credentials,
    header: Option<&str>,
    now: &str,
) -> Result<Caller, ()> {
    let Some(header) = header else {
        return Ok(Caller::Anonymous);
    };
    let (scheme, secret) = header.trim().split_once(' ').ok_or(())?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(());
    }
    let secret = secret.trim();
    if secret.starts_with(USER_TOKEN_PREFIX) {
        let user = state.token_user(&hash_secret(secret), now).ok_or(())?;
        return Ok(Caller::User {
            name: user.name.clone(),
            role: user.role,
            namespaces: user.namespaces.clone(),
        });
    }
    if secret.starts_with(NODE_CREDENTIAL_PREFIX) {
        let node = state.credential_node(&hash_secret(secret)).ok_or(())?;
        return Ok(Caller::Node {
            name: node.to_string(),
        });
    }
    if secret.starts_with(CLUSTER_SECRET_PREFIX) && credentials.is_cluster_secret(secret) {
        return Ok(Caller::Controller);
    }
    Err(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Command, Op, TokenRecord};

    fn state_with_alice(expires_at: &str) -> (State, String) {
        let mut state = State::default();
        let token = secret(USER_TOKEN_PREFIX);
        let ops = [
            Op::CreateUser {
                name: "alice".into(),
                role: Role::Member,
                namespaces: vec!["vision".into()],
            },
            Op::IssueToken {
                token_hash: hash_secret(&token),
                token: TokenRecord {
                    id: "t1".into(),
                    user: "alice".into(),
                    expires_at: expires_at.into(),
                    created_at: String::new(),
                    description: String::new(),
                },
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            let cmd = Command {
                request_id: String::new(),
                now: "2026-01-01T00:00:00.000Z".into(),
                op,
                user: String::new(),
            };
            state.apply(i as u64 + 1, &cmd);
        }
        (state, token)
    }

    #[test]
    fn tokens_name_their_user_until_they_expire_or_are_revoked() {
        let (mut state, token) = state_with_alice("2026-01-02T00:00:00.000Z");
        let header = format!("Bearer {token}");
        let caller = authenticate(
            &state,
            &Credentials::none(),
            Some(&header),
            "2026-01-01T12:00:00.000Z",
        );
        assert_eq!(
            caller,
            Ok(Caller::User {
                name: "alice".into(),
                role: Role::Member,
                namespaces: vec!["vision".into()]
            })
        );
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                Some(&header),
                "2026-01-02T00:00:00.001Z"
            ),
            Err(())
        );
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                Some("Bearer tbuser-nope"),
                "2026-01-01T12:00:00.000Z"
            ),
            Err(())
        );
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                Some("Basic x"),
                "2026-01-01T12:00:00.000Z"
            ),
            Err(())
        );
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                None,
                "2026-01-01T12:00:00.000Z"
            ),
            Ok(Caller::Anonymous)
        );
        let cmd = Command {
            request_id: String::new(),
            now: "2026-01-01T01:00:00.000Z".into(),
            op: Op::RevokeToken { id: "t1".into() },
            user: "admin".into(),
        };
        state.apply(10, &cmd);
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                Some(&header),
                "2026-01-01T12:00:00.000Z"
            ),
            Err(())
        );
        // The revocation is in the audit log, by the admin.
        let last = state.audit.back().expect("audited");
        assert_eq!(
            (last.user.as_str(), last.verb.as_str(), last.kind.as_str()),
            ("admin", "delete", "Token")
        );
    }

    #[test]
    fn node_credentials_name_their_node() {
        let mut state = State::default();
        let cred = secret(NODE_CREDENTIAL_PREFIX);
        state
            .node_credentials
            .insert("mac1".into(), hash_secret(&cred));
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                Some(&format!("Bearer {cred}")),
                "2026-01-01T00:00:00Z"
            ),
            Ok(Caller::Node {
                name: "mac1".into()
            })
        );
        assert_eq!(
            authenticate(
                &state,
                &Credentials::none(),
                Some("Bearer tbnode-other"),
                "2026-01-01T00:00:00Z"
            ),
            Err(())
        );
    }
}
