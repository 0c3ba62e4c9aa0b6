//! The verbs: each submodule runs one (`observe` and `watch` are the list-then-watch loops some
//! of them share). This module holds what they share: the resolved target (servers,
//! namespace), a lazily made client, and small helpers for kinds, objects and jobs.

pub mod apply;
pub mod auth;
pub mod chat;
pub mod cluster;
pub mod completion;
pub mod config;
pub mod cordon;
pub mod create;
pub mod delete;
pub mod describe;
pub mod diff;
pub mod down;
pub mod drain;
pub mod events;
pub mod explain;
pub mod get;
pub mod hostfile;
pub mod install;
pub mod logs;
pub mod model;
pub mod observe;
pub mod plan;
pub mod snapshot;
pub mod token;
pub mod top;
pub mod topology;
pub mod up;
pub mod usage;
pub mod wait;
pub mod watch;

use std::fmt;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tb_api::{Kind, Object};

use crate::args::{Cli, Command};
use crate::client::Client;
use crate::config::{
    ConfigFile, Overrides, Target, config_path, resolve, resolve_ca, resolve_token,
};

/// An error already reported on stderr: exit with this code and print nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported(pub u8);

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for Reported {}

/// How long one request may take when `--timeout` is not given.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a command that talks to the cluster needs.
pub struct Ctx {
    pub target: Target,
    /// The bearer token calls carry.
    token: Option<String>,
    /// The CA calls verify the controllers with; None: plain TCP.
    trust: Option<crate::tls::Trust>,
    /// The token may go over plain TCP (`--insecure`, or the context's).
    insecure: bool,
    timeout: Duration,
    client: Option<Client>,
}

impl Ctx {
    pub fn new(target: Target, timeout: Duration) -> Ctx {
        Ctx {
            target,
            token: None,
            trust: None,
            insecure: false,
            timeout,
            client: None,
        }
    }

    /// Calls carry `token`.
    pub fn with_token(mut self, token: Option<String>) -> Ctx {
        self.token = token;
        self.client = None;
        self
    }

    /// Calls speak TLS and verify the controllers with `trust`.
    pub fn with_trust(mut self, trust: Option<crate::tls::Trust>) -> Ctx {
        self.trust = trust;
        self.client = None;
        self
    }

    /// Whether the token may be sent over plain TCP.
    pub fn with_insecure(mut self, insecure: bool) -> Ctx {
        self.insecure = insecure;
        self.client = None;
        self
    }

    /// The bearer token calls carry, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether the token may go over plain TCP (`--insecure`).
    pub fn insecure(&self) -> bool {
        self.insecure
    }

    /// The CA the controllers are verified with, if any.
    pub fn trust(&self) -> Option<&crate::tls::Trust> {
        self.trust.as_ref()
    }

    pub fn client(&mut self) -> &mut Client {
        let (servers, timeout, token) = (&self.target.servers, self.timeout, &self.token);
        let (trust, insecure) = (&self.trust, self.insecure);
        self.client.get_or_insert_with(|| {
            Client::new(servers.clone(), timeout)
                .with_token(token.as_deref())
                .with_trust(trust.clone())
                .with_insecure(insecure)
        })
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
        Command::Install(a) => return install::install(&a).map(|()| 0),
        Command::Uninstall(a) => return install::uninstall(&a).map(|()| 0),
        Command::Explain(a) => return explain::run(&a).map(|()| 0),
        Command::Model(c) => return model::run(&c).map(|()| 0),
        // The local cluster is found by its data directory, not by a context.
        Command::Up(a) => return up::run(&a, g.context.as_deref()).await.map(|()| 0),
        Command::Down(a) => return down::run(&a).await.map(|()| 0),
        Command::Plan(a) if a.cluster.is_some() => {
            let ns = g
                .namespace
                .clone()
                .unwrap_or_else(|| tb_api::DEFAULT_NAMESPACE.into());
            return plan::run_offline(&a, &ns).map(|()| 0);
        }
        other => other,
    };
    let path = config_path()?;
    let file = ConfigFile::load(&path)?;
    let overrides = Overrides {
        server_flag: g.server.clone(),
        server_env: std::env::var("TB_SERVER")
            .ok()
            .filter(|s| !s.trim().is_empty()),
        context: g.context.clone(),
        namespace: g.namespace.clone(),
        token_flag: g.token.clone(),
        token_env: std::env::var("TB_TOKEN")
            .ok()
            .filter(|s| !s.trim().is_empty()),
        ca_flag: g.ca_cert.clone(),
        ca_env: std::env::var_os("TB_CA_CERT")
            .filter(|s| !s.is_empty())
            .map(std::path::PathBuf::from),
        insecure_flag: g.insecure,
    };
    if let Command::Login(a) = &cmd {
        return auth::login(a, &overrides).map(|()| 0);
    }
    let target = resolve(&overrides, &file)?;
    let token = resolve_token(&overrides, &file);
    let insecure = crate::config::resolve_insecure(&overrides, &file);
    let trust = match resolve_ca(&overrides, &file) {
        Some(p) => Some(crate::tls::Trust::load(&p)?),
        None => None,
    };
    tracing::debug!(servers = ?target.servers, namespace = %target.namespace, tls = trust.is_some(), "target");
    let mut ctx = Ctx::new(target, g.timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT))
        .with_token(token)
        .with_trust(trust)
        .with_insecure(insecure);
    match cmd {
        Command::Apply(a) => apply::run(&mut ctx, &a, g.timeout).await.map(|()| 0),
        Command::Diff(a) => diff::run(&mut ctx, &a).await,
        Command::Get(a) => get::run(&mut ctx, &a).await.map(|()| 0),
        Command::Describe(a) => describe::run(&mut ctx, &a).await.map(|()| 0),
        Command::Delete(a) => delete::run(&mut ctx, &a).await.map(|()| 0),
        Command::Logs(a) => logs::run(&mut ctx, &a).await.map(|()| 0),
        Command::Events(a) => events::run(&mut ctx, &a).await.map(|()| 0),
        Command::Wait(a) => wait::run(&mut ctx, &a, g.timeout.unwrap_or(wait::DEFAULT_TIMEOUT))
            .await
            .map(|()| 0),
        Command::Top(c) => top::run(&mut ctx, c).await.map(|()| 0),
        Command::Usage(a) => usage::run(&mut ctx, &a).await.map(|()| 0),
        Command::Chat(a) => chat::run(&mut ctx, &a).await.map(|()| 0),
        Command::Hostfile(a) => hostfile::run(&mut ctx, &a).await.map(|()| 0),
        Command::Plan(a) => plan::run(&mut ctx, &a).await.map(|()| 0),
        Command::Create(crate::args::CreateCommand::Job(a)) => {
            create::run(&mut ctx, &a).await.map(|()| 0)
        }
        Command::Topology(a) => topology::run(&mut ctx, &a, g.timeout).await.map(|()| 0),
        Command::Cordon(a) => cordon::run(&mut ctx, &a.node, cordon::Mark::Cordon)
            .await
            .map(|_| 0),
        Command::Uncordon(a) => cordon::run(&mut ctx, &a.node, cordon::Mark::Uncordon)
            .await
            .map(|_| 0),
        Command::Drain(a) => drain::run(
            &mut ctx,
            &a.node,
            g.timeout.unwrap_or(drain::DEFAULT_TIMEOUT),
        )
        .await
        .map(|()| 0),
        Command::Token(c) => token::run(&mut ctx, c).await.map(|()| 0),
        Command::Cluster(c) => cluster::run(&mut ctx, c).await.map(|()| 0),
        Command::Snapshot(c) => snapshot::run(&mut ctx, c).await.map(|()| 0),
        Command::Whoami => auth::whoami(&mut ctx).await.map(|()| 0),
        Command::Auth(c) => auth::auth(&mut ctx, c).await,
        Command::Admin(c) => auth::admin(&mut ctx, c).await.map(|()| 0),
        Command::Audit(a) => auth::audit(&mut ctx, &a).await.map(|()| 0),
        Command::Config(_)
        | Command::Completion(_)
        | Command::Install(_)
        | Command::Uninstall(_)
        | Command::Explain(_)
        | Command::Model(_)
        | Command::Up(_)
        | Command::Down(_)
        | Command::Login(_) => Ok(0),
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

/// A job named on the command line: `NAME` (a TrainingJob, as kubectl's default is a pod) or
/// `KIND/NAME` with KIND a TrainingJob or InferenceService alias (`tj/x`, `isvc/y`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub kind: Kind,
    pub name: String,
}

impl JobRef {
    /// `trainingjob/x`.
    pub fn display(&self) -> String {
        display_name(self.kind.as_str(), &self.name)
    }
}

pub fn parse_job_ref(s: &str) -> Result<JobRef> {
    let (kind, name) = match s.split_once('/') {
        None => (Kind::TrainingJob, s),
        Some((k, n)) => (parse_kind(k).with_context(|| format!("JOB {s:?}"))?, n),
    };
    if !matches!(kind, Kind::TrainingJob | Kind::InferenceService) {
        bail!(
            "JOB {s:?}: a {kind} is not a job; expected NAME (a TrainingJob), tj/NAME or isvc/NAME"
        );
    }
    check_name(s, name, "JOB", "NAME, tj/NAME or isvc/NAME")?;
    Ok(JobRef {
        kind,
        name: name.to_string(),
    })
}

/// `KIND/NAME` (any kind or alias), as `wait` and `events --for` take it.
pub fn parse_object_ref(s: &str) -> Result<(Kind, String)> {
    let Some((k, name)) = s.split_once('/') else {
        bail!("{s:?}: expected KIND/NAME, e.g. tj/train or node/mac1");
    };
    let kind = parse_kind(k).with_context(|| format!("{s:?}"))?;
    check_name(s, name, "KIND/NAME", "KIND/NAME")?;
    Ok((kind, name.to_string()))
}

fn check_name(whole: &str, name: &str, what: &str, expected: &str) -> Result<()> {
    if name.is_empty() {
        bail!("{what} {whole:?}: the name is missing; expected {expected}");
    }
    if name.contains('/') || name.chars().any(char::is_whitespace) {
        bail!("{what} {whole:?}: {name:?} is not a name; expected {expected}");
    }
    Ok(())
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

    #[test]
    fn job_arguments() {
        let job = |s: &str| parse_job_ref(s).map(|j| (j.kind, j.name));
        assert_eq!(
            job("x").expect("bare"),
            (Kind::TrainingJob, "x".to_string())
        );
        assert_eq!(
            job("tj/x").expect("tj"),
            (Kind::TrainingJob, "x".to_string())
        );
        assert_eq!(
            job("trainingjob/x").expect("long"),
            (Kind::TrainingJob, "x".to_string())
        );
        assert_eq!(
            job("TrainingJob/x").expect("canonical"),
            (Kind::TrainingJob, "x".to_string())
        );
        assert_eq!(
            job("isvc/y").expect("isvc"),
            (Kind::InferenceService, "y".to_string())
        );
        assert_eq!(
            parse_job_ref("isvc/y").expect("isvc").display(),
            "inferenceservice/y"
        );

        let e = format!("{:#}", job("model/m").expect_err("not a job"));
        assert!(
            e.contains("Model is not a job") && e.contains("tj/NAME"),
            "{e}"
        );
        let e = format!("{:#}", job("pods/p").expect_err("unknown kind"));
        assert!(e.contains("unknown kind \"pods\""), "{e}");
        for bad in ["", "tj/", "tj/a/b", "a b", "/x"] {
            assert!(job(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn object_arguments() {
        assert_eq!(
            parse_object_ref("node/mac1").expect("node"),
            (Kind::Node, "mac1".to_string())
        );
        assert_eq!(
            parse_object_ref("tj/x").expect("tj"),
            (Kind::TrainingJob, "x".to_string())
        );
        let e = parse_object_ref("x").expect_err("no kind").to_string();
        assert!(e.contains("KIND/NAME"), "{e}");
        assert!(parse_object_ref("pods/x").is_err());
        assert!(parse_object_ref("tj/").is_err());
    }
}
