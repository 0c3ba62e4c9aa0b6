//! The node's identity: joining with a token once, then the credential (and, with TLS, the node
//! certificate, `super::tls`) kept in the data dir, so a restarted nodelet needs no token.
//!
//! The token comes from a file, stdin or the environment, never the command line, and is read
//! only when the node has not joined yet. Nothing the admin gave is deleted; after the join the
//! token is not read again.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tb_api::proto::JoinRequest;
use tb_api::{Object, ObjectMeta};

use super::controllers::Controllers;

/// How long joining may take, retries across the controllers included.
const JOIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Credential {
    pub node: String,
    pub credential: String,
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("credential.json")
}

pub fn load(data_dir: &Path) -> anyhow::Result<Option<Credential>> {
    let p = path(data_dir);
    match std::fs::read_to_string(&p) {
        Ok(text) => {
            let c: Credential = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a tb node credential", p.display()))?;
            Ok(Some(c))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

fn save(data_dir: &Path, c: &Credential) -> anyhow::Result<()> {
    let p = path(data_dir);
    let tmp = p.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(c)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))?;
    Ok(())
}

/// Where the join token is.
#[derive(Debug, Clone)]
pub enum JoinTokenSource {
    /// `--join-token-file FILE`.
    File(PathBuf),
    /// `--join-token-file -`.
    Stdin,
    /// `$TB_JOIN_TOKEN`.
    Env(String),
}

/// The longest join token file read (a token is about 70 bytes).
const MAX_TOKEN_FILE: u64 = 4096;

impl JoinTokenSource {
    /// The token, trimmed; an error names where it was looked for.
    pub fn read(&self) -> anyhow::Result<String> {
        use std::io::Read;
        let (text, from) = match self {
            JoinTokenSource::File(p) => {
                let f = std::fs::File::open(p)
                    .with_context(|| format!("--join-token-file {}", p.display()))?;
                let mut text = String::new();
                f.take(MAX_TOKEN_FILE)
                    .read_to_string(&mut text)
                    .with_context(|| format!("--join-token-file {}", p.display()))?;
                (text, format!("--join-token-file {}", p.display()))
            }
            JoinTokenSource::Stdin => {
                let mut text = String::new();
                std::io::stdin()
                    .take(MAX_TOKEN_FILE)
                    .read_to_string(&mut text)
                    .context("--join-token-file -: reading stdin")?;
                (text, "--join-token-file - (stdin)".to_string())
            }
            JoinTokenSource::Env(t) => (t.clone(), "TB_JOIN_TOKEN".to_string()),
        };
        let token = text.trim();
        if !token.starts_with("tbjoin-") || token.contains(char::is_whitespace) {
            anyhow::bail!(
                "{from}: expected one join token (tbjoin-…, from `tbctl token create`), got {} \
                 bytes",
                token.len()
            );
        }
        Ok(token.to_string())
    }
}

/// The credential this node uses: the saved one, or a new one from joining with the token.
pub async fn establish(
    controllers: &Controllers,
    data_dir: &Path,
    name: &str,
    token: Option<&JoinTokenSource>,
    node: Object,
    protocol_version: u32,
) -> anyhow::Result<Credential> {
    if let Some(c) = load(data_dir)? {
        if c.node != name {
            anyhow::bail!(
                "{} belongs to node {:?}, not {name:?}; use another --data-dir or the same --name",
                path(data_dir).display(),
                c.node
            );
        }
        return Ok(c);
    }
    let token = token
        .context(
            "this node has not joined yet: pass a join token with --join-token-file FILE (or \
             TB_JOIN_TOKEN); create one with `tbctl token create`",
        )?
        .read()?;
    // Controllers may still be starting: the client retries across them within the budget.
    let mut client = controllers.client_for(JOIN_TIMEOUT);
    let reply = client
        .join(JoinRequest {
            token,
            node_json: node.to_json(),
            protocol_version: Some(protocol_version),
        })
        .await
        .map_err(|e| anyhow::anyhow!("joining as {name}: {e}"))?;
    controllers.remember(&client);
    // The certificate first: a credential without it would not be asked again.
    super::tls::save(
        data_dir,
        &reply.node_cert_pem,
        &reply.node_key_pem,
        &reply.ca_cert_pem,
    )?;
    let c = Credential {
        node: name.to_string(),
        credential: reply.credential,
    };
    save(data_dir, &c)?;
    tracing::info!(node = name, "joined the cluster");
    Ok(c)
}

/// The Node object a nodelet registers.
pub fn node_object(
    name: &str,
    labels: std::collections::BTreeMap<String, String>,
    address: &str,
    status: serde_json::Value,
) -> Object {
    Object {
        api_version: tb_api::API_VERSION.into(),
        kind: tb_api::Kind::Node.as_str().into(),
        metadata: ObjectMeta {
            name: name.to_string(),
            labels,
            ..Default::default()
        },
        spec: serde_json::json!({ "address": address }),
        status,
    }
}
