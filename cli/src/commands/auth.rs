//! Identity verbs: `login` (keep a token and/or the cluster CA in the context), `whoami`, `auth can-i`, `admin user
//! …`, `admin token …` and `audit`.
//!
//! Output contracts: `admin user create` and `admin token create` print the token alone on one
//! line of stdout (shown once; the id and expiry go to stderr); `auth can-i` prints `yes` or
//! `no` and exits 0 or 1 — the answer is the server's.

use std::io::Read;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use tb_api::proto::{AuditRequest, CanIRequest, CreateUserRequest, IssueTokenRequest};

use super::Ctx;
use crate::args::{
    AdminCommand, AdminTokenCommand, AdminUserCommand, AuditArgs, AuthCommand, LoginArgs,
};
use crate::config::{ConfigFile, Context, Overrides, config_path};
use crate::output::{OutputFormat, Table, emit};
use crate::servers::DEFAULT_SERVER;

/// `tbctl login`: store the token (and with `--ca-cert` the cluster CA, as an absolute path) in
/// the context (`--context`, else the current one; a context `default` is made when there is
/// none), next to its servers. With `--ca-cert` and no `--token-file`, only the CA is stored.
pub fn login(args: &LoginArgs, o: &Overrides) -> Result<()> {
    let ca = match &o.ca_flag {
        Some(p) => {
            crate::tls::Trust::load(p)?;
            Some(std::path::absolute(p).with_context(|| format!("--ca-cert {}", p.display()))?)
        }
        None => None,
    };
    let token = if ca.is_some() && args.token_file.is_none() {
        None
    } else {
        let mut text = String::new();
        match &args.token_file {
            Some(p) if p.as_os_str() != "-" => {
                text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?
            }
            _ => {
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("reading the token from stdin")?;
            }
        }
        let token = text.trim().to_string();
        if token.is_empty() || token.contains(char::is_whitespace) {
            bail!(
                "expected one token (tbuser-…), got {} characters",
                token.len()
            );
        }
        Some(token)
    };
    let path = config_path()?;
    let mut file = ConfigFile::load(&path)?;
    let name = o
        .context
        .clone()
        .or_else(|| file.current_context.clone())
        .unwrap_or_else(|| "default".to_string());
    match file.contexts.iter_mut().find(|c| c.name == name) {
        Some(c) => {
            if token.is_some() {
                c.token = token.clone();
            }
            if ca.is_some() {
                c.ca_cert = ca.clone();
            }
            if o.insecure_flag {
                c.insecure = true;
            }
        }
        None => {
            let server = o
                .server_flag
                .clone()
                .or_else(|| o.server_env.clone())
                .unwrap_or_else(|| DEFAULT_SERVER.to_string());
            file.contexts.push(Context {
                name: name.clone(),
                server,
                namespace: None,
                token: token.clone(),
                ca_cert: ca.clone(),
                insecure: o.insecure_flag,
            });
        }
    }
    if file.current_context.is_none() {
        file.current_context = Some(name.clone());
    }
    file.save(&path)?;
    let what = match (&token, &ca) {
        (Some(_), Some(_)) => "token and CA",
        (Some(_), None) => "token",
        _ => "CA",
    };
    eprintln!("{what} stored in context {name:?} ({})", path.display());
    Ok(())
}

pub async fn whoami(ctx: &mut Ctx) -> Result<()> {
    let me = ctx.client().who_am_i().await?;
    let mut line = format!("{} {}", me.kind, me.name);
    if !me.role.is_empty() {
        line.push_str(&format!(" (role {})", me.role));
    }
    if !me.namespaces.is_empty() {
        line.push_str(&format!(", namespaces {}", me.namespaces.join(", ")));
    }
    emit(&format!("{}\n", line.trim()))
}

pub async fn auth(ctx: &mut Ctx, cmd: AuthCommand) -> Result<u8> {
    match cmd {
        AuthCommand::CanI { verb, kind, name } => {
            let req = CanIRequest {
                verb,
                kind,
                namespace: ctx.target.namespace.clone(),
                name: name.unwrap_or_default(),
            };
            let answer = ctx.client().can_i(req).await?;
            if answer.allowed {
                emit("yes\n")?;
                Ok(0)
            } else {
                emit("no\n")?;
                if !answer.reason.is_empty() {
                    eprintln!("{}", answer.reason);
                }
                Ok(1)
            }
        }
    }
}

pub async fn admin(ctx: &mut Ctx, cmd: AdminCommand) -> Result<()> {
    match cmd {
        AdminCommand::User(AdminUserCommand::Create {
            name,
            role,
            namespaces,
            ttl,
        }) => {
            let mut namespaces = namespaces;
            if ctx.target.namespace_explicit {
                namespaces.extend(
                    ctx.target
                        .namespace
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_string),
                );
            }
            let t = ctx
                .client()
                .create_user(CreateUserRequest {
                    name,
                    role,
                    namespaces,
                    ttl_seconds: ttl,
                })
                .await?;
            emit(&format!("{}\n", t.token))?;
            eprintln!(
                "user {} created; token id {} expires at {}",
                t.user, t.id, t.expires_at
            );
            Ok(())
        }
        AdminCommand::User(AdminUserCommand::List { output }) => {
            let users = ctx.client().list_users().await?.users;
            let value: Vec<serde_json::Value> = users
                .iter()
                .map(|u| {
                    json!({
                        "name": u.name,
                        "role": u.role,
                        "namespaces": u.namespaces,
                        "createdAt": u.created_at,
                        "tokens": u.tokens.iter().map(|t| json!({
                            "id": t.id,
                            "expiresAt": t.expires_at,
                            "createdAt": t.created_at,
                            "description": t.description,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            match output {
                Some(OutputFormat::Json) => {
                    emit(&format!("{}\n", serde_json::to_string_pretty(&value)?))
                }
                Some(OutputFormat::Yaml) => emit(&serde_yaml::to_string(&value)?),
                _ => {
                    let mut t = Table::new(["NAME", "ROLE", "NAMESPACES", "TOKENS"]);
                    for u in &users {
                        let tokens: Vec<String> = u
                            .tokens
                            .iter()
                            .map(|t| format!("{} (until {})", t.id, t.expires_at))
                            .collect();
                        t.push(vec![
                            u.name.clone(),
                            u.role.clone(),
                            or_dash(u.namespaces.join(",")),
                            or_dash(tokens.join(", ")),
                        ]);
                    }
                    emit(&t.render())
                }
            }
        }
        AdminCommand::User(AdminUserCommand::Delete { name }) => {
            ctx.client().delete_user(&name).await?;
            emit(&format!("user {name} deleted\n"))
        }
        AdminCommand::Token(AdminTokenCommand::Create {
            user,
            ttl,
            description,
        }) => {
            let t = ctx
                .client()
                .issue_token(IssueTokenRequest {
                    user,
                    ttl_seconds: ttl,
                    description: description.unwrap_or_default(),
                })
                .await?;
            emit(&format!("{}\n", t.token))?;
            eprintln!(
                "token id {} for user {} expires at {}",
                t.id, t.user, t.expires_at
            );
            Ok(())
        }
        AdminCommand::Token(AdminTokenCommand::Revoke { id }) => {
            ctx.client().revoke_token(&id).await?;
            emit(&format!("token {id} revoked\n"))
        }
    }
}

pub async fn audit(ctx: &mut Ctx, args: &AuditArgs) -> Result<()> {
    let since = match args.since {
        None => String::new(),
        Some(secs) => {
            let secs = i64::try_from(secs).map_err(|_| anyhow::anyhow!("--since: too long"))?;
            let delta = chrono::TimeDelta::try_seconds(secs)
                .ok_or_else(|| anyhow::anyhow!("--since: too long"))?;
            let at = chrono::Utc::now()
                .checked_sub_signed(delta)
                .ok_or_else(|| anyhow::anyhow!("--since: too long"))?;
            at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        }
    };
    let records = ctx
        .client()
        .audit(AuditRequest {
            user: args.user.clone().unwrap_or_default(),
            since,
        })
        .await?
        .records;
    let value: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            json!({
                "time": r.time, "user": r.user, "verb": r.verb, "kind": r.kind,
                "namespace": r.namespace, "name": r.name, "result": r.result,
            })
        })
        .collect();
    match args.output {
        Some(OutputFormat::Json) => emit(&format!("{}\n", serde_json::to_string_pretty(&value)?)),
        Some(OutputFormat::Yaml) => emit(&serde_yaml::to_string(&value)?),
        Some(other) => bail!("-o {other:?}: audit prints a table, json or yaml"),
        None => {
            let mut t = Table::new([
                "TIME",
                "USER",
                "VERB",
                "KIND",
                "NAMESPACE",
                "NAME",
                "RESULT",
            ]);
            for r in &records {
                t.push(vec![
                    r.time.clone(),
                    r.user.clone(),
                    r.verb.clone(),
                    r.kind.clone(),
                    or_dash(r.namespace.clone()),
                    or_dash(r.name.clone()),
                    r.result.clone(),
                ]);
            }
            emit(&t.render())
        }
    }
}

fn or_dash(s: String) -> String {
    if s.is_empty() { "-".into() } else { s }
}
