//! Which local account a namespace's jobs run as (the nodelet runs as root and drops to it for
//! every rank):
//!
//! - `--run-as NS=ACCOUNT`: an existing account (name or uid), resolved at start;
//! - every other namespace: a dynamic uid of its own from `--job-uid-range` (gid = the same
//!   number, no passwd entry — like systemd's DynamicUser or Kubernetes' runAsUser), assigned
//!   on first use and kept in `accounts.json` (0600) so it is stable across restarts;
//! - `--single-user`, or a nodelet that is not root: every job runs as the nodelet's own
//!   account, and the Node says so (condition `JobIsolation` False).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::exec::RunAs;

/// The default `--job-uid-range`: 256 uids, where systemd's dynamic users start.
pub const DEFAULT_UID_RANGE: UidRange = UidRange {
    start: 61184,
    end: 61439,
};
/// The Node condition that says whether jobs run under accounts of their own.
pub const CONDITION: &str = "JobIsolation";
const FILE: &str = "accounts.json";

/// An inclusive range of uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UidRange {
    pub start: u32,
    pub end: u32,
}

impl UidRange {
    pub fn contains(&self, uid: u32) -> bool {
        (self.start..=self.end).contains(&uid)
    }

    /// Whether the two ranges have a uid in common.
    pub fn overlaps(&self, other: &UidRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl std::str::FromStr for UidRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?}: expected START-END"))?;
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("{x:?} is not a uid"))
        };
        let (start, end) = (num(a)?, num(b)?);
        // Below 1000 are system accounts on both Linux and macOS (macOS users start at 501).
        if start < 1000 || end < start || end >= u32::MAX - 1 {
            return Err(format!("{s:?}: expected 1000 <= START <= END < 4294967294"));
        }
        Ok(UidRange { start, end })
    }
}

/// How the nodelet was asked to run jobs.
#[derive(Debug, Clone)]
pub struct IsolationConfig {
    pub single_user: bool,
    /// `NS=ACCOUNT` pairs from `--run-as`.
    pub run_as: Vec<(String, String)>,
    pub uid_range: UidRange,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            single_user: false,
            run_as: Vec::new(),
            uid_range: DEFAULT_UID_RANGE,
        }
    }
}

/// The account a rank runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    /// The login name, when the account has one (USER and LOGNAME).
    pub name: Option<String>,
    /// One of tb's dynamic uids: nothing but tb's jobs of one namespace runs under it.
    pub dynamic: bool,
}

impl Account {
    pub fn run_as(&self) -> RunAs {
        RunAs {
            uid: self.uid,
            gid: self.gid,
        }
    }
}

/// Why jobs run as the nodelet's own account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SingleUser {
    /// `--single-user` (a development cluster, `tbctl up`).
    Asked,
    /// The nodelet is not root and cannot switch accounts.
    NotRoot,
}

/// The uids the nodelet assigned, as kept in `accounts.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Assignments {
    /// Namespace → uid.
    namespaces: BTreeMap<String, u32>,
}

pub struct Policy {
    single_user: Option<SingleUser>,
    run_as: BTreeMap<String, Account>,
    range: UidRange,
    path: PathBuf,
    assigned: Mutex<Assignments>,
    /// This host's claim on `range`, held while the nodelet runs (root, not single-user).
    _claim: Option<super::uid_claim::UidClaim>,
}

impl Policy {
    /// The policy for `cfg`, with the assignments kept in `data_dir`. Every `--run-as` account
    /// must exist.
    pub fn load(cfg: &IsolationConfig, data_dir: &Path) -> anyhow::Result<Policy> {
        let root = nix::unistd::geteuid().is_root();
        let mut policy = Self::load_as(cfg, data_dir, root)?;
        if policy.single_user.is_none() {
            let dir = Path::new(super::uid_claim::CLAIM_DIR);
            policy._claim = Some(super::uid_claim::claim(dir, cfg.uid_range)?);
        }
        Ok(policy)
    }

    fn load_as(cfg: &IsolationConfig, data_dir: &Path, root: bool) -> anyhow::Result<Policy> {
        let single_user = if cfg.single_user {
            Some(SingleUser::Asked)
        } else if !root {
            Some(SingleUser::NotRoot)
        } else {
            None
        };
        let mut run_as = BTreeMap::new();
        for (ns, account) in &cfg.run_as {
            tb_api::name::validate_name(ns)
                .map_err(|e| anyhow::anyhow!("--run-as {ns}={account}: namespace: {e}"))?;
            let resolved = resolve(account).with_context(|| format!("--run-as {ns}={account}"))?;
            if resolved.uid == 0 {
                bail!("--run-as {ns}={account}: jobs never run as root");
            }
            if cfg.uid_range.contains(resolved.uid) {
                bail!(
                    "--run-as {ns}={account}: uid {} is inside --job-uid-range {}-{}, which tb \
                     hands out on its own",
                    resolved.uid,
                    cfg.uid_range.start,
                    cfg.uid_range.end
                );
            }
            if run_as.insert(ns.clone(), resolved).is_some() {
                bail!("--run-as {ns}=…: namespace {ns} is mapped twice");
            }
        }
        let path = data_dir.join(FILE);
        let assigned = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{}: not tb's account assignments", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Assignments::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Policy {
            single_user,
            run_as,
            range: cfg.uid_range,
            path,
            assigned: Mutex::new(assigned),
            _claim: None,
        })
    }

    /// Why jobs run as the nodelet's account; None when they run as accounts of their own.
    pub fn single_user(&self) -> Option<&SingleUser> {
        self.single_user.as_ref()
    }

    /// The account `namespace`'s jobs run as; None: the nodelet's own (single-user). Assigns
    /// (and keeps) a dynamic uid on first use.
    pub fn account_for(&self, namespace: &str) -> Result<Option<Account>, String> {
        if self.single_user.is_some() {
            return Ok(None);
        }
        if let Some(a) = self.run_as.get(namespace) {
            return Ok(Some(a.clone()));
        }
        let mut assigned = self.assigned.lock().unwrap_or_else(|e| e.into_inner());
        let kept = assigned.namespaces.get(namespace).copied();
        let uid = match kept.filter(|u| self.range.contains(*u)) {
            Some(uid) => uid,
            None => {
                let used: HashSet<u32> = assigned.namespaces.values().copied().collect();
                let uid = (self.range.start..=self.range.end)
                    .find(|u| !used.contains(u) && !has_passwd_entry(*u))
                    .ok_or_else(|| {
                        format!(
                            "no free uid left in --job-uid-range {}-{} for namespace {namespace}",
                            self.range.start, self.range.end
                        )
                    })?;
                let mut next = assigned.clone();
                next.namespaces.insert(namespace.to_string(), uid);
                save(&self.path, &next).map_err(|e| format!("{e:#}"))?;
                *assigned = next;
                tracing::info!(namespace, uid, "assigned a job account");
                uid
            }
        };
        Ok(Some(Account {
            uid,
            gid: uid,
            name: None,
            dynamic: true,
        }))
    }

    /// Every dynamic uid handed out so far (within the range).
    pub fn dynamic_uids(&self) -> HashSet<u32> {
        self.assigned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .namespaces
            .values()
            .copied()
            .filter(|u| self.range.contains(*u))
            .collect()
    }

    /// The Node condition: (status, reason, message).
    pub fn condition(&self) -> (bool, &'static str, String) {
        match &self.single_user {
            Some(SingleUser::Asked) => (
                false,
                "SingleUser",
                "--single-user: jobs run as the nodelet's own account (a development cluster)"
                    .into(),
            ),
            Some(SingleUser::NotRoot) => (
                false,
                "NotRoot",
                "the nodelet is not root: jobs run as its own account".into(),
            ),
            None => (
                true,
                "PerNamespaceAccounts",
                format!(
                    "jobs run as per-namespace accounts (dynamic uids {}-{}{})",
                    self.range.start,
                    self.range.end,
                    if self.run_as.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; mapped: {}",
                            self.run_as.keys().cloned().collect::<Vec<_>>().join(",")
                        )
                    }
                ),
            ),
        }
    }
}

/// An existing account by name or numeric uid.
fn resolve(account: &str) -> anyhow::Result<Account> {
    use nix::unistd::{Uid, User};
    let user = match account.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid))
            .with_context(|| format!("looking up uid {uid}"))?
            .map(|u| (u.uid.as_raw(), u.gid.as_raw(), Some(u.name)))
            // A bare uid needs no passwd entry: its gid is the same number.
            .unwrap_or((uid, uid, None)),
        Err(_) => {
            let u = User::from_name(account)
                .with_context(|| format!("looking up account {account:?}"))?
                .with_context(|| format!("no local account named {account:?}"))?;
            (u.uid.as_raw(), u.gid.as_raw(), Some(u.name))
        }
    };
    Ok(Account {
        uid: user.0,
        gid: user.1,
        name: user.2,
        dynamic: false,
    })
}

fn has_passwd_entry(uid: u32) -> bool {
    !matches!(
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
        Ok(None)
    )
}

fn save(path: &Path, a: &Assignments) -> anyhow::Result<()> {
    let text = serde_json::to_vec_pretty(a)?;
    super::dirs::write_private(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(range: &str) -> IsolationConfig {
        IsolationConfig {
            uid_range: range.parse().expect("range"),
            ..Default::default()
        }
    }

    #[test]
    fn uid_ranges_parse_and_refuse_system_uids() {
        assert_eq!(
            "61184-61439".parse::<UidRange>(),
            Ok(UidRange {
                start: 61184,
                end: 61439
            })
        );
        assert!("0-100".parse::<UidRange>().is_err());
        assert!("70000-60000".parse::<UidRange>().is_err());
        assert!("x-1".parse::<UidRange>().is_err());
        assert!("61184".parse::<UidRange>().is_err());
    }

    #[test]
    fn dynamic_uids_are_per_namespace_and_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = cfg("61184-61186");
        let policy = Policy::load_as(&c, dir.path(), true).expect("policy");
        let a = policy.account_for("team-a").expect("a").expect("isolated");
        let b = policy.account_for("team-b").expect("b").expect("isolated");
        assert_ne!(a.uid, b.uid, "two namespaces never share a dynamic uid");
        assert_eq!((a.gid, a.dynamic, a.name.clone()), (a.uid, true, None));
        assert_eq!(
            policy.account_for("team-a").expect("again"),
            Some(a.clone())
        );
        assert!(c.uid_range.contains(a.uid) && c.uid_range.contains(b.uid));
        assert_eq!(policy.dynamic_uids(), HashSet::from([a.uid, b.uid]));

        let file = dir.path().join(FILE);
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).expect("kept").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // A restarted nodelet keeps them, and hands out the next one after them.
        let again = Policy::load_as(&c, dir.path(), true).expect("reloaded");
        assert_eq!(again.account_for("team-b").expect("b"), Some(b.clone()));
        assert_eq!(again.account_for("team-a").expect("a"), Some(a.clone()));
        let third = again.account_for("team-c").expect("c").expect("isolated");
        assert!(![a.uid, b.uid].contains(&third.uid));
        // The range is then used up (unless a uid in it has a passwd entry, then sooner).
        let err = again.account_for("team-d").expect_err("range exhausted");
        assert!(err.contains("no free uid left"), "{err}");
    }

    #[test]
    fn single_user_runs_everything_as_the_nodelet() {
        let dir = tempfile::tempdir().expect("tempdir");
        let asked = IsolationConfig {
            single_user: true,
            ..cfg("61184-61439")
        };
        let p = Policy::load_as(&asked, dir.path(), true).expect("policy");
        assert_eq!(p.account_for("team-a"), Ok(None));
        assert!(!p.condition().0);
        assert_eq!(p.condition().1, "SingleUser");
        let p = Policy::load_as(&cfg("61184-61439"), dir.path(), false).expect("policy");
        assert_eq!(p.single_user(), Some(&SingleUser::NotRoot));
        assert_eq!(p.condition().1, "NotRoot");
        assert!(!dir.path().join(FILE).exists(), "nothing assigned");
    }

    #[test]
    fn run_as_maps_a_namespace_and_refuses_bad_accounts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mapped = IsolationConfig {
            run_as: vec![("lab".into(), "4242".into())],
            ..cfg("61184-61439")
        };
        let p = Policy::load_as(&mapped, dir.path(), true).expect("policy");
        let a = p.account_for("lab").expect("lab").expect("mapped");
        assert_eq!((a.uid, a.dynamic), (4242, false));
        assert!(p.condition().2.contains("mapped: lab"));

        let bad = |ns: &str, account: &str| {
            let c = IsolationConfig {
                run_as: vec![(ns.into(), account.into())],
                ..cfg("61184-61439")
            };
            match Policy::load_as(&c, dir.path(), true) {
                Ok(_) => panic!("--run-as {ns}={account} accepted"),
                Err(e) => format!("{e:#}"),
            }
        };
        assert!(bad("lab", "0").contains("never run as root"));
        assert!(bad("lab", "root").contains("never run as root"));
        assert!(bad("lab", "61200").contains("inside --job-uid-range"));
        assert!(bad("lab", "no-such-account-here").contains("no local account named"));
        assert!(bad("Bad_NS", "4242").contains("namespace"));
    }
}
