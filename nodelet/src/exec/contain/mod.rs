//! Containment: nothing a rank starts outlives it. A rank leads its own session, but a process
//! can leave that group (`setsid`, `nohup … &`, a double fork), so stopping a rank also sweeps
//! the process table for what belongs to its allocation:
//!
//! - on Linux with a writable cgroup v2 mount, the allocation's cgroup ([`cgroup`]): whatever
//!   the processes do, they stay in it;
//! - every descendant of the rank's leader while it lives (orphans are re-parented to the
//!   nodelet, which is a child subreaper on Linux, rather than to init);
//! - every process whose environment carries the allocation's marker
//!   ([`MARKER_ENV`]`=<allocation id>`; Linux only — a process may clear its environment);
//! - every process of the allocation's account when that account is one of tb's dynamic uids
//!   and no other allocation on this node runs under it: tb owns those uids exclusively, so
//!   nothing else can be hurt — this is what catches an escape that also cleared its
//!   environment, and on macOS (no environment, no subreaper) it is the main rule.
//!
//! A sweep repeats (bounded) until nothing matches, with SIGKILL, and reaps the zombies of
//! processes it killed that the nodelet adopted — by their own pid (`waitpid(pid, WNOHANG)`),
//! never `waitpid(-1)`, which would steal the exit status of tokio's own children.

#[cfg(target_os = "linux")]
pub mod cgroup;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "macos")]
mod macos;

#[cfg(target_os = "linux")]
use linux as os;
#[cfg(target_os = "macos")]
use macos as os;

#[cfg(target_os = "linux")]
pub use linux::{environ_has, parse_real_uid, parse_stat};
pub use os::{become_subreaper, has_env, processes, start_time};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// The environment variable every rank gets: the allocation's incarnation id.
pub const MARKER_ENV: &str = "TB_ALLOCATION";
/// How many times a sweep looks again for processes that appeared while it killed.
const SWEEP_ROUNDS: u32 = 100;
/// Pause between rounds, for killed processes to die and their children to be re-parented.
const SWEEP_PAUSE: Duration = Duration::from_millis(20);

/// One process as the sweep sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// Real uid.
    pub uid: u32,
    /// Start time, in the OS's unit (Linux: clock ticks since boot; macOS: µs since the epoch).
    /// With the pid, it names one process: a recycled pid has another start time.
    pub start: u64,
    pub zombie: bool,
    /// Session id (Linux; 0 where unknown).
    pub sid: i32,
}

/// The cgroup type, or a stand-in where there is none.
#[cfg(target_os = "linux")]
pub type Cgroup = cgroup::Cgroup;
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub struct Cgroup;
#[cfg(not(target_os = "linux"))]
impl Cgroup {
    pub fn create(_id: &str) -> Option<Cgroup> {
        None
    }
    fn kill(&self) {}
    fn pids(&self) -> Vec<i32> {
        Vec::new()
    }
    fn remove(&self) {}
    pub fn procs_for_writing(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// Asked at sweep time: the dynamic uid whose processes all belong to this allocation now
/// (None: the account is shared, named, or another allocation still runs under it).
pub type ExclusiveUid = Arc<dyn Fn() -> Option<u32> + Send + Sync>;

/// What belongs to one allocation.
#[derive(Clone)]
pub struct Scope {
    /// The allocation's id, the value of [`MARKER_ENV`] in its ranks' environment.
    pub id: String,
    pub cgroup: Option<Arc<Cgroup>>,
    pub exclusive_uid: Option<ExclusiveUid>,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("id", &self.id)
            .field("cgroup", &self.cgroup)
            .field("exclusive_uid", &self.exclusive_uid.is_some())
            .finish()
    }
}

impl Scope {
    /// A scope found by marker only.
    pub fn new(id: impl Into<String>) -> Scope {
        Scope {
            id: id.into(),
            cgroup: None,
            exclusive_uid: None,
        }
    }

    /// `TB_ALLOCATION=<id>`.
    pub fn marker(&self) -> String {
        format!("{MARKER_ENV}={}", self.id)
    }

    /// Sends `signal` once to everything of the allocation (a leader given as pid and start
    /// time counts with its descendants). Returns how many processes were signalled.
    pub fn signal_once(&self, leader: Option<(i32, u64)>, signal: Signal) -> usize {
        let table = processes();
        let picked = self.pick(&table, leader, false);
        picked
            .iter()
            .filter(|p| !p.zombie && signal_if_same(p, signal))
            .count()
    }

    /// Kills everything of the allocation, looking again until nothing is left (bounded), and
    /// removes its cgroup. Returns how many processes were killed.
    pub fn sweep(&self, leader: Option<(i32, u64)>) -> usize {
        let killed = sweep_where(|table| self.pick(table, leader, true));
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
        killed
    }

    fn pick(&self, table: &[ProcInfo], leader: Option<(i32, u64)>, kill: bool) -> Vec<ProcInfo> {
        if kill && let Some(cg) = &self.cgroup {
            cg.kill();
        }
        let in_cgroup: HashSet<i32> = self.cgroup.iter().flat_map(|c| c.pids()).collect();
        let uid = self.exclusive_uid.as_ref().and_then(|f| f());
        let marker = self.marker();
        members(table, own_pid(), |p| {
            leader == Some((p.pid, p.start))
                || in_cgroup.contains(&p.pid)
                || uid == Some(p.uid)
                || (!p.zombie && has_env(p.pid, &marker))
        })
    }
}

/// The pids of the ranks' leaders this process started and has not yet waited for: tokio reaps
/// those, so [`reap_adopted`] must not. Hold it across a spawn so that no leader is ever
/// unlisted while it exists.
pub fn leaders() -> MutexGuard<'static, HashSet<i32>> {
    static LEADERS: LazyLock<Mutex<HashSet<i32>>> = LazyLock::new(Mutex::default);
    LEADERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reaps the zombies of orphans the nodelet adopted as subreaper (their own parent exited
/// first), which nothing else would ever wait for: children of this process in another session
/// than its own that are not a leader it waits for. Its other children (commands it runs for
/// discovery) share its session and are left to whoever started them. Returns how many.
pub fn reap_adopted() -> usize {
    let me = own_pid();
    let own_session = nix::unistd::getsid(None).map(Pid::as_raw).unwrap_or(0);
    let leaders = leaders();
    let mut reaped = 0;
    for p in processes() {
        if p.zombie
            && p.ppid == me
            && p.sid != own_session
            && !leaders.contains(&p.pid)
            && waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG)).is_ok()
        {
            reaped += 1;
        }
    }
    reaped
}

/// Kills every process of the given uids (tb's dynamic uids when nothing of tb runs yet: at
/// start, everything under them is a leftover of an earlier run). Returns how many.
pub fn sweep_uids(uids: &HashSet<u32>) -> usize {
    if uids.is_empty() {
        return 0;
    }
    sweep_where(|table| members(table, own_pid(), |p| uids.contains(&p.uid)))
}

fn own_pid() -> i32 {
    std::process::id() as i32
}

/// The processes `is_member` picks, with all their descendants; never `me` (nor, through it,
/// anything of the nodelet's own), init, or pid 0.
pub fn members(
    table: &[ProcInfo],
    me: i32,
    is_member: impl Fn(&ProcInfo) -> bool,
) -> Vec<ProcInfo> {
    let mut children: HashMap<i32, Vec<&ProcInfo>> = HashMap::new();
    for p in table {
        children.entry(p.ppid).or_default().push(p);
    }
    let eligible = |p: &ProcInfo| p.pid > 1 && p.pid != me;
    let mut picked: HashMap<i32, ProcInfo> = HashMap::new();
    let mut todo: Vec<&ProcInfo> = table
        .iter()
        .filter(|p| eligible(p) && is_member(p))
        .collect();
    while let Some(p) = todo.pop() {
        if picked.insert(p.pid, *p).is_some() {
            continue;
        }
        for c in children.get(&p.pid).into_iter().flatten() {
            if eligible(c) && !picked.contains_key(&c.pid) {
                todo.push(c);
            }
        }
    }
    let mut out: Vec<ProcInfo> = picked.into_values().collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// SIGKILL what `pick` returns until it returns nothing alive; reap the zombies it leaves with
/// the nodelet as parent. Returns how many were killed.
fn sweep_where(pick: impl Fn(&[ProcInfo]) -> Vec<ProcInfo>) -> usize {
    let me = own_pid();
    let mut killed: HashSet<i32> = HashSet::new();
    for round in 0..SWEEP_ROUNDS {
        let table = processes();
        let picked = pick(&table);
        // Adopted zombies of what this sweep killed (or picked): reap them by pid.
        for p in table.iter().filter(|p| p.zombie && p.ppid == me) {
            if killed.contains(&p.pid) || picked.iter().any(|q| q.pid == p.pid) {
                let _ = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG));
            }
        }
        let alive: Vec<&ProcInfo> = picked.iter().filter(|p| !p.zombie).collect();
        if alive.is_empty() {
            break;
        }
        for p in alive {
            if signal_if_same(p, Signal::SIGKILL) {
                killed.insert(p.pid);
            }
        }
        if round + 1 == SWEEP_ROUNDS {
            tracing::warn!(
                killed = killed.len(),
                "processes kept appearing; gave up sweeping after {SWEEP_ROUNDS} rounds"
            );
        }
        std::thread::sleep(SWEEP_PAUSE);
    }
    // Last reaping pass for what died after the final look.
    for p in processes()
        .iter()
        .filter(|p| p.zombie && p.ppid == me && killed.contains(&p.pid))
    {
        let _ = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG));
    }
    if !killed.is_empty() {
        tracing::info!(count = killed.len(), "killed processes left behind");
    }
    reap_adopted();
    killed.len()
}

/// Signals `p` if its pid still names the same process (same start time).
fn signal_if_same(p: &ProcInfo, signal: Signal) -> bool {
    start_time(p.pid) == Some(p.start) && kill(Pid::from_raw(p.pid), signal).is_ok()
}

/// The real uid of `pid`, if it exists.
pub fn uid_of(pid: i32) -> Option<u32> {
    os::read(pid).map(|p| p.uid)
}

/// Whether `pid` is alive and started at `start`: the proof that a pid from a file still names
/// the process that was recorded.
pub fn is_same_process(pid: i32, start: u64) -> bool {
    pid > 1 && start_time(pid) == Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, uid: u32) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            uid,
            start: pid as u64 * 10,
            zombie: false,
            sid: 0,
        }
    }

    #[test]
    fn members_bring_their_descendants_but_never_the_nodelet() {
        // 100 = the nodelet; 200 its rank; 201/202 the rank's children; 300 adopted by the
        // nodelet (escaped), 301 its child; 400 someone else's.
        let table = [
            p(1, 0, 0),
            p(100, 1, 0),
            p(200, 100, 61184),
            p(201, 200, 61184),
            p(202, 201, 61184),
            p(300, 100, 61184),
            p(301, 300, 61184),
            p(400, 1, 1000),
        ];
        let pids = |v: Vec<ProcInfo>| v.iter().map(|p| p.pid).collect::<Vec<_>>();
        assert_eq!(
            pids(members(&table, 100, |p| p.pid == 200)),
            [200, 201, 202]
        );
        assert_eq!(
            pids(members(&table, 100, |p| p.uid == 61184)),
            [200, 201, 202, 300, 301]
        );
        // The nodelet itself matching (say its environment had a marker) brings nothing.
        assert_eq!(
            pids(members(&table, 100, |p| p.pid == 100)),
            Vec::<i32>::new()
        );
        assert_eq!(
            pids(members(&table, 100, |p| p.pid <= 1)),
            Vec::<i32>::new()
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_start_time_proves_the_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        let start = start_time(pid).expect("a start time");
        assert!(is_same_process(pid, start));
        assert!(
            !is_same_process(pid, start + 1),
            "another start time: another process"
        );
        assert!(
            !is_same_process(1, start_time(1).unwrap_or(0)),
            "never init"
        );
        let _ = child.kill();
        let _ = child.wait();
        assert!(!is_same_process(pid, start), "gone");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sweep_kills_what_carries_the_marker_and_its_children() {
        let id = format!("test/sweep/{}", std::process::id());
        // sh carries the marker, and so does the sleep it starts in the background; sh waits.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .env(MARKER_ENV, &id)
            .spawn()
            .expect("sh");
        let pid = child.id() as i32;
        let scope = Scope::new(id.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while members(&processes(), own_pid(), |p| p.ppid == pid).is_empty() {
            assert!(std::time::Instant::now() < deadline, "sleep never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let start = start_time(pid).expect("sh's start time");
        let killed = scope.sweep(None);
        assert!(killed >= 2, "sh and sleep killed, got {killed}");
        // The sweep reaped sh (its zombie had this process as parent) by its pid.
        assert!(!is_same_process(pid, start), "sh is gone");
        assert!(child.try_wait().is_err(), "already reaped by the sweep");
        let marker = scope.marker();
        assert!(
            !processes()
                .iter()
                .any(|p| !p.zombie && has_env(p.pid, &marker)),
            "nothing with the marker is left"
        );
    }
}
