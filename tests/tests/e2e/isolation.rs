//! Job isolation end to end, with real nodelets running as root: a job runs under its
//! namespace's account (a dynamic uid, or the account `--run-as` maps) and cannot read tb's
//! credentials nor another namespace's files; what a rank starts (setsid, nohup, double fork)
//! ends with it; a restarted nodelet never kills a process a stale pid file names unless it can
//! prove it is its own; allocation directories go with their allocations, and past
//! `--job-disk-limit` the oldest finished ones go first.
//!
//! Accounts can only be switched by root: run as another user, these tests say so and return.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tb_tests::lab::{JOB_UIDS, Lab, LabOptions, condition, job_uid_base, process_alive};
use tb_tests::step;

/// Generous bound for a short job on a loaded 2-core machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(40);
/// How long escaped processes may take to be gone once their job ended or was deleted.
const GONE_TIMEOUT: Duration = Duration::from_secs(20);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Returns true (after saying why) when the test cannot run here.
fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("SKIPPED {test}: switching a job's account needs root (CI runs as root)");
    true
}

fn isolated(nodelets: usize, extra: &[String]) -> LabOptions {
    LabOptions {
        isolated: true,
        nodelet_args: extra.to_vec(),
        ..LabOptions::new(nodelets)
    }
}

/// A TrainingJob of one rank running `script` with `sh -c`.
fn job_yaml(namespace: &str, name: &str, script: &str, env: &[(&str, String)]) -> String {
    let mut yaml = format!(
        "apiVersion: tb/v1\nkind: TrainingJob\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
         spec:\n  ranks: 1\n  memory: 32Mi\n  backoffLimit: 0\n  command: [\"/bin/sh\", \"-c\", {}]\n",
        serde_json::to_string(script).expect("a JSON string is YAML")
    );
    if !env.is_empty() {
        yaml.push_str("  env:\n");
        for (k, v) in env {
            yaml.push_str(&format!(
                "    {k}: {}\n",
                serde_json::to_string(v).expect("JSON string")
            ));
        }
    }
    yaml
}

async fn job(lab: &Lab, namespace: &str, name: &str) -> Result<Value, String> {
    lab.list("TrainingJob", namespace)
        .await?
        .into_iter()
        .find(|j| j["metadata"]["name"] == name)
        .ok_or_else(|| format!("no tj/{name} in {namespace}"))
}

async fn wait_phase(lab: &Lab, namespace: &str, name: &str, phase: &str) -> Value {
    tb_tests::wait::expect(
        &format!("tj/{name} in {namespace} to be {phase}"),
        JOB_TIMEOUT,
        || async move {
            let j = job(lab, namespace, name).await?;
            let now = j["status"]["phase"].as_str().unwrap_or("").to_string();
            if now == phase {
                return Ok(j["status"].clone());
            }
            if matches!(now.as_str(), "Succeeded" | "Failed") {
                panic!("tj/{name} ended {now}, not {phase}: {:#}", j["status"]);
            }
            Err(format!("phase {now:?}"))
        },
    )
    .await
}

/// The allocation of a one-rank job (its current epoch's).
async fn allocation(lab: &Lab, namespace: &str, job: &str) -> Value {
    tb_tests::wait::expect(
        &format!("an allocation of tj/{job}"),
        JOB_TIMEOUT,
        || async move {
            lab.list("Allocation", namespace)
                .await?
                .into_iter()
                .find(|a| a["metadata"]["labels"]["tb/job"] == job)
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await
}

fn alloc_dir(lab: &Lab, alloc: &Value) -> PathBuf {
    let node = alloc["spec"]["node"].as_str().expect("spec.node");
    let ns = alloc["metadata"]["namespace"].as_str().expect("namespace");
    let name = alloc["metadata"]["name"].as_str().expect("name");
    lab.nodelet(lab.index_of(node)).alloc_dir(ns, name)
}

async fn logs(lab: &Lab, namespace: &str, name: &str) -> String {
    lab.tbctl_ok(&["logs", name, "-n", namespace]).await.stdout
}

/// The value of `key=` on the line starting with it.
fn value_of<'a>(log: &'a str, key: &str) -> Option<&'a str> {
    log.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::trim)
}

/// A local account made with useradd for the test, removed on drop.
struct TempAccount {
    name: String,
    uid: u32,
}

impl TempAccount {
    fn create(prefix: &str) -> TempAccount {
        let name = format!("{prefix}{}", std::process::id() % 100_000);
        let _ = std::process::Command::new("userdel").arg(&name).output();
        let out = std::process::Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", &name])
            .output()
            .expect("useradd runs");
        assert!(
            out.status.success(),
            "useradd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = std::process::Command::new("id")
            .args(["-u", &name])
            .output()
            .expect("id runs");
        let uid = String::from_utf8_lossy(&id.stdout)
            .trim()
            .parse()
            .expect("a uid");
        TempAccount { name, uid }
    }
}

impl Drop for TempAccount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel")
            .arg(&self.name)
            .output();
    }
}

/// A member's job on an isolated nodelet: its `id -u` is its namespace's dynamic uid (another
/// namespace's differs; a `--run-as` namespace gets that account), and every attempt to read
/// the node's credential, key, certificate, account table, the data dir's listing, another
/// namespace's work dir, file and logs fails. The Node says jobs are isolated and how much disk
/// they use.
#[tokio::test]
async fn a_members_job_cannot_read_tb_secrets_or_another_namespaces_files() {
    if skip_unless_root("a_members_job_cannot_read_tb_secrets_or_another_namespaces_files") {
        return;
    }
    let account = TempAccount::create("tbiso");
    let lab = Lab::start_with(
        "iso-secrets",
        isolated(1, &["--run-as".into(), format!("mapped={}", account.name)]),
    )
    .await;
    let node = lab.nodelet(0);
    let data = node.data_dir.clone();
    let first = job_uid_base(node.ports.0);
    let range = first..first + JOB_UIDS;

    // team-b keeps a secret (and a 1 MiB file) in its work dir, and says so in its log.
    lab.apply_yaml(&job_yaml(
        "team-b",
        "keeper",
        "echo secret-of-b > \"$HOME/secret\"; head -c 1048576 /dev/zero > big; echo uid=$(id -u); echo home=$HOME",
        &[],
    ))
    .await;
    wait_phase(&lab, "team-b", "keeper", "Succeeded").await;
    let keeper_log = logs(&lab, "team-b", "keeper").await;
    let keeper_uid: u32 = value_of(&keeper_log, "uid")
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no uid in {keeper_log}"));
    assert!(
        range.contains(&keeper_uid),
        "uid {keeper_uid} not in {range:?}"
    );
    let keeper_dir = alloc_dir(&lab, &allocation(&lab, "team-b", "keeper").await);
    let keeper_home = keeper_dir.join("work");
    assert_eq!(
        value_of(&keeper_log, "home"),
        Some(keeper_home.to_str().expect("utf-8"))
    );
    assert!(keeper_home.join("secret").exists());

    // team-a tries everything.
    let targets: Vec<(&str, PathBuf)> = vec![
        ("credential", data.join("credential.json")),
        ("node-key", data.join("node.key")),
        ("node-cert", data.join("node.pem")),
        ("accounts", data.join("accounts.json")),
        ("other-secret", keeper_home.join("secret")),
        ("other-log", keeper_dir.join("logs").join("stdout.log")),
        ("other-exit", keeper_dir.join("exit.json")),
    ];
    let mut targets = targets;
    // The controller's secrets: the files the harness passes it (admin token, cluster secret,
    // CA key). (The controller's own data dir is the controller's to protect.)
    let controller_args = tb_tests::auth::controller_args();
    for flag in [
        "--admin-token-file",
        "--cluster-secret-file",
        "--tls-ca-key",
    ] {
        if let Some(i) = controller_args.iter().position(|a| a == flag) {
            targets.push(("controller-secret", PathBuf::from(&controller_args[i + 1])));
        }
    }
    step!("targets: {targets:#?}");
    for (what, path) in &targets {
        if matches!(*what, "credential" | "node-key" | "accounts") {
            assert!(path.exists(), "{what}: {} should exist", path.display());
        }
    }
    let mut script = String::from("echo uid=$(id -u)\n");
    for (what, path) in &targets {
        script.push_str(&format!(
            "if cat '{}' >/dev/null 2>&1; then echo READ {what}; else echo DENIED {what}; fi\n",
            path.display()
        ));
    }
    for (what, dir) in [("data-dir", &data), ("other-work", &keeper_home)] {
        script.push_str(&format!(
            "if ls '{}' >/dev/null 2>&1; then echo READ {what}; else echo DENIED {what}; fi\n",
            dir.display()
        ));
    }
    lab.apply_yaml(&job_yaml("team-a", "snoop", &script, &[]))
        .await;
    wait_phase(&lab, "team-a", "snoop", "Succeeded").await;
    let snoop_log = logs(&lab, "team-a", "snoop").await;
    step!("snoop:\n{snoop_log}");
    let snoop_uid: u32 = value_of(&snoop_log, "uid")
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no uid in {snoop_log}"));
    assert!(
        range.contains(&snoop_uid),
        "uid {snoop_uid} not in {range:?}"
    );
    assert_ne!(snoop_uid, keeper_uid, "two namespaces share an account");
    assert!(
        !snoop_log.contains("READ "),
        "a read succeeded:\n{snoop_log}"
    );
    assert_eq!(
        snoop_log
            .lines()
            .filter(|l| l.starts_with("DENIED "))
            .count(),
        targets.len() + 2,
        "{snoop_log}"
    );

    // The mapped namespace runs as its account, with its name.
    lab.apply_yaml(&job_yaml(
        "mapped",
        "who",
        "echo uid=$(id -u); echo user=$USER",
        &[],
    ))
    .await;
    wait_phase(&lab, "mapped", "who", "Succeeded").await;
    let who = logs(&lab, "mapped", "who").await;
    assert_eq!(
        value_of(&who, "uid"),
        Some(account.uid.to_string().as_str()),
        "{who}"
    );
    assert_eq!(value_of(&who, "user"), Some(account.name.as_str()), "{who}");

    // The same namespace keeps its uid (kept in accounts.json).
    lab.apply_yaml(&job_yaml("team-b", "again", "echo uid=$(id -u)", &[]))
        .await;
    wait_phase(&lab, "team-b", "again", "Succeeded").await;
    let again = logs(&lab, "team-b", "again").await;
    assert_eq!(
        value_of(&again, "uid"),
        Some(keeper_uid.to_string().as_str())
    );

    let node_name = node.name.clone();
    let status = tb_tests::wait::expect(
        "the Node to report isolation and the jobs' disk use",
        JOB_TIMEOUT,
        || {
            let lab = &lab;
            let node_name = node_name.clone();
            async move {
                let n = lab.node(&node_name).await.ok_or("no Node")?;
                let s = n["status"].clone();
                if s["jobDiskBytes"].as_u64().unwrap_or(0) >= 1 << 20 {
                    Ok(s)
                } else {
                    Err(format!("jobDiskBytes {}", s["jobDiskBytes"]))
                }
            }
        },
    )
    .await;
    assert_eq!(
        condition(&status, "JobIsolation"),
        Some("True"),
        "{status:#}"
    );
}

/// Processes `sleep` with the argument `arg` (not zombies).
fn sleeps_with(arg: &str) -> Vec<i64> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"sleep"))
                    && args.contains(&arg.as_bytes())
            })
        })
        .filter(|pid| process_alive(*pid))
        .collect()
}

/// A rank that escapes three ways: its own session, nohup, a double fork.
fn escaping_script(arg: &str, then: &str) -> String {
    format!(
        "setsid sleep {arg} & nohup sleep {arg} >/dev/null 2>&1 & (sleep {arg} &) &\n\
         echo escaped\n{then}\n"
    )
}

async fn wait_sleeps(arg: &str, at_least: usize) -> Vec<i64> {
    tb_tests::wait::expect(
        &format!("{at_least} escaped sleeps ({arg})"),
        JOB_TIMEOUT,
        || async move {
            let found = sleeps_with(arg);
            if found.len() >= at_least {
                Ok(found)
            } else {
                Err(format!("{found:?}"))
            }
        },
    )
    .await
}

async fn wait_sleeps_gone(arg: &str, when: &str) {
    tb_tests::wait::expect(
        &format!("the escaped sleeps to be gone {when}"),
        GONE_TIMEOUT,
        || async move {
            let left = sleeps_with(arg);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await
}

async fn wait_dir_gone(dir: &Path) {
    tb_tests::wait::expect(
        &format!("{} to be removed", dir.display()),
        GONE_TIMEOUT,
        || async move {
            if dir.exists() {
                Err("still there")
            } else {
                Ok(())
            }
        },
    )
    .await
}

/// setsid, nohup and double-fork escapes end with their rank: once it succeeds, and when its
/// job is deleted while it runs; the allocations' directories go with the deleted jobs.
async fn escapes_end_with_the_rank(lab: &Lab, ns: &str, variant: u32) {
    // Unique to this test process and variant: the tests of this file run at once.
    let tag = format!("{}{variant}", std::process::id() % 100_000);

    // Success: the rank waits for the test to see its escapes, then exits 0.
    let arg = format!("301.{tag}1");
    let script = escaping_script(
        &arg,
        "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo done",
    );
    lab.apply_yaml(&job_yaml(ns, "escaper", &script, &[])).await;
    let alloc = allocation(lab, ns, "escaper").await;
    let dir = alloc_dir(lab, &alloc);
    let escaped = wait_sleeps(&arg, 3).await;
    step!("escaped: {escaped:?}");
    std::fs::write(dir.join("work").join("go"), "").expect("writing go");
    wait_phase(lab, ns, "escaper", "Succeeded").await;
    wait_sleeps_gone(&arg, "after the job succeeded").await;
    assert!(
        dir.exists(),
        "a finished job keeps its directory until deleted"
    );
    lab.tbctl_ok(&["delete", "tj", "escaper", "-n", ns]).await;
    wait_dir_gone(&dir).await;

    // Deleted while running.
    let arg = format!("301.{tag}2");
    let script = escaping_script(&arg, "sleep 300");
    lab.apply_yaml(&job_yaml(ns, "runaway", &script, &[])).await;
    wait_phase(lab, ns, "runaway", "Running").await;
    let dir = alloc_dir(lab, &allocation(lab, ns, "runaway").await);
    wait_sleeps(&arg, 3).await;
    lab.tbctl_ok(&["delete", "tj", "runaway", "-n", ns]).await;
    wait_sleeps_gone(&arg, "after the job was deleted").await;
    wait_dir_gone(&dir).await;
}

/// Single-user (as `tbctl up`): the escapes are found by the marker in their environment.
#[tokio::test]
async fn escapes_end_with_the_rank_single_user() {
    let lab = Lab::start("iso-escape-single", 1).await;
    let node = lab.node("node-1").await.expect("node-1");
    assert_eq!(
        condition(&node["status"], "JobIsolation"),
        Some("False"),
        "a single-user nodelet says so: {node:#}"
    );
    escapes_end_with_the_rank(&lab, "default", 1).await;
}

/// A second root nodelet on this host whose `--job-uid-range` overlaps a running one's does
/// not start (it would hand the same uids to other namespaces and kill the first one's jobs as
/// strays); once the first is gone, the range is free again.
#[tokio::test]
async fn nodelets_on_one_host_never_share_dynamic_uids() {
    if skip_unless_root("nodelets_on_one_host_never_share_dynamic_uids") {
        return;
    }
    let mut lab = Lab::start_with("iso-uid-claim", isolated(1, &[])).await;
    let first = job_uid_base(lab.nodelet(0).ports.0);
    let overlapping = format!("{}-{}", first + JOB_UIDS - 1, first + 2 * JOB_UIDS);
    // Started without a CA for the (unused) controller address: past the claim, it stops there.
    let lab_dir = lab.dir().to_path_buf();
    let second = |dir: &str| {
        let data = lab_dir.join(dir);
        let mut child = std::process::Command::new(tb_tests::lab::nodelet_bin())
            .args(["--controller", "127.0.0.1:9", "--name", "intruder"])
            .args(["--data-dir", &data.display().to_string()])
            .args(["--job-uid-range", &overlapping])
            .env("RUST_LOG", "warn")
            .env_remove("TB_CA_CERT")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("tb-nodelet");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().expect("its output")
    };
    let out = second("intruder");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {err}");
    assert!(
        err.contains(&format!(
            "--job-uid-range {overlapping} overlaps {first}-{}",
            first + JOB_UIDS - 1
        )) && err.contains("another tb-nodelet on this host holds"),
        "{err}"
    );
    step!("refused: {}", err.lines().last().unwrap_or_default());
    // The first nodelet gone (SIGKILL: its claim goes with the process), the range is free:
    // the second gets past it (and stops later, at the controller this test does not give it).
    lab.kill_nodelet(0);
    let out = second("intruder-2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("overlaps") && err.contains("no CA configured"),
        "{err}"
    );
}

/// Isolated: also under a dynamic uid no one else uses.
#[tokio::test]
async fn escapes_end_with_the_rank_isolated() {
    if skip_unless_root("escapes_end_with_the_rank_isolated") {
        return;
    }
    let lab = Lab::start_with("iso-escape", isolated(1, &[])).await;
    escapes_end_with_the_rank(&lab, "team-a", 2).await;
}

/// A stale pid file naming an unrelated live process (in the old format, and in the new one
/// with another start time) does not get it killed when the nodelet restarts.
#[tokio::test]
async fn a_stale_pid_file_never_kills_a_stranger() {
    let mut lab = Lab::start("iso-stale-pid", 1).await;
    // A group leader, as a user's process often is: killpg(pid) would reach it.
    let mut stranger = std::process::Command::new("sleep")
        .arg("300")
        .process_group(0)
        .spawn()
        .expect("sleep");
    let pid = stranger.id();
    let data = lab.nodelet(0).data_dir.clone();
    let old = data.join("allocs").join("default").join("ghost-e1-r0");
    let new = data.join("allocs").join("default").join("ghost-e2-r0");
    for d in [&old, &new] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(old.join("pid"), format!("{pid} 1\n")).expect("old pid file");
    std::fs::write(
        new.join("pid"),
        format!("{pid} 12345 0 2 default/ghost-e2-r0/u-gone\n"),
    )
    .expect("new pid file");
    lab.kill_nodelet(0);
    lab.restart_nodelet(0);
    // The nodelet reads and removes every pid file before it runs anything.
    let handled = tb_tests::wait::until("the pid files to be handled", JOB_TIMEOUT, || {
        let (old, new) = (old.clone(), new.clone());
        async move {
            if old.join("pid").exists() || new.join("pid").exists() {
                Err("pid files still there")
            } else {
                Ok(())
            }
        }
    })
    .await;
    if let Err(e) = handled {
        panic!("{e}; the restarted nodelet's log:\n{}", lab.nodelet_log(0));
    }
    lab.wait_node_ready("node-1", true, JOB_TIMEOUT).await;
    let alive = process_alive(i64::from(pid));
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        alive,
        "the restarted nodelet killed pid {pid}, which it never started:\n{}",
        lab.nodelet_log(0)
    );
}

/// Past `--job-disk-limit`, the oldest finished allocation's directory is removed first; the
/// newest stays.
#[tokio::test]
async fn disk_use_past_the_limit_removes_the_oldest_finished_first() {
    let lab = Lab::start_with(
        "iso-disk",
        LabOptions {
            nodelet_args: vec!["--job-disk-limit".into(), "2Mi".into()],
            ..LabOptions::new(1)
        },
    )
    .await;
    let write = "head -c 1258291 /dev/zero > blob; echo wrote";
    lab.apply_yaml(&job_yaml("default", "first", write, &[]))
        .await;
    wait_phase(&lab, "default", "first", "Succeeded").await;
    let first = alloc_dir(&lab, &allocation(&lab, "default", "first").await);
    assert!(first.join("work").join("blob").exists());
    lab.apply_yaml(&job_yaml("default", "second", write, &[]))
        .await;
    wait_phase(&lab, "default", "second", "Succeeded").await;
    let second = alloc_dir(&lab, &allocation(&lab, "default", "second").await);
    wait_dir_gone(&first).await;
    assert!(
        second.join("work").join("blob").exists(),
        "the newest finished allocation keeps its directory"
    );
}
