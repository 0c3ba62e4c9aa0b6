//! The verbs: each submodule runs one. This module holds what they share: the resolved target
//! (servers, namespace), a lazily made client, and small helpers for kinds and objects.

pub mod apply;
pub mod cluster;
pub mod completion;
pub mod config;
pub mod delete;
pub mod describe;
pub mod diff;
pub mod explain;
pub mod get;
pub mod watch;

use std::fmt;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tb_api::{Kind, Object};

use crate::args::{Cli, Command};
use crate::client::Client;
use crate::config::{ConfigFile, Overrides, Target, config_path, resolve};

/// An error already reported on stderr: exit with this code and print nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported(pub u8);

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for Reported {}

/// What a command that talks to the cluster needs.
pub struct Ctx {
    pub target: Target,
    timeout: Duration,
    client: Option<Client>,
}

impl Ctx {
    pub fn new(target: Target, timeout: Duration) -> Ctx {
        Ctx {
            target,
            timeout,
            client: None,
        }
    }

    pub fn client(&mut self) -> &mut Client {
        let (servers, timeout) = (&self.target.servers, self.timeout);
        self.client.get_or_insert_with(|| Client::new(servers.clone(), timeout))
    }

    /// The namespace a request about `kind` carries: none for cluster-scoped kinds.
    pub fn namespace_for(&self, kind: Kind) -> String {
        if kind.is_namespaced() {
            self.target.namespace.clone()
        } else {
            String::new()
        }
    }
}

/// Run the command; the result is the exit code (0, or 1 for `diff` with changes).
pub async fn run(cli: Cli) -> Result<u8> {
    let g = cli.global;
    // Commands that need no server run before contexts are resolved, so a broken config file
    // can still be repaired with `tbctl config`.
    let cmd = match cli.command {
        Command::Config(c) => return config::run(c, &g).map(|()| 0),
        Command::Completion(a) => return completion::run(a).map(|()| 0),
        Command::Explain(a) => return explain::run(&a).map(|()| 0),
        other => other,
    };
    let path = config_path()?;
    let file = ConfigFile::load(&path)?;
    let overrides = Overrides {
        server_flag: g.server.clone(),
        server_env: std::env::var("TB_SERVER").ok().filter(|s| !s.trim().is_empty()),
        context: g.context.clone(),
        namespace: g.namespace.clone(),
    };
    let target = resolve(&overrides, &file)?;
    tracing::debug!(servers = ?target.servers, namespace = %target.namespace, "target");
    let mut ctx = Ctx::new(target, g.timeout);
    match cmd {
        Command::Apply(a) => apply::run(&mut ctx, &a).await.map(|()| 0),
        Command::Diff(a) => diff::run(&mut ctx, &a).await,
        Command::Get(a) => get::run(&mut ctx, &a).await.map(|()| 0),
        Command::Describe(a) => describe::run(&mut ctx, &a).await.map(|()| 0),
        Command::Delete(a) => delete::run(&mut ctx, &a).await.map(|()| 0),
        Command::Cluster(c) => cluster::run(&mut ctx, c).await.map(|()| 0),
        Command::Config(_) | Command::Completion(_) | Command::Explain(_) => Ok(0),
    }
}

/// A kind from the command line; the error lists the kinds there are.
pub fn parse_kind(s: &str) -> Result<Kind> {
    Kind::parse(s).ok_or_else(|| {
        let known: Vec<String> = Kind::ALL
            .iter()
            .map(|k| {
                let short: Vec<&str> = k
                    .aliases()
                    .iter()
                    .copied()
                    .filter(|a| *a != k.plural() && !a.eq_ignore_ascii_case(k.as_str()))
                    .collect();
                if short.is_empty() {
                    k.as_str().to_string()
                } else {
                    format!("{} ({})", k.as_str(), short.join(", "))
                }
            })
            .collect();
        anyhow::anyhow!("unknown kind {s:?}; known kinds: {}", known.join(", "))
    })
}

/// An object as the server sent it.
pub fn parse_object(json: &str) -> Result<Object> {
    Object::from_json(json).context("the server sent an object tbctl cannot read")
}

/// A fresh idempotency key for one logical write.
pub fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `kind/name` for a kind and name given separately.
pub fn display_name(kind: &str, name: &str) -> String {
    format!("{}/{name}", kind.to_ascii_lowercase())
}

/// Print an error line to stderr, as tbctl prints every error.
pub fn print_error(message: &str) {
    for line in message.lines() {
        eprintln!("error: {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kind_lists_the_kinds() {
        let e = parse_kind("pods").expect_err("unknown").to_string();
        assert!(e.contains("\"pods\""), "{e}");
        for k in Kind::ALL {
            assert!(e.contains(k.as_str()), "{e}");
        }
        assert!(e.contains("isvc"), "{e}");
        assert_eq!(parse_kind("isvc").expect("alias"), Kind::InferenceService);
    }
}
