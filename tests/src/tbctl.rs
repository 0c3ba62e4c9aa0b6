//! Runs `tbctl` as a user would and captures what it said.
//!
//! Every run gets a private `HOME` and `XDG_CONFIG_HOME` (so no user config or context leaks
//! in), no `TB_*` variables from the environment but `TB_TOKEN` (the harness's admin token, see
//! [`crate::auth`], unless [`Tbctl::with_token`] says otherwise) and `TB_CA_CERT` (the
//! harness's CA unless [`Tbctl::with_ca`] says otherwise), and the server list passed with
//! `--server`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Longest a single tbctl run may take before the test fails.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// What a run printed and how it exited.
#[derive(Debug, Clone)]
pub struct TbctlOutput {
    pub args: Vec<String>,
    /// `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl TbctlOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Panic (showing everything) unless the exit code is `code`.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "unexpected exit code from {self}");
        self
    }

    /// Parse stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}) in {self}"))
    }
}

impl std::fmt::Display for TbctlOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`tbctl {}` exited {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        )
    }
}

/// A tbctl bound to a server list and a private home directory.
pub struct Tbctl {
    servers: String,
    home: PathBuf,
    /// Passed as TB_TOKEN: the harness's admin token unless changed.
    token: Option<String>,
    /// Passed as TB_CA_CERT: the harness's CA unless changed.
    ca: Option<PathBuf>,
}

impl Tbctl {
    /// `servers` is passed as `--server` (comma-separated, in failover order).
    pub fn new(servers: &[String], home: &Path) -> Tbctl {
        std::fs::create_dir_all(home)
            .unwrap_or_else(|e| panic!("creating {}: {e}", home.display()));
        Tbctl {
            servers: servers.join(","),
            home: home.to_path_buf(),
            token: Some(crate::auth::admin_token().to_string()),
            ca: Some(crate::auth::ca_cert().to_path_buf()),
        }
    }

    /// The same tbctl trusting the CA in `ca` (None: no CA, plain TCP).
    pub fn with_ca(&self, ca: Option<&Path>) -> Tbctl {
        Tbctl {
            servers: self.servers.clone(),
            home: self.home.clone(),
            token: self.token.clone(),
            ca: ca.map(Path::to_path_buf),
        }
    }

    /// The same tbctl calling with `token` (None: no token at all).
    pub fn with_token(&self, token: Option<&str>) -> Tbctl {
        Tbctl {
            servers: self.servers.clone(),
            home: self.home.clone(),
            token: token.map(str::to_string),
            ca: self.ca.clone(),
        }
    }

    /// Run `tbctl --server SERVERS ARGS...` in `cwd` (the home directory when `None`).
    pub async fn run_in(&self, cwd: Option<&Path>, args: &[&str]) -> TbctlOutput {
        let mut full: Vec<String> = vec!["--server".into(), self.servers.clone()];
        full.extend(args.iter().map(|a| a.to_string()));
        let mut cmd = tokio::process::Command::new(crate::bins::tbctl());
        cmd.env(crate::ENGINE_CALIBRATION.0, crate::ENGINE_CALIBRATION.1);
        cmd.args(&full)
            .current_dir(cwd.unwrap_or(&self.home))
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TB_") {
                cmd.env_remove(k);
            }
        }
        if let Some(t) = &self.token {
            cmd.env("TB_TOKEN", t);
        }
        if let Some(ca) = &self.ca {
            cmd.env("TB_CA_CERT", ca);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting tbctl: {e}"));
        let output = match tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => panic!("waiting for tbctl {}: {e}", full.join(" ")),
            Err(_) => panic!(
                "tbctl {} did not finish within {RUN_TIMEOUT:?}",
                full.join(" ")
            ),
        };
        TbctlOutput {
            args: full,
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Run `tbctl --server SERVERS ARGS...`.
    pub async fn run(&self, args: &[&str]) -> TbctlOutput {
        self.run_in(None, args).await
    }
}
