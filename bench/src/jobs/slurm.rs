//! Slurm for `jobs-bench`, where it is installed (Debian's `slurm-wlm` and `munge`): a private
//! munged (its own key and socket), slurmctld and slurmd (one node, `localhost`) in the
//! foreground as children of the bench, configured by a `slurm.conf` of their own in the
//! temporary dir. One run: `sbatch` the equivalent job, poll `squeue` until it says RUNNING,
//! `scancel` it, poll until it is gone.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{JobShape, RunTimes};
use crate::member::Member;
use crate::procstat::Watched;

/// The programs needed, found on the `PATH` (or in the sbin dirs).
#[derive(Debug, Clone)]
pub struct SlurmPrograms {
    pub slurmctld: PathBuf,
    pub slurmd: PathBuf,
    pub sbatch: PathBuf,
    pub squeue: PathBuf,
    pub scancel: PathBuf,
    pub sinfo: PathBuf,
    pub munged: PathBuf,
}

impl SlurmPrograms {
    /// Every program, or a sentence saying what is missing and how to get it.
    pub fn find() -> Result<Self, String> {
        let find = |name: &str| crate::binaries::find_program(name).ok_or(name.to_string());
        let found = (|| {
            Ok::<_, String>(SlurmPrograms {
                slurmctld: find("slurmctld")?,
                slurmd: find("slurmd")?,
                sbatch: find("sbatch")?,
                squeue: find("squeue")?,
                scancel: find("scancel")?,
                sinfo: find("sinfo")?,
                munged: find("munged")?,
            })
        })();
        found.map_err(|missing| {
            format!(
                "`{missing}` not found (install Debian's packages: `apt-get install -y slurm-wlm munge`)"
            )
        })
    }

    /// `slurmctld -V` (e.g. `slurm-wlm 22.05.8`).
    pub fn version(&self) -> String {
        std::process::Command::new(&self.slurmctld)
            .arg("-V")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| "unknown version".into())
    }
}

/// How to configure Slurm beyond the fixed settings.
#[derive(Debug, Clone, Default)]
pub struct SlurmOptions {
    /// `SchedulerParameters=` (Slurm's defaults when `None`).
    pub scheduler_parameters: Option<String>,
    /// Time between the end of one `squeue` poll and the start of the next.
    pub poll_every: Duration,
}

/// `Some(why not)` when this process cannot run Slurm's daemons as configured here
/// (`SlurmUser=root`).
pub fn cannot_run() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))?;
    (euid != "0")
        .then(|| format!("the daemons run as root here, and this bench runs as uid {euid}"))
}

/// The daemons and the files they use.
pub struct SlurmCluster {
    /// munged, slurmctld, slurmd, in start order.
    pub members: Vec<Member>,
    programs: SlurmPrograms,
    conf: PathBuf,
    socket: PathBuf,
    /// Where the batch scripts run and write their start time.
    jobs_dir: PathBuf,
    opts: SlurmOptions,
    /// Deviations from the brief's slurm.conf, for the report.
    pub notes: Vec<String>,
}

/// `slurm.conf` for one node with `cpus` CPUs and `memory_mb` MB on loopback.
#[allow(clippy::too_many_arguments)]
pub fn slurm_conf(
    dir: &Path,
    socket: &Path,
    ctld_port: u16,
    slurmd_port: u16,
    cpus: usize,
    real_cpus: usize,
    memory_mb: u64,
    scheduler_parameters: Option<&str>,
) -> String {
    let d = dir.display();
    let mut conf = format!(
        "# Written by tb's jobs-bench for one run; deleted afterwards.
ClusterName=tbbench
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
",
        socket = socket.display()
    );
    if cpus > real_cpus {
        conf.push_str("SlurmdParameters=config_overrides\n");
    }
    if let Some(p) = scheduler_parameters {
        let _ = writeln!(conf, "SchedulerParameters={p}");
    }
    let _ = writeln!(
        conf,
        "NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
    );
    conf.push_str("PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n");
    conf
}

fn mkdir(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// A fresh 1024-byte munge key, readable by its owner only.
fn write_munge_key(path: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut key = vec![0u8; 1024];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("reading /dev/urandom for the munge key")?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(&key))
        .with_context(|| format!("writing {}", path.display()))
}

/// `'arg'` for `sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Job states after which a job holds nothing any more.
const ENDED: &[&str] = &[
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
];

impl SlurmCluster {
    /// Write the munge key and `slurm.conf` under `dir` (which must be searchable by everyone:
    /// munged refuses a socket whose directories are not) and start munged.
    pub fn start(
        programs: &SlurmPrograms,
        opts: &SlurmOptions,
        dir: &Path,
        ranks: u32,
    ) -> anyhow::Result<Self> {
        mkdir(dir, 0o755)?;
        let key_dir = dir.join("munge-key");
        let run_dir = dir.join("munge-run");
        let jobs_dir = dir.join("jobs");
        mkdir(&key_dir, 0o700)?;
        mkdir(&run_dir, 0o755)?;
        mkdir(&jobs_dir, 0o755)?;
        mkdir(&dir.join("state"), 0o755)?;
        mkdir(&dir.join("spool"), 0o755)?;
        let key = key_dir.join("munge.key");
        write_munge_key(&key)?;
        let socket = run_dir.join("munge.socket");

        let ports = crate::ports::free_ports(2)?;
        let real_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus = real_cpus.max(ranks as usize);
        let memory_mb = crate::machine::mem_total_bytes()
            .map_or(1024, |b| b / (1 << 20) * 9 / 10)
            .max(1);
        let mut notes = Vec::new();
        if cpus > real_cpus {
            notes.push(format!(
                "the node is declared with CPUs={cpus} (this machine has {real_cpus}) and \
                 `SlurmdParameters=config_overrides`, so that {ranks} tasks of one CPU each fit; \
                 the tasks only sleep"
            ));
        }
        notes.push(format!(
            "RealMemory={memory_mb} (90 % of MemTotal); SchedulerParameters: {}",
            opts.scheduler_parameters
                .as_deref()
                .map_or("Slurm's defaults".to_string(), |p| format!("`{p}`"))
        ));
        let conf = dir.join("slurm.conf");
        let text = slurm_conf(
            dir,
            &socket,
            ports[0],
            ports[1],
            cpus,
            real_cpus,
            memory_mb,
            opts.scheduler_parameters.as_deref(),
        );
        std::fs::write(&conf, text).with_context(|| format!("writing {}", conf.display()))?;

        let member = |name: &str, program: &Path, args: Vec<String>| {
            Member::new(name, program, args, dir.join(format!("{name}.log")))
                .env("SLURM_CONF", &conf.display().to_string())
                .current_dir(dir.to_path_buf())
        };
        let mut munged = member(
            "munged",
            &programs.munged,
            vec![
                "--foreground".into(),
                format!("--socket={}", socket.display()),
                format!("--key-file={}", key.display()),
                format!("--pid-file={}", run_dir.join("munged.pid").display()),
                format!("--seed-file={}", key_dir.join("munged.seed").display()),
            ],
        );
        let conf_arg = conf.display().to_string();
        let slurmctld = member(
            "slurmctld",
            &programs.slurmctld,
            vec!["-D".into(), "-f".into(), conf_arg.clone()],
        );
        let slurmd = member(
            "slurmd",
            &programs.slurmd,
            vec![
                "-D".into(),
                "-N".into(),
                "localhost".into(),
                "-f".into(),
                conf_arg,
            ],
        );
        munged.spawn()?;
        Ok(SlurmCluster {
            members: vec![munged, slurmctld, slurmd],
            programs: programs.clone(),
            conf,
            socket,
            jobs_dir,
            opts: opts.clone(),
            notes,
        })
    }

    /// Fail with the log's tail if a started daemon has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if let Some(why) = m.exited() {
                anyhow::bail!("{why}\n--- last log lines ---\n{}", m.log_tail(20));
            }
        }
        Ok(())
    }

    /// Wait for munged's socket, start slurmctld and slurmd, and wait until the node is idle.
    pub async fn ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.socket.exists() {
            self.check_alive()?;
            anyhow::ensure!(
                Instant::now() < deadline,
                "munged made no socket at {} within {timeout:?}",
                self.socket.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.members[1].spawn()?;
        self.members[2].spawn()?;
        loop {
            self.check_alive()?;
            let last = match self
                .command(&self.programs.sinfo.clone(), &["-h", "-N", "-o", "%t"])
                .await
            {
                Ok(out) if out.trim() == "idle" => return Ok(()),
                Ok(out) => format!("node state {:?}", out.trim()),
                Err(e) => format!("{e:#}"),
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "the Slurm node is not idle within {timeout:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Run a Slurm client with `SLURM_CONF` set; its stdout, or an error with its stderr.
    async fn command(&self, program: &Path, args: &[&str]) -> anyhow::Result<String> {
        let name = program.file_name().map_or_else(
            || program.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let run = tokio::process::Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .current_dir(&self.jobs_dir)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .with_context(|| format!("{name} did not finish within 30 s"))?
            .with_context(|| format!("running {name}"))?;
        if !out.status.success() {
            anyhow::bail!(
                "{name} {}: {} ({})",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim(),
                out.status
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The job's state as `squeue` shows it; `None` once Slurm no longer lists it (or lists it
    /// as ended).
    async fn state(&self, id: &str) -> anyhow::Result<Option<String>> {
        let squeue = self.programs.squeue.clone();
        match self.command(&squeue, &["-h", "-j", id, "-o", "%T"]).await {
            Ok(out) => {
                let state = out.trim().to_string();
                Ok((!state.is_empty() && !ENDED.contains(&state.as_str())).then_some(state))
            }
            // A job purged from slurmctld's memory is an invalid id to squeue.
            Err(e) if format!("{e:#}").contains("Invalid job id") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One run of a job named `name`: `sbatch`, poll until RUNNING (within `timeout`), read
    /// the script's own start time, `scancel`, poll until gone.
    pub async fn run_job(
        &mut self,
        name: &str,
        shape: &JobShape,
        timeout: Duration,
    ) -> anyhow::Result<RunTimes> {
        let stamp = self.jobs_dir.join(format!("started-{name}"));
        let command: Vec<String> = shape.command.iter().map(|a| shell_quote(a)).collect();
        let wrap = format!(
            "date +%s%N > {}; exec {}",
            shell_quote(&stamp.display().to_string()),
            command.join(" ")
        );
        let args = [
            "--parsable".to_string(),
            format!("--job-name={name}"),
            format!("--ntasks={}", shape.ranks),
            format!("--mem-per-cpu={}M", shape.memory_mib),
            "--output=/dev/null".into(),
            format!("--chdir={}", self.jobs_dir.display()),
            "--wrap".into(),
            wrap,
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sbatch = self.programs.sbatch.clone();
        let wall0 = std::time::SystemTime::now();
        let t0 = Instant::now();
        let out = self.command(&sbatch, &args).await?;
        let submit = t0.elapsed();
        // `--parsable` prints `ID` or `ID;cluster`.
        let id = out
            .trim()
            .split(';')
            .next()
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .with_context(|| format!("sbatch printed no job id: {out:?}"))?
            .to_string();

        let poll_start = Instant::now();
        let mut polls = 0u32;
        let running = loop {
            let state = self.state(&id).await?;
            polls += 1;
            match state.as_deref() {
                Some("RUNNING") => break t0.elapsed(),
                Some(_) => {}
                None => anyhow::bail!("job {id} ended before it was seen RUNNING"),
            }
            anyhow::ensure!(
                t0.elapsed() < timeout,
                "job {id} not RUNNING within {timeout:?}"
            );
            tokio::time::sleep(self.opts.poll_every).await;
        };
        let poll_time = poll_start.elapsed();

        // The script writes its start time (ns since the epoch) as its first command; it may
        // lag the RUNNING state, which slurmctld sets when it allocates.
        let started = loop {
            if let Some(ns) = std::fs::read_to_string(&stamp)
                .ok()
                .and_then(|s| s.trim().parse::<u128>().ok())
            {
                let t0_ns = wall0
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                let after = u64::try_from(ns.saturating_sub(t0_ns)).unwrap_or(u64::MAX);
                break Some(Duration::from_nanos(after));
            }
            if t0.elapsed() >= timeout {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };

        let td = Instant::now();
        let scancel = self.programs.scancel.clone();
        self.command(&scancel, &[&id]).await?;
        let deadline = Instant::now() + timeout;
        while self.state(&id).await?.is_some() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "job {id} still listed {timeout:?} after scancel"
            );
            tokio::time::sleep(self.opts.poll_every).await;
        }
        Ok(RunTimes {
            submit,
            placed: None,
            running,
            started,
            teardown: td.elapsed(),
            polls: Some((polls, poll_time)),
        })
    }

    /// Cancel every job this private slurmctld knows and wait until none is listed.
    pub async fn cancel_all(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let squeue = self.programs.squeue.clone();
        let scancel = self.programs.scancel.clone();
        loop {
            let out = self.command(&squeue, &["-h", "-o", "%i"]).await?;
            let ids: Vec<&str> = out.split_whitespace().collect();
            if ids.is_empty() {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "jobs still listed after {timeout:?}: {}",
                ids.join(", ")
            );
            let _ = self.command(&scancel, &ids).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Which of slurmctld's schedulers started the jobs, from its log: the main scheduler's
    /// pass (`sched: Allocate`) or the backfill scheduler (`sched/backfill: _start_job`).
    pub fn scheduler_note(&self) -> Option<String> {
        let log = std::fs::read_to_string(self.members.get(1)?.log_path()).ok()?;
        let main = log.matches("sched: Allocate JobId=").count();
        let backfill = log
            .matches("sched/backfill: _start_job: Started JobId=")
            .count();
        Some(format!(
            "slurmctld's log: {main} jobs started by the main scheduler's pass (`sched: Allocate`), \
             {backfill} by the backfill scheduler (`sched/backfill: _start_job`)"
        ))
    }

    /// The daemons to sample while idle.
    pub fn watched(&self) -> anyhow::Result<Vec<Watched>> {
        self.members
            .iter()
            .map(|m| {
                let role = match m.name.as_str() {
                    "slurmd" => "agent",
                    "slurmctld" => "controller",
                    _ => "auth",
                };
                Ok(Watched {
                    role: role.into(),
                    name: m.name.clone(),
                    pid: m
                        .pid()
                        .with_context(|| format!("{} is not running", m.name))?,
                })
            })
            .collect()
    }

    /// Stop slurmd, slurmctld, then munged.
    pub async fn stop(&mut self) {
        for m in self.members.iter_mut().rev() {
            let _ = m.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_overrides_cpus_only_when_the_machine_has_too_few() {
        let dir = Path::new("/tmp/x");
        let sock = Path::new("/tmp/x/munge.socket");
        let small = slurm_conf(dir, sock, 1, 2, 4, 2, 1000, None);
        assert!(small.contains("SlurmdParameters=config_overrides\n"));
        assert!(small.contains("NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000"));
        assert!(small.contains("AuthInfo=socket=/tmp/x/munge.socket\n"));
        assert!(!small.contains("SchedulerParameters"));
        let big = slurm_conf(dir, sock, 1, 2, 8, 8, 1000, Some("batch_sched_delay=0"));
        assert!(!big.contains("config_overrides"));
        assert!(big.contains("SchedulerParameters=batch_sched_delay=0\n"));
    }

    #[test]
    fn quoting_for_sh() {
        assert_eq!(shell_quote("sleep"), "'sleep'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
