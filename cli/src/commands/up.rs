//! `tbctl up`: a whole cluster on this machine, for trying tb out and for development: one
//! controller and N nodelets, each a detached process (a session of its own, output in
//! `DIR/<name>.log`), recorded in `DIR/pids` for `tbctl down` (see `local`).
//!
//! Steps: find `tb-controller` and `tb-nodelet` (next to tbctl, else on PATH); start the
//! controller on 127.0.0.1:PORT and wait for it to elect itself leader; create a single-use
//! join token per nodelet, bound to its name, and hand it over in the environment
//! (`TB_JOIN_TOKEN`), never on a command line; start `node-1..N`, each with its own endpoint
//! port and port range for ranks (the ports come from `portplan`: by default the controller on
//! `--port` and ranges at 32323+100*(i-1) ..= +99, with `--port-range` all from that range)
//! and its share of the machine's cores for built-in ranks (`--engine-threads`);
//! point the context `local` (or `--context NAME`) at the controller and make it current;
//! wait until every Node is Ready; print a table of the processes. If a cluster from the same
//! data directory is already running it says so and exits 0. If anything fails, the processes
//! started by this run are stopped again (their logs stay) and the error names the log to read.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use chrono::{DateTime, Utc};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tb_api::proto::{CreateTokenRequest, ListRequest};
use tb_api::{Kind, Object};
use tokio::time::Instant;

use super::parse_object;
use crate::args::UpArgs;
use crate::client::Client;
use crate::columns::{at, condition};
use crate::config::{ConfigFile, Context, config_path};
use crate::local::{self, CONTEXT, Proc};
use crate::output::{Table, emit};
use crate::portplan::{PortPlan, PortRange};
use crate::servers::parse_server_list;
use crate::tls::Trust;
use tb_api::controller_files::ADMIN_TOKEN_FILE;
use tb_api::controller_files::CA_CERT_FILE;

/// How long the controller gets to elect itself, and the nodelets to become Ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(250);
/// Lines of a failed process's log quoted in the error.
const LOG_LINES: usize = 15;

/// The nodelet's command line. Its join token is not on it (every local user can read a command
/// line): it goes in the nodelet's environment, `TB_JOIN_TOKEN`.
pub fn nodelet_args(
    i: u32,
    dir: &Path,
    controller: &str,
    listen_port: u16,
    ranks: PortRange,
) -> Vec<String> {
    vec![
        "--controller".into(),
        controller.into(),
        "--name".into(),
        node_name(i),
        "--data-dir".into(),
        dir.join(format!("nodelet-{i}")).display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{listen_port}"),
        "--port-range".into(),
        ranks.to_string(),
    ]
}

/// The CPU threads each of `nodelets` nodelets on a machine of `cores` gives a built-in rank:
/// an equal share, at least one.
pub fn engine_threads_share(cores: usize, nodelets: u32) -> u32 {
    let share = cores / (nodelets.max(1) as usize);
    u32::try_from(share).unwrap_or(u32::MAX).max(1)
}

pub fn node_name(i: u32) -> String {
    format!("node-{i}")
}

/// The described lab the local nodelets share (`--topology`): node-i has two ports on
/// loopback addresses, `lo1` (127.77.i.1) cabled to the next node's `lo2` (127.77.i+1.2) —
/// a chain of two, a ring from three. These "cables" are an emulation (the probes measure the
/// loopback): they give the placement links to split models along, as Thunderbolt cables
/// would on real Macs.
pub fn local_lab(nodelets: u32) -> String {
    let mut out = String::from(
        "# Written by `tbctl up`: the local nodelets and their loopback \"cables\" (an emulation).\nmacs:\n",
    );
    for i in 1..=nodelets {
        out.push_str(&format!(
            "  - {{name: {}, ports: [{{name: lo1, address: 127.77.{i}.1}}, {{name: lo2, address: 127.77.{i}.2}}]}}\n",
            node_name(i)
        ));
    }
    if nodelets >= 2 {
        out.push_str("links:\n");
        let last = if nodelets >= 3 { nodelets } else { 1 };
        for i in 1..=last {
            let next = i % nodelets + 1;
            out.push_str(&format!(
                "  - {{between: [{}/lo1, {}/lo2], bandwidthGbps: 40, latencyUs: 20}}\n",
                node_name(i),
                node_name(next)
            ));
        }
    }
    out
}

/// Set the context `local` to this cluster's controller, admin token and CA (replacing any
/// earlier one) and make it current.
pub fn point_context(
    file: &mut ConfigFile,
    name: &str,
    server: &str,
    token: Option<String>,
    ca_cert: Option<PathBuf>,
) {
    file.contexts.retain(|c| c.name != name);
    file.contexts.push(Context {
        name: name.into(),
        server: server.into(),
        namespace: None,
        token,
        ca_cert,
        insecure: false,
    });
    file.current_context = Some(name.into());
}

/// The Nodes among `want` that are not Ready in `nodes`, or whose last heartbeat is older than
/// `since` (a restarted cluster's Nodes still say Ready from before it stopped).
pub fn not_ready<'a>(want: &'a [String], nodes: &[Object], since: DateTime<Utc>) -> Vec<&'a str> {
    let fresh = |n: &Object| {
        at(&n.status, &["lastHeartbeatTime"])
            .and_then(Value::as_str)
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .is_some_and(|t| t.with_timezone(&Utc) >= since)
    };
    want.iter()
        .filter(|name| {
            !nodes.iter().any(|n| {
                &n.metadata.name == *name
                    && condition(n, "Ready").as_deref() == Some("True")
                    && fresh(n)
            })
        })
        .map(String::as_str)
        .collect()
}

/// A process this run started.
struct Started {
    proc: Proc,
    child: Child,
    log: PathBuf,
    address: String,
    /// The rank ports it was given (a nodelet), or `-`.
    ports: String,
}

/// What this run has started, recorded in the pids file as it grows.
struct Cluster {
    dir: PathBuf,
    started: Vec<Started>,
}

impl Cluster {
    /// Start `bin` with `args` and, besides tbctl's own environment, `env`.
    fn spawn(
        &mut self,
        name: &str,
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
        address: String,
        ports: String,
    ) -> Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = std::process::Command::new(bin);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent; it detaches
        // the child from tbctl's session and terminal, so it outlives tbctl and ^C.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = i32::try_from(child.id()).context("process id out of range")?;
        self.started.push(Started {
            proc: Proc {
                name: name.to_string(),
                pid,
            },
            child,
            log,
            address,
            ports,
        });
        let procs: Vec<Proc> = self.started.iter().map(|s| s.proc.clone()).collect();
        local::write_pids(&self.dir, &procs)
    }

    /// An error if a started process has exited, quoting its log.
    fn check_alive(&mut self) -> Result<()> {
        for s in &mut self.started {
            if let Ok(Some(status)) = s.child.try_wait() {
                let tail = local::log_tail(&s.log, LOG_LINES);
                let quoted = if tail.is_empty() {
                    String::new()
                } else {
                    format!("; the end of its log:\n{tail}")
                };
                bail!(
                    "{} exited ({status}); see {}{quoted}",
                    s.proc.name,
                    s.log.display()
                );
            }
        }
        Ok(())
    }

    /// Stop what this run started (its children: reaped here, not left as zombies).
    async fn tear_down(mut self) {
        for s in self.started.iter().rev() {
            let _ = kill(Pid::from_raw(s.proc.pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.started
                .retain_mut(|s| !matches!(s.child.try_wait(), Ok(Some(_)) | Err(_)));
            if self.started.is_empty() || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for s in &mut self.started {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        let _ = local::remove_pids(&self.dir);
    }
}

/// A port on 127.0.0.1 nothing listens on right now.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr().context("finding a free port")?.port())
}

/// `context`: the name of the context to write (the global `--context`), else `local`.
pub async fn run(args: &UpArgs, context: Option<&str>) -> Result<()> {
    let context = context.unwrap_or(CONTEXT);
    let plan = match args.port_range {
        Some(range) => PortPlan::within(range, args.nodelets)?,
        None => PortPlan::default_for(args.port, args.nodelets)?,
    };
    let dir = local::data_dir(args.data_dir.as_deref())?;
    if let Some(procs) = local::read_pids(&dir)? {
        let running: Vec<String> = procs
            .iter()
            .filter(|p| local::is_ours(p.pid))
            .map(|p| format!("{} pid {}", p.name, p.pid))
            .collect();
        if !running.is_empty() {
            return emit(&format!(
                "a local cluster is already running from {} ({}); `tbctl down` stops it\n",
                dir.display(),
                running.join(", ")
            ));
        }
        // Left by a cluster that is gone (a reboot, a kill): start afresh.
        local::remove_pids(&dir)?;
    }
    let controller_bin = local::locate("tb-controller")?;
    let nodelet_bin = local::locate("tb-nodelet")?;
    let server = format!("127.0.0.1:{}", plan.controller);
    for port in plan.listen_ports() {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!(
                "127.0.0.1:{port} is in use (another controller or local cluster?); give this \
                 cluster ports of its own with --port-range START-END (e.g. 41000-41999) and a \
                 data directory of its own with --data-dir"
            );
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cluster = Cluster {
        dir: dir.clone(),
        started: Vec::new(),
    };
    let bins = (controller_bin.as_path(), nodelet_bin.as_path());
    let token = match start(&mut cluster, args, &plan, &server, bins).await {
        Ok(token) => token,
        Err(e) => {
            cluster.tear_down().await;
            return Err(
                e.context("the local cluster did not start; what was started is stopped again")
            );
        }
    };
    let mut file_path_note = String::new();
    match config_path().and_then(|path| {
        let mut file = ConfigFile::load(&path)?;
        // The controller made the cluster CA in its data dir.
        let ca = std::path::absolute(dir.join("controller").join(CA_CERT_FILE)).ok();
        point_context(&mut file, context, &server, Some(token), ca);
        file.save(&path).map(|()| path)
    }) {
        Ok(path) => file_path_note.push_str(&format!(
            "context \"{context}\" ({server}) is now current in {}\n",
            path.display()
        )),
        Err(e) => file_path_note.push_str(&format!(
            "could not set the context \"{context}\": {e:#}; use --server {server}\n"
        )),
    }
    let mut t = Table::new(["NAME", "PID", "ADDRESS", "PORTS", "LOG"]);
    for s in &cluster.started {
        t.push(vec![
            s.proc.name.clone(),
            s.proc.pid.to_string(),
            s.address.clone(),
            s.ports.clone(),
            s.log.display().to_string(),
        ]);
    }
    emit(&format!(
        "{}{file_path_note}local cluster up: 1 controller, {} nodelets (state in {}; `tbctl down` stops it)\n\
         single-user development cluster: jobs run as your own account and can read its files\n\
         dashboard: https://127.0.0.1:{}/ui/ (sign in with the token in {}; the browser must trust {})\n",
        t.render(),
        args.nodelets,
        dir.display(),
        plan.services,
        dir.join("controller").join(ADMIN_TOKEN_FILE).display(),
        dir.join("controller").join(CA_CERT_FILE).display(),
    ))
}

async fn start(
    cluster: &mut Cluster,
    args: &UpArgs,
    plan: &PortPlan,
    server: &str,
    (controller_bin, nodelet_bin): (&Path, &Path),
) -> Result<String> {
    let dir = cluster.dir.clone();
    let controller_args: Vec<String> = vec![
        "--id".into(),
        "1".into(),
        "--listen".into(),
        server.into(),
        "--data-dir".into(),
        dir.join("controller").display().to_string(),
        // InferenceServices' stable address (`tbctl get isvc` shows each one's URL).
        "--services-listen".into(),
        format!("127.0.0.1:{}", plan.services),
    ];
    cluster.spawn(
        "controller",
        controller_bin,
        &controller_args,
        &[],
        server.into(),
        "-".into(),
    )?;

    // The controller makes the cluster CA before it serves; clients verify it with that.
    let deadline = Instant::now() + START_TIMEOUT;
    let ca_path = dir.join("controller").join(CA_CERT_FILE);
    let trust = loop {
        cluster.check_alive()?;
        match Trust::load(&ca_path) {
            Ok(t) => break t,
            Err(e) if Instant::now() >= deadline => {
                return Err(anyhow::Error::new(e).context(format!(
                    "the controller made no CA within {}s; see {}",
                    START_TIMEOUT.as_secs(),
                    dir.join("controller.log").display()
                )));
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    };
    let mut client = Client::new(parse_server_list(server)?, Duration::from_secs(1))
        .with_trust(Some(trust.clone()));
    loop {
        cluster.check_alive()?;
        match client.cluster_status().await {
            Ok(s) if s.has_leader => break,
            // Serving, and asking for credentials: the admin token is next.
            Err(e) if e.code == tonic::Code::Unauthenticated => break,
            Ok(_) => tracing::debug!("no leader yet"),
            Err(e) => tracing::debug!(error = %e, "controller not answering yet"),
        }
        if Instant::now() >= deadline {
            bail!(
                "the controller did not elect a leader within {}s; see {}",
                START_TIMEOUT.as_secs(),
                dir.join("controller.log").display()
            );
        }
        tokio::time::sleep(POLL).await;
    }

    // The controller writes its admin token once, when it forms the cluster.
    let token_path = dir.join("controller").join(ADMIN_TOKEN_FILE);
    let admin_token = loop {
        cluster.check_alive()?;
        if let Ok(t) = std::fs::read_to_string(&token_path)
            && !t.trim().is_empty()
        {
            break t.trim().to_string();
        }
        if Instant::now() >= deadline {
            bail!(
                "the controller wrote no admin token to {} within {}s; see {}",
                token_path.display(),
                START_TIMEOUT.as_secs(),
                dir.join("controller.log").display()
            );
        }
        tokio::time::sleep(POLL).await;
    };
    let mut client = Client::new(parse_server_list(server)?, Duration::from_secs(10))
        .with_token(Some(&admin_token))
        .with_trust(Some(trust));
    let names: Vec<String> = (1..=args.nodelets).map(node_name).collect();
    // The controller stamps heartbeats with this machine's clock.
    let started_at = Utc::now();
    let lab = dir.join("lab.yaml");
    std::fs::write(&lab, local_lab(args.nodelets))
        .with_context(|| format!("writing {}", lab.display()))?;
    let engine_threads = args.engine_threads.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        engine_threads_share(cores, args.nodelets)
    });
    for i in 1..=args.nodelets {
        // One single-use token per nodelet, for its name: a restarted nodelet needs none (it
        // keeps its credential), and one whose data dir was removed joins again in its place.
        let token = client
            .create_token(CreateTokenRequest {
                ttl_seconds: 3600,
                description: "tbctl up".into(),
                uses: 1,
                node: node_name(i),
            })
            .await
            .context("creating a join token")?
            .token;
        let ports = usize::try_from(i - 1)
            .ok()
            .and_then(|k| plan.nodelets.get(k))
            .context("the port plan has no entry for this nodelet")?;
        let port = match ports.listen {
            Some(p) => p,
            None => free_port()?,
        };
        let mut nodelet_args = nodelet_args(i, &dir, server, port, ports.ranks);
        nodelet_args.extend(["--ca-cert".to_string(), ca_path.display().to_string()]);
        nodelet_args.extend([
            "--topology".to_string(),
            lab.display().to_string(),
            "--probe-port".into(),
            "0".into(),
            // Jobs run as the account that ran `tbctl up`: a development cluster.
            "--single-user".into(),
            "--engine-threads".into(),
            engine_threads.to_string(),
        ]);
        cluster.spawn(
            &node_name(i),
            nodelet_bin,
            &nodelet_args,
            &[("TB_JOIN_TOKEN", token.as_str())],
            format!("127.0.0.1:{port}"),
            ports.ranks.to_string(),
        )?;
    }

    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        cluster.check_alive()?;
        let req = ListRequest {
            kind: Kind::Node.as_str().to_string(),
            namespace: String::new(),
            label_selector: String::new(),
            stale: false,
        };
        let waiting: Vec<String> = match client.list(req).await {
            Ok(resp) => {
                let nodes = resp
                    .objects_json
                    .iter()
                    .map(|j| parse_object(j))
                    .collect::<Result<Vec<_>>>()?;
                not_ready(&names, &nodes, started_at)
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            }
            Err(e) => {
                tracing::debug!(error = %e, "listing nodes");
                names.clone()
            }
        };
        if waiting.is_empty() {
            return Ok(admin_token);
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = waiting
                .iter()
                .map(|n| dir.join(format!("{n}.log")).display().to_string())
                .collect();
            bail!(
                "not Ready within {}s: {}; see {}",
                START_TIMEOUT.as_secs(),
                waiting.join(", "),
                logs.join(", ")
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_local_lab_cables_the_nodelets_in_a_chain_or_a_ring() {
        let two = tb_api::lab::LabFile::parse("lab.yaml", &local_lab(2)).expect("valid lab");
        assert_eq!(two.macs.len(), 2);
        assert_eq!(two.links.len(), 1, "a chain of two");
        let four = tb_api::lab::LabFile::parse("lab.yaml", &local_lab(4)).expect("valid lab");
        assert_eq!(four.links.len(), 4, "a ring of four");
        let one = tb_api::lab::LabFile::parse("lab.yaml", &local_lab(1)).expect("valid lab");
        assert!(one.links.is_empty());
    }

    #[test]
    fn nodelets_share_the_cores() {
        assert_eq!(engine_threads_share(8, 2), 4);
        assert_eq!(engine_threads_share(2, 2), 1);
        assert_eq!(engine_threads_share(2, 3), 1, "at least one each");
        assert_eq!(engine_threads_share(10, 3), 3);
        assert_eq!(engine_threads_share(4, 0), 4);
    }

    #[test]
    fn nodelet_command_line() {
        let plan = PortPlan::default_for(7400, 2).expect("plan");
        let args = nodelet_args(
            2,
            Path::new("/d"),
            "127.0.0.1:7400",
            40001,
            plan.nodelets[1].ranks,
        );
        assert_eq!(
            args,
            [
                "--controller",
                "127.0.0.1:7400",
                "--name",
                "node-2",
                "--data-dir",
                "/d/nodelet-2",
                "--listen",
                "127.0.0.1:40001",
                "--port-range",
                "32423-32522",
            ]
        );
    }

    #[test]
    fn the_local_context_is_replaced_and_current() {
        let mut file = ConfigFile {
            current_context: Some("lab".into()),
            contexts: vec![
                Context {
                    name: "lab".into(),
                    server: "mac1:7400".into(),
                    namespace: None,
                    token: None,
                    ca_cert: None,
                    insecure: false,
                },
                Context {
                    name: "local".into(),
                    server: "127.0.0.1:7500".into(),
                    namespace: Some("old".into()),
                    token: None,
                    ca_cert: None,
                    insecure: false,
                },
            ],
        };
        point_context(&mut file, "local", "127.0.0.1:7400", None, None);
        assert_eq!(file.current_context.as_deref(), Some("local"));
        assert_eq!(file.contexts.len(), 2);
        let local = file.context("local").expect("local");
        assert_eq!(
            (local.server.as_str(), local.namespace.as_deref()),
            ("127.0.0.1:7400", None)
        );
    }

    #[test]
    fn readiness_of_the_expected_nodes() {
        let node = |name: &str, ready: &str, beat: &str| -> Object {
            serde_json::from_value(json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": name},
                                          "status": {"lastHeartbeatTime": beat,
                                                     "conditions": [{"type": "Ready", "status": ready}]}}))
            .expect("node")
        };
        let since = DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let now = "2025-06-01T12:00:01.250Z";
        let want = vec!["node-1".to_string(), "node-2".to_string()];
        assert_eq!(not_ready(&want, &[], since), ["node-1", "node-2"]);
        assert_eq!(
            not_ready(
                &want,
                &[node("node-1", "True", now), node("node-2", "False", now)],
                since
            ),
            ["node-2"]
        );
        assert!(
            not_ready(
                &want,
                &[
                    node("node-2", "True", now),
                    node("node-1", "True", now),
                    node("other", "False", now)
                ],
                since
            )
            .is_empty()
        );
        // Ready from before the restart does not count.
        let stale = node("node-1", "True", "2025-06-01T11:59:59Z");
        assert_eq!(not_ready(&want[..1], &[stale], since), ["node-1"]);
        assert_eq!(
            not_ready(&want[..1], &[node("node-1", "True", "")], since),
            ["node-1"]
        );
    }
}
