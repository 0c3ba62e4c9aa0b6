//! One `tb-controller` process: start it, stop it with SIGKILL or SIGTERM, start it again on the
//! same data directory and port, and read its log.
//!
//! Each controller's stderr and stdout go to a log file that every start appends to (with a
//! separator line), so a test that restarts a member keeps the whole story. When a test fails,
//! dropping the handle prints the tail of the log: the first thing to read when debugging.
//!
//! Children are spawned from one long-lived thread and, on Linux, asked to die with the test
//! process (`PR_SET_PDEATHSIG`), so a test binary killed mid-run leaves no controller behind.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tb_api::proto::ClusterStatusRequest;

/// Lines of log printed for each controller when a test fails.
pub const LOG_TAIL_LINES: usize = 60;

/// How a controller is started. Everything a restart needs is here.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub id: u64,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    /// `1=HOST:PORT,2=HOST:PORT,...`; `None` with `join == false`: a cluster of one.
    pub initial_cluster: Option<String>,
    /// Start empty and wait for `Cluster.AddMember`.
    pub join: bool,
    /// Pass the harness's admin token, cluster secret and CA ([`crate::auth::controller_args`]);
    /// off for a controller that gets its credentials another way (`--join URL` with a token).
    pub harness_credentials: bool,
    pub heartbeat_ms: u64,
    pub snapshot_every: Option<u64>,
    pub keep_after_snapshot: Option<u64>,
    /// More flags, appended after the harness's own (e.g. `--test-clock-offset-file FILE`).
    pub extra_args: Vec<String>,
}

impl ControllerConfig {
    /// A lone controller (a cluster of one) in `dir`, with small Raft timings.
    pub fn single(dir: &Path, id: u64) -> ControllerConfig {
        ControllerConfig {
            id,
            addr: crate::ports::free_addr(),
            data_dir: dir.join(format!("c{id}")),
            log_path: dir.join(format!("c{id}.log")),
            initial_cluster: None,
            join: false,
            harness_credentials: true,
            heartbeat_ms: 50,
            snapshot_every: None,
            keep_after_snapshot: None,
            extra_args: Vec::new(),
        }
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--id".to_string(),
            self.id.to_string(),
            "--listen".into(),
            self.addr.clone(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--heartbeat-ms".into(),
            self.heartbeat_ms.to_string(),
        ];
        if self.harness_credentials {
            args.extend(crate::auth::controller_args());
        }
        if let Some(members) = &self.initial_cluster {
            args.extend(["--initial-cluster".into(), members.clone()]);
        }
        if self.join {
            args.push("--join".into());
        }
        if let Some(n) = self.snapshot_every {
            args.extend(["--snapshot-every".into(), n.to_string()]);
        }
        if let Some(n) = self.keep_after_snapshot {
            args.extend(["--keep-after-snapshot".into(), n.to_string()]);
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// A controller process (running or stopped) and its configuration.
pub struct Controller {
    config: ControllerConfig,
    child: Option<Child>,
    starts: u32,
}

impl Controller {
    /// Start a controller. It may not be serving yet: see [`Controller::wait_serving`].
    pub fn start(config: ControllerConfig) -> Controller {
        let mut c = Controller {
            config,
            child: None,
            starts: 0,
        };
        c.spawn();
        c
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// Change how the next start starts it (e.g. a flag for one restart).
    pub fn config_mut(&mut self) -> &mut ControllerConfig {
        &mut self.config
    }

    pub fn id(&self) -> u64 {
        self.config.id
    }

    pub fn addr(&self) -> &str {
        &self.config.addr
    }

    pub fn log_path(&self) -> &Path {
        &self.config.log_path
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            None => false,
            Some(child) => matches!(child.try_wait(), Ok(None)),
        }
    }

    /// The exit status, if the process has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn spawn(&mut self) {
        assert!(
            self.child.is_none(),
            "controller {} is already running",
            self.config.id
        );
        self.starts += 1;
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(&self.config.log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.config.log_path.display()));
        let _ = writeln!(
            log,
            "===== tb-tests: start #{} of controller {}: {} =====",
            self.starts,
            self.config.id,
            self.config.args().join(" ")
        );
        let stderr = log.try_clone().expect("duplicating the log file handle");
        let mut cmd = Command::new(crate::bins::controller());
        cmd.args(self.config.args())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        // Plain text logs: they are read in files, not terminals.
        cmd.env("NO_COLOR", "1");
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info,openraft=warn");
        }
        let child = spawn_child(cmd).unwrap_or_else(|e| panic!("starting tb-controller: {e}"));
        self.child = Some(child);
    }

    /// SIGKILL (no chance to clean up) and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait up to `timeout` for the process to exit. Returns its exit status, or
    /// `None` if it had to be killed after the timeout.
    ///
    /// Async on purpose: a graceful stop needs this process's clients to answer the server's
    /// GOAWAY, and their connection tasks run on the test's runtime, which must not be blocked.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pid = child.id() as libc::pid_t;
        // SAFETY: sending a signal to our own child, which has not been reaped (so the pid
        // cannot have been reused).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Start again with the same id, address and data directory. Must be stopped.
    pub fn restart(&mut self) {
        if self.is_running() {
            panic!("restart: controller {} is still running", self.config.id);
        }
        self.child = None;
        self.spawn();
    }

    /// Wait until the controller answers `Cluster.Status`; panics (showing the log) if it exits
    /// first or does not answer within `timeout`.
    pub async fn wait_serving(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let client = crate::client::Client::new(vec![self.config.addr.clone()]);
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                panic!(
                    "controller {} exited ({status}) while starting; log tail:\n{}",
                    self.config.id,
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            let mut cluster = client.cluster(&self.config.addr);
            let mut req = tonic::Request::new(ClusterStatusRequest {});
            req.set_timeout(Duration::from_secs(2));
            match tokio::time::timeout(Duration::from_secs(3), cluster.status(req)).await {
                Ok(Ok(_)) => return,
                // Serving, and insisting on credentials.
                Ok(Err(e)) if e.code() == tonic::Code::Unauthenticated => return,
                Ok(Err(e)) => last = format!("{}: {}", e.code(), e.message()),
                Err(_) => last = "no answer within 3s".into(),
            }
            tokio::time::sleep(crate::wait::POLL).await;
        }
        panic!(
            "controller {} at {} not serving after {timeout:?} (last: {last}); log tail:\n{}",
            self.config.id,
            self.config.addr,
            self.log_tail(LOG_TAIL_LINES)
        );
    }

    /// The log file's contents (every start so far).
    pub fn log(&self) -> String {
        std::fs::read(&self.config.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "----- controller {} ({}), log {} (last {LOG_TAIL_LINES} lines) -----\n{}\n-----",
                self.config.id,
                self.config.addr,
                self.config.log_path.display(),
                self.log_tail(LOG_TAIL_LINES)
            );
        }
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawn `cmd` from the harness's spawner thread, which lives as long as the test process: on
/// Linux the parent-death signal fires when the *thread* that spawned a child exits, and a
/// tokio worker or test thread may exit before the child should.
pub fn spawn_child(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("tb-tests-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    die_with_parent(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}
