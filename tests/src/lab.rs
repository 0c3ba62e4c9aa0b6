//! A whole tb lab on loopback for the job tests: one `tb-controller` with short timings, a join
//! token made with `tbctl token create`, and N `tb-nodelet`s (`node-1`..`node-N`), each with its
//! own data directory, log port and range of rank ports, all in one test directory.
//!
//! [`Lab`] answers the questions job tests ask (a job's status, its allocations, a Node's
//! readiness, its events) over gRPC or through `tbctl`, waits for them with deadlines, and does
//! to nodelets what goes wrong on real Macs: SIGKILL, SIGSTOP/SIGCONT, restart. [`process_alive`]
//! tells whether a rank's process still exists (a zombie counts as gone: once its nodelet is
//! killed, a rank is reparented to an init that may never reap it).
//!
//! Every process's output goes to a log file. When a test fails, dropping the lab prints the
//! jobs and allocations as tbctl shows them, then the tail of every log; the test directory is
//! kept. Rank processes left behind (a nodelet killed by the test does not stop its ranks) are
//! killed on drop, found through the pid files the nodelets keep and checked against the
//! process's own `TB_ALLOCATION_DIR` so that a recycled pid is never touched.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::Client;
use crate::tbctl::{Tbctl, TbctlOutput};
use crate::workdir::TestDir;

/// A Node without heartbeats this long is NotReady (the controller's `--node-grace-ms`).
pub const NODE_GRACE: Duration = Duration::from_millis(3000);
/// The first gang-restart delay (the controller's `--backoff-base-ms`).
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// The nodelets' `--heartbeat-ms`.
pub const NODELET_HEARTBEAT_MS: u64 = 300;
/// Rank ports per nodelet (its `--port-range` spans this many ports).
pub const RANK_PORTS: u16 = 4;
/// How long a lab may take to start (controller serving, every Node Ready).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of each process's log printed when a test fails.
pub const LOG_TAIL_LINES: usize = 80;

/// How a lab is started.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub nodelets: usize,
    pub node_grace: Duration,
    pub backoff_base: Duration,
    pub heartbeat_ms: u64,
    /// The nodelets' `--reserve`, when set.
    pub reserve: Option<String>,
    /// Start the nodelets in the lab's directory with a relative `--data-dir node-N`.
    pub relative_data_dirs: bool,
    /// A described lab (`--topology`): ports and cables between the nodelets.
    pub topology: Option<PathBuf>,
    /// Run jobs under accounts of their own (the nodelets as root, without `--single-user`,
    /// each with its own `--job-uid-range`), in a test directory other accounts may pass
    /// through. Off by default: the binaries (and a venv) may sit where no job account can
    /// reach them, so labs are single-user unless a test is about isolation.
    pub isolated: bool,
    /// More arguments for every nodelet (e.g. `--run-as NS=ACCOUNT`).
    pub nodelet_args: Vec<String>,
    /// More environment for every nodelet (e.g. a `HOME` of the test's own, where a Model's
    /// `~/...` path points).
    pub nodelet_env: Vec<(String, String)>,
    /// More arguments for the controller (e.g. `--test-clock-offset-file FILE`).
    pub controller_args: Vec<String>,
    /// More environment for the controller (e.g. libfaketime's `LD_PRELOAD`).
    pub controller_env: Vec<(String, String)>,
    /// Nodelet `i`'s data directory, when given (e.g. on a small filesystem of the test's);
    /// default: `node-<i+1>` in the lab's directory.
    pub nodelet_data_dirs: Vec<PathBuf>,
}

impl LabOptions {
    pub fn new(nodelets: usize) -> LabOptions {
        LabOptions {
            nodelets,
            node_grace: NODE_GRACE,
            backoff_base: BACKOFF_BASE,
            heartbeat_ms: NODELET_HEARTBEAT_MS,
            reserve: None,
            relative_data_dirs: false,
            topology: None,
            isolated: false,
            nodelet_args: Vec::new(),
            nodelet_env: Vec::new(),
            controller_args: Vec::new(),
            controller_env: Vec::new(),
            nodelet_data_dirs: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Binaries and paths

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// A file under the workspace's `manifests/`.
pub fn manifest(name: &str) -> PathBuf {
    workspace_root().join("manifests").join(name)
}

/// The `tb-nodelet` binary, built once per test process next to `tb-controller` (same target
/// directory and profile, see [`crate::bins`]); from `TB_TEST_BIN_DIR` when that is set.
pub fn nodelet_bin() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build_nodelet) {
        Ok(p) => p.clone(),
        Err(e) => panic!("tb-nodelet is not available: {e}"),
    }
}

fn build_nodelet() -> Result<PathBuf, String> {
    let file = format!("tb-nodelet{}", std::env::consts::EXE_SUFFIX);
    // Building the controller first fixes the profile directory the harness uses.
    let profile_dir = crate::bins::controller()
        .parent()
        .map(Path::to_path_buf)
        .ok_or("tb-controller has no parent directory")?;
    let path = profile_dir.join(&file);
    if std::env::var_os("TB_TEST_BIN_DIR").is_none() {
        let target_dir = profile_dir
            .parent()
            .ok_or("the profile directory has no parent")?;
        let profile: Vec<String> = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => Vec::new(),
            Some("release") => vec!["--release".into()],
            Some(other) => vec!["--profile".into(), other.into()],
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let started = Instant::now();
        let out = Command::new(&cargo)
            .current_dir(workspace_root())
            .args(["build", "--quiet", "-p", "tb-nodelet"])
            .args(&profile)
            .env("CARGO_TARGET_DIR", target_dir)
            .output()
            .map_err(|e| format!("running cargo: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`cargo build -p tb-nodelet` failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        crate::step!("tb-nodelet built ({:.1}s)", started.elapsed().as_secs_f64());
    }
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}

/// The Python the MLX tests run: `$TB_TEST_PYTHON`, else `<workspace>/.venv/bin/python`.
/// Panics, saying how to make one, unless it can `import mlx.core`: an MLX test that cannot
/// run MLX must fail, not pass.
pub fn mlx_python() -> PathBuf {
    let python = std::env::var_os("TB_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv").join("bin").join("python"));
    let probe = Command::new(&python)
        .args(["-c", "import mlx.core as mx; print(mx.__version__)"])
        .stdin(Stdio::null())
        .output();
    match probe {
        Ok(out) if out.status.success() => {
            crate::step!(
                "MLX {} from {}",
                String::from_utf8_lossy(&out.stdout).trim(),
                python.display()
            );
            python
        }
        other => {
            let why = match other {
                Ok(out) => format!(
                    "it exited {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                        .trim()
                ),
                Err(e) => format!("it cannot be run: {e}"),
            };
            panic!(
                "the MLX tests need a Python that can `import mlx.core`, but {} cannot ({why}).\n\
                 Create the venv with `scripts/test.sh` (it makes {root}/.venv when missing), or by hand:\n    \
                 python3 -m venv {root}/.venv && {root}/.venv/bin/pip install 'mlx[cpu]==0.32.*'\n\
                 or point TB_TEST_PYTHON at a python that has MLX.",
                python.display(),
                root = workspace_root().display()
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Ports

/// `n` consecutive free loopback ports, as (first, last), claimed through [`crate::ports`] so no
/// other test gets them. The allocator hands ports out in order, so runs are found quickly.
pub fn port_block(n: u16) -> (u16, u16) {
    assert!(n >= 1);
    let mut run: Vec<u16> = Vec::new();
    for _ in 0..2000 {
        let p = crate::ports::free_port();
        if run
            .last()
            .is_some_and(|&last| last.checked_add(1) == Some(p))
        {
            run.push(p);
        } else {
            run = vec![p];
        }
        if run.len() == usize::from(n) {
            return (run[0], run[run.len() - 1]);
        }
    }
    panic!("no run of {n} consecutive free ports found");
}

// ---------------------------------------------------------------------------------------------
// Processes

/// Whether process `pid` exists and is not a zombie.
pub fn process_alive(pid: i64) -> bool {
    if pid <= 1 {
        return false;
    }
    let stat = Path::new("/proc").join(pid.to_string()).join("stat");
    if Path::new("/proc/self/stat").exists() {
        match std::fs::read_to_string(&stat) {
            // `pid (comm) S ...`: comm may hold spaces and parentheses, the state follows the
            // last ')'.
            Ok(text) => text
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state != 'Z' && state != 'X'),
            Err(_) => false,
        }
    } else {
        // No procfs (macOS): existence only.
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }
}

/// Wait until process `pid` is gone (or a zombie); panics after `timeout`.
pub async fn wait_process_gone(pid: i64, what: &str, timeout: Duration) {
    crate::wait::expect(
        &format!("{what} (pid {pid}) to be gone"),
        timeout,
        || async move {
            if process_alive(pid) {
                Err(format!("pid {pid} is still alive"))
            } else {
                Ok(())
            }
        },
    )
    .await
}

/// A process started by the lab, its output appended to a log file across restarts.
pub struct Proc {
    name: String,
    bin: PathBuf,
    args: Vec<String>,
    log_path: PathBuf,
    cwd: Option<PathBuf>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    starts: u32,
}

impl Proc {
    /// Start `bin ARGS`, dying with the test process (see [`crate::controller::spawn_child`]).
    pub fn start(name: &str, bin: &Path, args: Vec<String>, log_path: PathBuf) -> Proc {
        Proc::start_in(name, bin, args, log_path, None)
    }

    /// Like [`Proc::start`], in working directory `cwd` (the test's own when `None`).
    pub fn start_in(
        name: &str,
        bin: &Path,
        args: Vec<String>,
        log_path: PathBuf,
        cwd: Option<PathBuf>,
    ) -> Proc {
        Proc::start_with_env(name, bin, args, log_path, cwd, Vec::new())
    }

    /// Like [`Proc::start_in`], with `env` added to the process's environment.
    pub fn start_with_env(
        name: &str,
        bin: &Path,
        args: Vec<String>,
        log_path: PathBuf,
        cwd: Option<PathBuf>,
        env: Vec<(String, String)>,
    ) -> Proc {
        let mut p = Proc {
            name: name.to_string(),
            bin: bin.to_path_buf(),
            args,
            log_path,
            cwd,
            env,
            child: None,
            starts: 0,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        self.starts += 1;
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log_path.display()));
        let _ = writeln!(
            log,
            "===== tb-tests: start #{} of {}: {} {} =====",
            self.starts,
            self.name,
            self.bin.display(),
            self.args.join(" ")
        );
        let stderr = log.try_clone().expect("duplicating the log file handle");
        let mut cmd = Command::new(&self.bin);
        cmd.env(crate::ENGINE_CALIBRATION.0, crate::ENGINE_CALIBRATION.1);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .env("NO_COLOR", "1");
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info,openraft=warn");
        }
        // The nodelet hands TB_* variables to nothing, but the test's own must not steer it.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TB_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = crate::controller::spawn_child(cmd)
            .unwrap_or_else(|e| panic!("starting {} ({}): {e}", self.name, self.bin.display()));
        self.child = Some(child);
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status if the process has exited (reaping it).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Send `signal` to the (unreaped, so not recycled) process.
    pub fn signal(&mut self, signal: libc::c_int) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        // SAFETY: a signal to our own child, not yet reaped, so its pid is still its own.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start again with the same arguments (the process must have been killed).
    pub fn restart(&mut self, args: Option<Vec<String>>) {
        self.kill();
        if let Some(a) = args {
            self.args = a;
        }
        self.spawn();
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kill the rank processes nodelets left under `data_dir` (`allocs/<ns>/<alloc>/pid`), each
/// only if its environment names that allocation's directory, so a recycled pid is left alone.
/// Returns how many were killed.
pub fn kill_leftover_ranks(data_dir: &Path) -> usize {
    let mut killed = 0;
    let Ok(namespaces) = std::fs::read_dir(data_dir.join("allocs")) else {
        return 0;
    };
    for ns in namespaces.flatten() {
        let Ok(allocs) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        for a in allocs.flatten() {
            let Some(pid) = std::fs::read_to_string(a.path().join("pid"))
                .ok()
                .and_then(|t| {
                    t.split_whitespace()
                        .next()
                        .and_then(|p| p.parse::<i32>().ok())
                })
            else {
                continue;
            };
            // The nodelet passes its data directory as given, possibly relative: match the
            // allocation's own part of the path.
            let suffix = format!(
                "/allocs/{}/{}",
                ns.file_name().to_string_lossy(),
                a.file_name().to_string_lossy()
            );
            let ours = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0).any(|kv| {
                    let kv = String::from_utf8_lossy(kv);
                    kv.strip_prefix("TB_ALLOCATION_DIR=")
                        .is_some_and(|dir| dir.ends_with(&suffix) || dir == &suffix[1..])
                })
            });
            if pid > 1 && ours {
                // SAFETY: signals a process group whose leader was just checked to be this
                // allocation's rank.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                killed += 1;
            }
        }
    }
    killed
}

// ---------------------------------------------------------------------------------------------
// The lab

/// Dynamic uids per isolated nodelet (`--job-uid-range`).
pub const JOB_UIDS: u32 = 4;

/// The first uid of the `--job-uid-range` of an isolated nodelet whose rank ports start at
/// `first_port`: rank ports are not shared by nodelets running at once, so neither are these.
pub fn job_uid_base(first_port: u16) -> u32 {
    200_000 + u32::from(first_port) * JOB_UIDS
}

/// One nodelet of a lab.
pub struct Nodelet {
    /// `node-N`.
    pub name: String,
    pub data_dir: PathBuf,
    /// The address its log service listens on (`--listen`).
    pub listen: String,
    /// Its `--port-range`, inclusive.
    pub ports: (u16, u16),
    proc: Proc,
}

impl Nodelet {
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// The directory of an allocation that ran here.
    pub fn alloc_dir(&self, namespace: &str, allocation: &str) -> PathBuf {
        self.data_dir
            .join("allocs")
            .join(namespace)
            .join(allocation)
    }
}

/// The API key rank 0 of InferenceService `service` (namespace default) takes on its own
/// endpoint, as its nodelet wrote it for the rank (`allocs/default/ALLOC/service.key`, 0600 for
/// the rank's account: the tests run as root or as the nodelets' user). Every placement of one
/// service object takes the same key, so any rank 0 allocation's file will do.
pub fn service_key_in(
    data_dirs: &[PathBuf],
    allocations: &[Value],
    service: &str,
) -> Option<String> {
    allocations
        .iter()
        .filter(|a| {
            a["metadata"]["labels"]["tb/job"] == service
                && a["spec"]["job"]["kind"] == "InferenceService"
                && a["spec"]["rank"] == 0
        })
        .filter_map(|a| a["metadata"]["name"].as_str())
        .flat_map(|name| {
            data_dirs.iter().map(move |d| {
                d.join("allocs")
                    .join("default")
                    .join(name)
                    .join("service.key")
            })
        })
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|k| k.trim().to_string())
}

pub struct Lab {
    addr: String,
    /// The controller's services listener (InferenceServices' stable address).
    services_addr: String,
    client: Client,
    tbctl: Tbctl,
    home: PathBuf,
    controller: Proc,
    nodelets: Vec<Nodelet>,
    files: AtomicU32,
    // Last: dropped after the processes, so their logs are printed before the path.
    dir: TestDir,
}

impl Lab {
    /// A controller and `nodelets` nodelets with the default (short) timings, every Node Ready.
    pub async fn start(name: &str, nodelets: usize) -> Lab {
        Lab::start_with(name, LabOptions::new(nodelets)).await
    }

    pub async fn start_with(name: &str, opts: LabOptions) -> Lab {
        let dir = TestDir::new(name);
        if opts.isolated {
            // Job accounts pass through to their work dirs under the nodelets' data dirs.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.path().display()));
        }
        let addr = crate::ports::free_addr();
        let services_addr = crate::ports::free_addr();
        let controller_args = vec![
            "--id".to_string(),
            "1".into(),
            "--listen".into(),
            addr.clone(),
            "--services-listen".into(),
            services_addr.clone(),
            "--data-dir".into(),
            dir.path().join("controller").display().to_string(),
            "--heartbeat-ms".into(),
            "50".into(),
            "--node-grace-ms".into(),
            opts.node_grace.as_millis().to_string(),
            "--backoff-base-ms".into(),
            opts.backoff_base.as_millis().to_string(),
        ];
        let controller_args = [
            controller_args,
            crate::auth::controller_args(),
            opts.controller_args.clone(),
        ]
        .concat();
        let controller = Proc::start_with_env(
            "controller",
            &crate::bins::controller(),
            controller_args,
            dir.path().join("controller.log"),
            None,
            opts.controller_env.clone(),
        );
        let home = dir.sub("home");
        let mut lab = Lab {
            client: Client::new(vec![addr.clone()]),
            tbctl: Tbctl::new(std::slice::from_ref(&addr), &home),
            home,
            addr,
            services_addr,
            controller,
            nodelets: Vec::new(),
            files: AtomicU32::new(0),
            dir,
        };
        lab.wait_for_leader().await;

        let uses = opts.nodelets.max(1).to_string();
        let token = lab
            .tbctl_ok(&["token", "create", "--uses", &uses])
            .await
            .stdout
            .trim()
            .to_string();
        assert!(
            token.starts_with("tbjoin-"),
            "`tbctl token create` printed no token: {token:?}"
        );
        // Given as a file (0600), never on a command line.
        let token_file = lab.dir.write("join.token", &format!("{token}\n"));
        set_private(&token_file);
        let bin = nodelet_bin();
        for i in 1..=opts.nodelets {
            let name = format!("node-{i}");
            let data_dir = opts
                .nodelet_data_dirs
                .get(i - 1)
                .cloned()
                .unwrap_or_else(|| lab.dir.path().join(&name));
            let data_arg = if opts.relative_data_dirs && opts.nodelet_data_dirs.get(i - 1).is_none()
            {
                name.clone()
            } else {
                data_dir.display().to_string()
            };
            let listen = crate::ports::free_addr();
            let ports = port_block(RANK_PORTS);
            let mut args = vec![
                "--controller".to_string(),
                lab.addr.clone(),
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                data_arg,
                "--listen".into(),
                listen.clone(),
                "--join-token-file".into(),
                token_file.display().to_string(),
                "--port-range".into(),
                format!("{}-{}", ports.0, ports.1),
                "--heartbeat-ms".into(),
                opts.heartbeat_ms.to_string(),
            ];
            if let Some(r) = &opts.reserve {
                args.extend(["--reserve".to_string(), r.clone()]);
            }
            // Several nodelets share this host: each lets the OS pick its probe port.
            args.extend(["--probe-port".to_string(), "0".into()]);
            if opts.isolated {
                // tb owns the uids of its range exclusively (and kills what runs under them):
                // nodelets that share this host must not share uids.
                let first = job_uid_base(ports.0);
                args.extend([
                    "--job-uid-range".to_string(),
                    format!("{first}-{}", first + JOB_UIDS - 1),
                ]);
            } else {
                args.push("--single-user".into());
            }
            args.extend(opts.nodelet_args.iter().cloned());
            args.extend(crate::auth::nodelet_args());
            if let Some(t) = &opts.topology {
                args.extend(["--topology".to_string(), t.display().to_string()]);
            }
            let log = lab.dir.path().join(format!("{name}.log"));
            let cwd = opts
                .relative_data_dirs
                .then(|| lab.dir.path().to_path_buf());
            let proc = Proc::start_with_env(&name, &bin, args, log, cwd, opts.nodelet_env.clone());
            lab.nodelets.push(Nodelet {
                name,
                data_dir,
                listen,
                ports,
                proc,
            });
        }
        let names: Vec<String> = lab.nodelets.iter().map(|n| n.name.clone()).collect();
        for n in &names {
            lab.wait_node_ready(n, true, START_TIMEOUT).await;
        }
        crate::step!(
            "lab {name}: controller {} and {} nodelet(s) Ready in {}",
            lab.addr,
            names.len(),
            lab.dir.path().display()
        );
        lab
    }

    async fn wait_for_leader(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(status) = self.controller.exit_status() {
                panic!(
                    "the controller exited ({status}) while starting:\n{}",
                    self.controller.log_tail(LOG_TAIL_LINES)
                );
            }
            match self.client.status_on(&self.addr).await {
                Ok(s) if s.has_leader => return,
                Ok(_) => last = "no leader yet".into(),
                Err(e) => last = format!("{}: {}", e.code(), e.message()),
            }
            tokio::time::sleep(crate::wait::POLL).await;
        }
        panic!(
            "the controller at {} has no leader after {START_TIMEOUT:?} ({last})",
            self.addr
        );
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where the controller serves InferenceServices (`--services-listen`), `IP:PORT`.
    pub fn services_addr(&self) -> &str {
        &self.services_addr
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn nodelet(&self, i: usize) -> &Nodelet {
        &self.nodelets[i]
    }

    pub fn nodelets(&self) -> &[Nodelet] {
        &self.nodelets
    }

    /// The index of nodelet `name`.
    pub fn index_of(&self, name: &str) -> usize {
        self.nodelets
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no nodelet named {name}"))
    }

    // --- tbctl -----------------------------------------------------------------------------

    /// `tbctl --server ADDR ARGS...`.
    pub async fn tbctl(&self, args: &[&str]) -> TbctlOutput {
        self.tbctl.run(args).await
    }

    /// Like [`Lab::tbctl`], panicking unless it exits 0.
    pub async fn tbctl_ok(&self, args: &[&str]) -> TbctlOutput {
        let out = self.tbctl.run(args).await;
        assert!(out.success(), "expected success from {out}");
        out
    }

    /// A `tbctl --server ADDR ARGS...` command to spawn (for output that streams), with the same
    /// private environment as [`Lab::tbctl`]; killed when dropped.
    pub fn tbctl_command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(crate::bins::tbctl());
        cmd.env(crate::ENGINE_CALIBRATION.0, crate::ENGINE_CALIBRATION.1);
        cmd.arg("--server")
            .arg(&self.addr)
            .args(args)
            .current_dir(&self.home)
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
        cmd.env("TB_TOKEN", crate::auth::admin_token());
        cmd.env("TB_CA_CERT", crate::auth::ca_cert());
        cmd
    }

    /// `tbctl apply -f` a YAML document (written to a file in the test directory).
    pub async fn apply_yaml(&self, yaml: &str) -> TbctlOutput {
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.write(&format!("manifest-{n}.yaml"), yaml);
        let path = path.display().to_string();
        self.tbctl_ok(&["apply", "-f", &path]).await
    }

    // --- reading the store -----------------------------------------------------------------

    /// Every object of `kind` in `namespace` (`""`: cluster-scoped), from a linearizable list.
    pub async fn list(&self, kind: &str, namespace: &str) -> Result<Vec<Value>, String> {
        self.client
            .list_values(kind, namespace, Duration::from_secs(5))
            .await
    }

    /// A TrainingJob in `default`.
    pub async fn try_job(&self, name: &str) -> Result<Value, String> {
        let json = self
            .client
            .get_on(&self.addr, "TrainingJob", "default", name, false)
            .await
            .map_err(|e| format!("get tj/{name}: {}: {}", e.code(), e.message()))?;
        serde_json::from_str(&json).map_err(|e| format!("invalid JSON ({e}): {json}"))
    }

    /// A TrainingJob's `status` (panics if it cannot be read).
    pub async fn job_status(&self, name: &str) -> Value {
        match self.try_job(name).await {
            Ok(job) => job["status"].clone(),
            Err(e) => panic!("{e}"),
        }
    }

    /// Wait until `check` accepts the job's status; returns that status. Panics after
    /// `timeout`, or at once when the job ends in a phase `check` does not accept.
    pub async fn wait_job(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let check = &check;
        crate::wait::expect(&format!("tj/{name}: {what}"), timeout, || async move {
            let status = self.try_job(name).await?["status"].clone();
            if check(&status) {
                return Ok(status);
            }
            let phase = status["phase"].as_str().unwrap_or("");
            if matches!(phase, "Succeeded" | "Failed") {
                panic!("tj/{name} ended {phase} while waiting for {what}; status: {status:#}");
            }
            Err(format!("status: {status}"))
        })
        .await
    }

    /// Wait until the job's phase is `phase`; returns its status.
    pub async fn wait_job_phase(&self, name: &str, phase: &str, timeout: Duration) -> Value {
        self.wait_job(name, &format!("phase {phase}"), timeout, |s| {
            s["phase"] == phase
        })
        .await
    }

    /// The job's Allocations (every epoch), by epoch then rank.
    pub async fn allocations(&self, job: &str) -> Vec<Value> {
        let mut allocs: Vec<Value> = match self.list("Allocation", "default").await {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        };
        allocs.retain(|a| a["metadata"]["labels"]["tb/job"] == job);
        allocs.sort_by_key(|a| {
            (
                a["spec"]["epoch"].as_u64().unwrap_or(0),
                a["spec"]["rank"].as_u64().unwrap_or(0),
            )
        });
        allocs
    }

    /// The API key of InferenceService `service`'s rank 0 endpoint ([`service_key_in`]).
    pub async fn service_key(&self, service: &str) -> String {
        let allocations = self.allocations(service).await;
        let dirs: Vec<PathBuf> = self.nodelets().iter().map(|n| n.data_dir.clone()).collect();
        service_key_in(&dirs, &allocations, service)
            .unwrap_or_else(|| panic!("no service.key of isvc/{service}'s rank 0 in {dirs:?}"))
    }

    /// Every Node.
    pub async fn nodes(&self) -> Vec<Value> {
        match self.list("Node", "").await {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// Node `name`, if it exists.
    pub async fn node(&self, name: &str) -> Option<Value> {
        self.nodes()
            .await
            .into_iter()
            .find(|n| n["metadata"]["name"] == name)
    }

    /// Wait until Node `name`'s Ready condition is `ready`; returns the Node.
    pub async fn wait_node_ready(&self, name: &str, ready: bool, timeout: Duration) -> Value {
        let want = if ready { "True" } else { "False" };
        crate::wait::expect(
            &format!("node {name} Ready={want}"),
            timeout,
            || async move {
                let nodes = self.list("Node", "").await?;
                let node = nodes
                    .into_iter()
                    .find(|n| n["metadata"]["name"] == name)
                    .ok_or_else(|| format!("no Node {name} yet"))?;
                if condition(&node["status"], "Ready") == Some(want) {
                    Ok(node)
                } else {
                    Err(format!(
                        "Ready is {:?}",
                        condition(&node["status"], "Ready")
                    ))
                }
            },
        )
        .await
    }

    /// The job's events (`tbctl events --for tj/NAME -o json`), oldest first.
    pub async fn events(&self, job: &str) -> Vec<Value> {
        let target = format!("tj/{job}");
        let out = self
            .tbctl_ok(&["events", "--for", &target, "-o", "json"])
            .await;
        out.json()["items"].as_array().cloned().unwrap_or_default()
    }

    /// The reasons of the job's events, oldest first.
    pub async fn event_reasons(&self, job: &str) -> Vec<String> {
        self.events(job)
            .await
            .iter()
            .map(|e| e["spec"]["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }

    // --- doing things to nodelets --------------------------------------------------------

    /// SIGKILL nodelet `i` (its ranks keep running: they are in sessions of their own).
    pub fn kill_nodelet(&mut self, i: usize) {
        crate::step!("SIGKILL {}", self.nodelets[i].name);
        self.nodelets[i].proc.kill();
    }

    /// SIGSTOP nodelet `i`: it stops heartbeating and supervising, as a hung Mac would.
    pub fn stop_nodelet(&mut self, i: usize) {
        crate::step!("SIGSTOP {}", self.nodelets[i].name);
        self.nodelets[i].proc.signal(libc::SIGSTOP);
    }

    /// SIGCONT nodelet `i`.
    pub fn cont_nodelet(&mut self, i: usize) {
        crate::step!("SIGCONT {}", self.nodelets[i].name);
        self.nodelets[i].proc.signal(libc::SIGCONT);
    }

    /// Start nodelet `i` again (killing it first if it runs) on the same data directory,
    /// address and ports, without a join token: it must reuse its credential.
    pub fn restart_nodelet(&mut self, i: usize) {
        crate::step!("restarting {}", self.nodelets[i].name);
        let n = &mut self.nodelets[i];
        let mut args = n.proc.args.clone();
        if let Some(pos) = args.iter().position(|a| a == "--join-token-file") {
            args.drain(pos..pos + 2);
        }
        n.proc.restart(Some(args));
    }

    /// Start nodelet `i` again (killing it first if it runs) with some flags set: each
    /// `(FLAG, VALUE)` replaces the value FLAG has among its arguments, or is added.
    pub fn restart_nodelet_with(&mut self, i: usize, flags: &[(&str, &str)]) {
        crate::step!("restarting {} with {flags:?}", self.nodelets[i].name);
        let n = &mut self.nodelets[i];
        let mut args = n.proc.args.clone();
        for (flag, value) in flags {
            match args.iter().position(|a| a == flag) {
                Some(pos) if pos + 1 < args.len() => args[pos + 1] = value.to_string(),
                _ => args.extend([flag.to_string(), value.to_string()]),
            }
        }
        n.proc.restart(Some(args));
    }

    /// Whether nodelet `i`'s process has exited (with its status).
    pub fn nodelet_exit_status(&mut self, i: usize) -> Option<ExitStatus> {
        self.nodelets[i].proc.exit_status()
    }

    /// Nodelet `i`'s log so far.
    pub fn nodelet_log(&self, i: usize) -> String {
        self.nodelets[i].proc.log()
    }

    /// Run a blocking tbctl for the failure report; bounded, output or why not.
    fn report_tbctl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(crate::bins::tbctl());
        cmd.env(crate::ENGINE_CALIBRATION.0, crate::ENGINE_CALIBRATION.1);
        cmd.arg("--server")
            .arg(&self.addr)
            .args(["--timeout", "3s"])
            .args(args)
            .env("TB_TOKEN", crate::auth::admin_token())
            .env("TB_CA_CERT", crate::auth::ca_cert())
            .env("HOME", &self.home)
            .env("NO_COLOR", "1");
        bounded_output(cmd, Duration::from_secs(5))
    }
}

/// Make `path` readable by its owner only.
pub fn set_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod 600 {}: {e}", path.display()));
}

/// Stdout and stderr of `cmd`, killed after `timeout`.
pub fn bounded_output(mut cmd: Command, timeout: Duration) -> String {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let Ok(mut child) = cmd.spawn() else {
        return "(could not be started)\n".into();
    };
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return match child.wait_with_output() {
                Ok(o) => format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => format!("({e})\n"),
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    format!("(no answer within {timeout:?})\n")
}

impl Drop for Lab {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            eprintln!(
                "----- lab state at failure -----\n$ tbctl get tj -o wide\n{}\n$ tbctl get allocs -o wide\n{}\n$ tbctl get nodes\n{}",
                self.report_tbctl(&["get", "tj", "-o", "wide"]),
                self.report_tbctl(&["get", "allocs", "-o", "wide"]),
                self.report_tbctl(&["get", "nodes"]),
            );
        }
        for n in &mut self.nodelets {
            n.proc.kill();
        }
        for n in &self.nodelets {
            kill_leftover_ranks(&n.data_dir);
        }
        self.controller.kill();
        if failed {
            for p in std::iter::once(&self.controller).chain(self.nodelets.iter().map(|n| &n.proc))
            {
                eprintln!(
                    "----- {} log {} (last {LOG_TAIL_LINES} lines) -----\n{}",
                    p.name(),
                    p.log_path().display(),
                    p.log_tail(LOG_TAIL_LINES)
                );
            }
        }
    }
}

/// The status of condition `type_` in an object's `status.conditions`.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a str> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .get("status")?
        .as_str()
}

/// The lines of `tbctl logs` output for rank `rank` (those prefixed `[rank N] `, unprefixed).
pub fn rank_lines(output: &str, rank: u64) -> Vec<String> {
    let prefix = format!("[rank {rank}] ");
    output
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

/// Milliseconds since the Unix epoch of an RFC 3339 UTC stamp as tb writes them
/// (`2026-01-02T03:04:05.678Z`); `None` for anything else.
pub fn stamp_millis(stamp: &str) -> Option<i64> {
    let s = stamp.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + millis)
}

/// The live processes (not zombies) whose environment says they are the rank of the allocation
/// in `alloc_dir` (`TB_ALLOCATION_DIR`). Linux only: empty where there is no procfs.
pub fn processes_of(alloc_dir: &Path) -> Vec<i64> {
    let marker = format!("TB_ALLOCATION_DIR={}", alloc_dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()))
        })
        .filter(|pid| process_alive(*pid))
        .collect()
}

/// Everything `tbctl get KIND -w -o json` reports, collected in the background from the moment
/// it starts until it is dropped (which kills the tbctl process).
pub struct Watch {
    what: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Lab {
    /// Start watching `kind` (`allocs`, `nodes` or `tj`). When there is anything to list, returns
    /// only once the initial listing has begun to arrive, so every change after the call is
    /// seen; with nothing to list there is no such signal, so start the watch after the objects
    /// of interest exist.
    pub async fn watch(&self, kind: &str) -> Watch {
        use tokio::io::AsyncBufReadExt;
        let mut child = self
            .tbctl_command(&["get", kind, "-w", "-o", "json"])
            .spawn()
            .unwrap_or_else(|e| panic!("starting tbctl get -w: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            // Owning the child here: aborting the task drops it, which kills tbctl.
            let _child = child;
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            }
        });
        let watch = Watch {
            what: format!("tbctl get {kind} -w"),
            seen,
            task,
        };
        // An empty listing prints nothing: wait for the first event only when there is
        // something to list.
        let existing = self
            .list(kind_name(kind), namespace_of(kind))
            .await
            .map(|v| v.len())
            .unwrap_or(0);
        if existing > 0 {
            watch
                .wait_for("the initial listing", Duration::from_secs(10), |_| true)
                .await;
        }
        watch
    }
}

/// The stored kind of a tbctl kind alias the lab watches.
fn kind_name(kind: &str) -> &str {
    match kind {
        "allocs" | "alloc" | "allocation" | "allocations" => "Allocation",
        "nodes" | "node" => "Node",
        "tj" | "trainingjob" | "trainingjobs" => "TrainingJob",
        other => other,
    }
}

fn namespace_of(kind: &str) -> &'static str {
    if kind_name(kind) == "Node" {
        ""
    } else {
        "default"
    }
}

impl Watch {
    /// The objects reported so far (each event's `object`), oldest first.
    pub fn objects(&self) -> Vec<Value> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|ev| ev.get("object").cloned().unwrap_or_else(|| ev.clone()))
            .collect()
    }

    /// Wait until an object reported by the watch satisfies `check`; returns it.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let check = &check;
        crate::wait::expect(
            &format!("{} to report {what}", self.what),
            timeout,
            || async move {
                let objects = self.objects();
                objects
                    .iter()
                    .find(|o| check(o))
                    .cloned()
                    .ok_or_else(|| format!("{} events so far", objects.len()))
            },
        )
        .await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
