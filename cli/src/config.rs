//! tbctl's contexts: the config file (`~/.config/tb/config.yaml`) and how the server list and
//! namespace of a command are chosen from flags, environment and the current context.
//!
//! File format:
//!
//! ```yaml
//! current-context: lab
//! contexts:
//! - name: lab
//!   server: mac1:7400,mac2:7400,mac3:7400
//!   namespace: team-a
//!   token: tbuser-…        # from `tbctl login`; the file is kept mode 0600
//!   ca-cert: /path/ca.pem  # the cluster CA (`tbctl login --ca-cert`, `tbctl up`)
//!   insecure: true         # only without a CA: send the token in clear text
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::servers::{DEFAULT_SERVER, ServerAddr, parse_server_list};

/// The namespace used when neither `-n` nor the context names one.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConfigFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: Vec<Context>,
}

/// A named set of defaults: which controllers to talk to and which namespace to use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub name: String,
    /// `HOST:PORT[,HOST:PORT...]`, tried in order.
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The bearer token calls carry (`tbctl login`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The cluster CA's certificate file (`tbctl login --ca-cert`, `tbctl up`): tbctl speaks
    /// TLS and verifies the controllers with it.
    #[serde(default, rename = "ca-cert", skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
    /// Send the token over plain TCP when there is no CA (`tbctl login --insecure`): the
    /// token then crosses the network in clear text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

impl ConfigFile {
    pub fn context(&self, name: &str) -> Option<&Context> {
        self.contexts.iter().find(|c| c.name == name)
    }

    /// Read the file; a missing file is an empty configuration.
    pub fn load(path: &Path) -> Result<ConfigFile> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ConfigFile::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if text.trim().is_empty() {
            return Ok(ConfigFile::default());
        }
        serde_yaml::from_str(&text)
            .with_context(|| format!("{}: not a tbctl config file", path.display()))
    }

    /// Write the file atomically (a temporary file renamed over it), creating its directory,
    /// so a crash or a concurrent reader never sees half a file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = serde_yaml::to_string(self).context("encoding the config file")?;
        let file_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("config.yaml");
        let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            // The file may hold tokens: only its owner reads it.
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        Ok(())
    }
}

/// Where the config file lives: `$TB_CONFIG`, else `$XDG_CONFIG_HOME/tb/config.yaml`, else
/// `~/.config/tb/config.yaml`.
pub fn config_path() -> Result<PathBuf> {
    config_path_from(|k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

fn config_path_from(env: impl Fn(&str) -> Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = env("TB_CONFIG") {
        return Ok(p);
    }
    if let Some(xdg) = env("XDG_CONFIG_HOME") {
        return Ok(xdg.join("tb").join("config.yaml"));
    }
    match env("HOME") {
        Some(home) => Ok(home.join(".config").join("tb").join("config.yaml")),
        None => bail!("cannot find the config file: set TB_CONFIG or HOME"),
    }
}

/// What the user asked for on the command line and in the environment.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--server`.
    pub server_flag: Option<String>,
    /// `$TB_SERVER`.
    pub server_env: Option<String>,
    /// `--context`.
    pub context: Option<String>,
    /// `-n/--namespace`.
    pub namespace: Option<String>,
    /// `--token`.
    pub token_flag: Option<String>,
    /// `$TB_TOKEN`.
    pub token_env: Option<String>,
    /// `--ca-cert`.
    pub ca_flag: Option<PathBuf>,
    /// `$TB_CA_CERT`.
    pub ca_env: Option<PathBuf>,
    /// `--insecure`.
    pub insecure_flag: bool,
}

/// Whether a token may go over plain TCP: `--insecure`, else the context's `insecure`.
pub fn resolve_insecure(o: &Overrides, file: &ConfigFile) -> bool {
    if o.insecure_flag {
        return true;
    }
    o.context
        .as_ref()
        .or(file.current_context.as_ref())
        .and_then(|name| file.context(name))
        .is_some_and(|c| c.insecure)
}

/// The cluster CA's file: `--ca-cert` > `TB_CA_CERT` > the context's; None: plain TCP.
pub fn resolve_ca(o: &Overrides, file: &ConfigFile) -> Option<PathBuf> {
    if let Some(p) = o.ca_flag.clone().or_else(|| o.ca_env.clone()) {
        return Some(p);
    }
    let name = o.context.as_ref().or(file.current_context.as_ref())?;
    file.context(name).and_then(|c| c.ca_cert.clone())
}

/// The bearer token: `--token` > `TB_TOKEN` > the context's (`--context`, else the current).
pub fn resolve_token(o: &Overrides, file: &ConfigFile) -> Option<String> {
    if let Some(t) = o.token_flag.clone().or_else(|| o.token_env.clone()) {
        return Some(t);
    }
    let name = o.context.as_ref().or(file.current_context.as_ref())?;
    file.context(name).and_then(|c| c.token.clone())
}

/// The servers and namespace a command runs against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub servers: Vec<ServerAddr>,
    pub namespace: String,
    /// Whether `-n` was given, as opposed to a default: an object that names another namespace
    /// is then an error rather than a choice.
    pub namespace_explicit: bool,
}

/// Choose servers (`--server` > `TB_SERVER` > context > the local default) and namespace
/// (`-n` > context > `default`). The context is `--context`, else the file's current context.
pub fn resolve(o: &Overrides, file: &ConfigFile) -> Result<Target> {
    let context = match (&o.context, &file.current_context) {
        (Some(name), _) => Some(
            file.context(name)
                .ok_or_else(|| unknown_context(name, file))?,
        ),
        // A current-context that no longer exists is ignored; `config use-context` fixes it.
        (None, Some(name)) => file.context(name),
        (None, None) => None,
    };
    let servers = if let Some(s) = &o.server_flag {
        parse_server_list(s).context("--server")?
    } else if let Some(s) = &o.server_env {
        parse_server_list(s).context("TB_SERVER")?
    } else if let Some(c) = context {
        parse_server_list(&c.server).with_context(|| format!("context {:?}", c.name))?
    } else {
        parse_server_list(DEFAULT_SERVER)?
    };
    let namespace_explicit = o.namespace.is_some();
    let namespace = o
        .namespace
        .clone()
        .or_else(|| context.and_then(|c| c.namespace.clone()))
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    if namespace.is_empty() {
        bail!("--namespace: expected a namespace name, got an empty string");
    }
    Ok(Target {
        servers,
        namespace,
        namespace_explicit,
    })
}

pub fn unknown_context(name: &str, file: &ConfigFile) -> anyhow::Error {
    let names: Vec<&str> = file.contexts.iter().map(|c| c.name.as_str()).collect();
    if names.is_empty() {
        anyhow::anyhow!(
            "context {name:?} not found: no contexts are defined (see `tbctl config set-context`)"
        )
    } else {
        anyhow::anyhow!(
            "context {name:?} not found; defined contexts: {}",
            names.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConfigFile {
        ConfigFile {
            current_context: Some("lab".into()),
            contexts: vec![
                Context {
                    name: "lab".into(),
                    server: "mac1:7400,mac2:7400".into(),
                    namespace: Some("team-a".into()),
                    token: None,
                    ca_cert: Some("/lab/ca.pem".into()),
                    insecure: false,
                },
                Context {
                    name: "home".into(),
                    server: "127.0.0.1:7400".into(),
                    namespace: None,
                    token: None,
                    ca_cert: None,
                    insecure: false,
                },
            ],
        }
    }

    fn servers(t: &Target) -> Vec<&str> {
        t.servers.iter().map(AsRef::as_ref).collect()
    }

    #[test]
    fn round_trips_through_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested").join("config.yaml");
        assert_eq!(
            ConfigFile::load(&path).expect("missing is empty"),
            ConfigFile::default()
        );
        sample().save(&path).expect("save");
        assert_eq!(ConfigFile::load(&path).expect("load"), sample());
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("current-context: lab"), "{text}");
        // No temporary file is left behind.
        let entries = std::fs::read_dir(path.parent().expect("dir"))
            .expect("ls")
            .count();
        assert_eq!(entries, 1);
    }

    #[test]
    fn reads_the_documented_format() {
        let f: ConfigFile = serde_yaml::from_str(
            "current-context: a\ncontexts:\n- name: a\n  server: x:1\n  namespace: ns\n  ca-cert: /a/ca.pem\n- {name: b, server: 'y:2'}\n",
        )
        .expect("parse");
        assert_eq!(f.current_context.as_deref(), Some("a"));
        assert_eq!(f.context("b").map(|c| c.server.as_str()), Some("y:2"));
        assert_eq!(
            f.context("a").and_then(|c| c.ca_cert.clone()),
            Some(PathBuf::from("/a/ca.pem"))
        );
    }

    #[test]
    fn bad_file_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "contexts: 7\n").expect("write");
        let e = format!("{:#}", ConfigFile::load(&path).expect_err("bad"));
        assert!(e.contains("config.yaml"), "{e}");
    }

    #[test]
    fn server_precedence() {
        let file = sample();
        let mut o = Overrides::default();
        let t = resolve(&o, &file).expect("context");
        assert_eq!(servers(&t), ["mac1:7400", "mac2:7400"]);
        assert_eq!(t.namespace, "team-a");
        assert!(!t.namespace_explicit);

        o.context = Some("home".into());
        let t = resolve(&o, &file).expect("--context");
        assert_eq!(servers(&t), ["127.0.0.1:7400"]);
        assert_eq!(t.namespace, "default");

        o.server_env = Some("env:1".into());
        assert_eq!(servers(&resolve(&o, &file).expect("env")), ["env:1"]);

        o.server_flag = Some("flag:1,flag:2".into());
        assert_eq!(
            servers(&resolve(&o, &file).expect("flag")),
            ["flag:1", "flag:2"]
        );

        o.namespace = Some("ns".into());
        let t = resolve(&o, &file).expect("-n");
        assert_eq!(t.namespace, "ns");
        assert!(t.namespace_explicit);
    }

    #[test]
    fn ca_precedence() {
        let file = sample();
        let mut o = Overrides::default();
        assert_eq!(resolve_ca(&o, &file), Some(PathBuf::from("/lab/ca.pem")));
        o.context = Some("home".into());
        assert_eq!(resolve_ca(&o, &file), None);
        o.ca_env = Some("/env/ca.pem".into());
        assert_eq!(resolve_ca(&o, &file), Some(PathBuf::from("/env/ca.pem")));
        o.ca_flag = Some("/flag/ca.pem".into());
        assert_eq!(resolve_ca(&o, &file), Some(PathBuf::from("/flag/ca.pem")));
    }

    #[test]
    fn defaults_without_any_configuration() {
        let t = resolve(&Overrides::default(), &ConfigFile::default()).expect("defaults");
        assert_eq!(servers(&t), [DEFAULT_SERVER]);
        assert_eq!(t.namespace, DEFAULT_NAMESPACE);
    }

    #[test]
    fn unknown_context_lists_known_ones() {
        let o = Overrides {
            context: Some("nope".into()),
            ..Default::default()
        };
        let e = resolve(&o, &sample()).expect_err("unknown").to_string();
        assert!(e.contains("lab") && e.contains("home"), "{e}");
    }

    #[test]
    fn bad_server_names_its_source() {
        let o = Overrides {
            server_env: Some("nope".into()),
            ..Default::default()
        };
        let e = format!(
            "{:#}",
            resolve(&o, &ConfigFile::default()).expect_err("bad")
        );
        assert!(e.starts_with("TB_SERVER"), "{e}");
    }

    #[test]
    fn config_path_precedence() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| PathBuf::from(v))
            }
        };
        let p = config_path_from(env(&[
            ("TB_CONFIG", "/x/c.yaml"),
            ("XDG_CONFIG_HOME", "/xdg"),
            ("HOME", "/h"),
        ]));
        assert_eq!(p.expect("path"), PathBuf::from("/x/c.yaml"));
        let p = config_path_from(env(&[("XDG_CONFIG_HOME", "/xdg"), ("HOME", "/h")]));
        assert_eq!(p.expect("path"), PathBuf::from("/xdg/tb/config.yaml"));
        let p = config_path_from(env(&[("HOME", "/h")]));
        assert_eq!(p.expect("path"), PathBuf::from("/h/.config/tb/config.yaml"));
        assert!(config_path_from(env(&[])).is_err());
    }
}
