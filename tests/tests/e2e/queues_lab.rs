//! Queues end to end, on real processes: a real controller and two real nodelets (`node-1`,
//! `node-2`) run exec TrainingJobs, and the tests check what the scheduler's virtual-time tests
//! (`core/src/scheduler/tests.rs`: `a_queue_quota_holds_jobs_until_its_work_ends`,
//! `borrowing_lets_a_queue_go_past_its_quota_up_to_the_limit`,
//! `a_higher_priority_job_preempts_a_whole_lower_gang_which_is_requeued`, the reclaim tests)
//! check on paper, through the whole stack — Raft, the leader's scheduler, nodelets starting
//! and stopping process groups:
//!
//! - a queue's memory quota holds a job Pending (QuotaExceeded, with a message naming the
//!   queue and the figures, as `tbctl get tj -o wide` shows it) until the queue's running work
//!   ends, and then it runs;
//! - a higher-priority job that fits nowhere preempts a whole lower-priority gang: both ranks
//!   get SIGTERM and their processes end, the gang goes back to Pending (Preempted, no retry
//!   used), the preemptor is placed only once the rank on its Mac has ended, and once the
//!   preemptor has ended the gang is placed again and resumes from the checkpoint its first
//!   epoch wrote (`TB_RESUME_FROM`);
//! - a queue under its quota reclaims what another queue borrowed beyond its own: the
//!   borrowing gang is stopped (Reclaimed) and the owner's job runs.
//!
//! - a job its own queue's quota holds back preempts nothing (it would not be admitted once
//!   there was room, so stopping work for it only stops that work);
//! - a queue with a Mac quota puts more work on the Mac it already holds, and packs a gang's
//!   ranks onto the Macs it may use, instead of being refused the emptier Mac placement picks.
//! - a quota lowered below what the queue holds is accepted with a QuotaBelowUsage warning
//!   (event and condition); the running job keeps running and new work waits.
//!
//! Sizes: memory is what limits. A "big" rank asks for 60 % of a Mac's allocatable memory (read
//! from the Node, rounded down to MiB), so one fits per Mac and a 2-rank gang of them fills the
//! lab. The quota test uses small round sizes (128 MiB jobs, a 192 MiB quota) that fit the
//! Macs many times over, so only the quota can hold a job back.
//!
//! Jobs that must stay up while the test looks at them wait for a release file the test
//! creates (a bounded loop), so nothing depends on how fast the loaded machine is; the only
//! deadlines are those of the bounded waits. No assertion is about speed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_tests::lab::{
    Lab, LabOptions, process_alive, processes_of, stamp_millis, wait_process_gone,
};
use tb_tests::step;

const NODELETS: usize = 2;
/// Generous bound for a job to be placed, start or end on a loaded 2-core machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopped ranks may take to be gone (SIGTERM, a grace period, then SIGKILL).
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
const MI: u64 = 1 << 20;

/// A shell loop that returns once the file named by `$RELEASE` exists (at most about 60 s).
const HOLD: &str =
    r#"i=0; while [ ! -e "$RELEASE" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"#;

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

fn name_of(obj: &Value) -> &str {
    str_of(&obj["metadata"]["name"], "metadata.name")
}

/// A TrainingJob manifest: `ranks` ranks of `memory_mi` MiB in `queue`, running `script` with
/// `sh -c`, with `env` and any `extra` spec lines (already indented by two spaces).
fn job_yaml(
    name: &str,
    queue: &str,
    ranks: u32,
    memory_mi: u64,
    env: &[(&str, &str)],
    extra: &str,
    script: &str,
) -> String {
    let env: String = if env.is_empty() {
        String::new()
    } else {
        let vars: String = env
            .iter()
            .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
            .collect();
        format!("  env:\n{vars}")
    };
    let script: String = script
        .trim()
        .lines()
        .map(|l| format!("      {l}\n"))
        .collect();
    format!(
        "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  queue: {queue}
  ranks: {ranks}
  memory: {memory_mi}Mi
  backoffLimit: 0
{env}{extra}  command:
    - sh
    - -c
    - |
{script}"
    )
}

/// The smallest and largest allocatable memory of the lab's Macs, in bytes.
async fn allocatable(lab: &Lab) -> (u64, u64) {
    let nodes = lab.nodes().await;
    assert_eq!(nodes.len(), NODELETS, "{nodes:#?}");
    let all: Vec<u64> = nodes
        .iter()
        .map(|n| {
            n["status"]["capacity"]["allocatableBytes"]
                .as_u64()
                .unwrap_or_else(|| panic!("no allocatableBytes: {n:#}"))
        })
        .collect();
    (
        *all.iter().min().expect("nodes"),
        *all.iter().max().expect("nodes"),
    )
}

/// MiB per "big" rank: 60 % of the smallest Mac, so one fits per Mac and two never share one.
async fn big_rank_mi(lab: &Lab) -> u64 {
    let (min, max) = allocatable(lab).await;
    let mi = min / MI * 6 / 10;
    assert!(
        mi > 0 && mi * MI <= min && 2 * mi * MI > max,
        "{mi} MiB per rank must fit once, and only once, in every Mac (allocatable {min}..{max} \
         bytes)"
    );
    step!("allocatable {min}..{max} bytes per Mac; a big rank asks for {mi}Mi");
    mi
}

/// One rank of an epoch as the test saw it while it ran.
#[derive(Debug, Clone)]
struct RankSeen {
    allocation: String,
    node: String,
    pid: i64,
    dir: PathBuf,
}

/// The ranks of `job`'s `epoch`, once all `ranks` of them run, with their processes alive.
async fn running_ranks(lab: &Lab, job: &str, epoch: u64, ranks: usize) -> Vec<RankSeen> {
    let seen = tb_tests::wait::expect(
        &format!("tj/{job}: {ranks} rank(s) of epoch {epoch} running"),
        JOB_TIMEOUT,
        || async {
            let allocs: Vec<Value> = lab
                .allocations(job)
                .await
                .into_iter()
                .filter(|a| a["spec"]["epoch"] == epoch)
                .collect();
            let running: Vec<&Value> = allocs
                .iter()
                .filter(|a| a["status"]["phase"] == "Running" && a["status"]["pid"].is_i64())
                .collect();
            if running.len() == ranks {
                Ok(running.into_iter().cloned().collect::<Vec<_>>())
            } else {
                Err(format!("{allocs:?}"))
            }
        },
    )
    .await;
    seen.iter()
        .map(|a| {
            let node = str_of(&a["spec"]["node"], "spec.node").to_string();
            let allocation = name_of(a).to_string();
            let dir = lab
                .nodelet(lab.index_of(&node))
                .alloc_dir("default", &allocation);
            let pid = a["status"]["pid"].as_i64().expect("pid");
            assert!(
                process_alive(pid),
                "{allocation} on {node} is Running as pid {pid}, which is not alive"
            );
            RankSeen {
                allocation,
                node,
                pid,
                dir,
            }
        })
        .collect()
}

/// Wait until every process of `ranks` is gone and each allocation reports `Stopped`.
async fn wait_ranks_stopped(lab: &Lab, job: &str, ranks: &[RankSeen]) {
    for r in ranks {
        wait_process_gone(
            r.pid,
            &format!("{} on {}", r.allocation, r.node),
            STOP_TIMEOUT,
        )
        .await;
        assert_eq!(
            processes_of(&r.dir),
            Vec::<i64>::new(),
            "no process may still run as {} (its whole process group is stopped)",
            r.allocation
        );
    }
    let names: Vec<&str> = ranks.iter().map(|r| r.allocation.as_str()).collect();
    tb_tests::wait::expect(
        &format!("{names:?} to report Stopped"),
        STOP_TIMEOUT,
        || async {
            let allocs = lab.allocations(job).await;
            let phases: Vec<(String, String)> = allocs
                .iter()
                .filter(|a| names.contains(&name_of(a)))
                .map(|a| {
                    (
                        name_of(a).to_string(),
                        a["status"]["phase"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            if phases.len() == names.len() && phases.iter().all(|(_, p)| p == "Stopped") {
                Ok(())
            } else {
                Err(format!("{phases:?}"))
            }
        },
    )
    .await;
}

/// What a rank wrote to its stdout (its allocation directory's `logs/stdout.log`).
fn stdout_of(rank: &RankSeen) -> String {
    std::fs::read_to_string(rank.dir.join("logs").join("stdout.log")).unwrap_or_default()
}

/// The value a rank printed as a word `KEY=value` (the first such word; empty when it printed
/// `KEY=` alone).
fn printed<'a>(output: &'a str, key: &str) -> Option<&'a str> {
    output
        .lines()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix(key)))
}

/// The nodes of a job's placement.
fn placement_nodes(status: &Value) -> Vec<String> {
    status["placement"]
        .as_array()
        .unwrap_or_else(|| panic!("no placement in {status:#}"))
        .iter()
        .map(|p| str_of(&p["node"], "placement.node").to_string())
        .collect()
}

/// Queue `queue`'s BORROWED column in `tbctl top queues`, once `check` accepts it.
async fn borrowed_by(lab: &Lab, queue: &str, check: impl Fn(&str) -> bool) -> String {
    let check = &check;
    tb_tests::wait::expect(
        &format!("`tbctl top queues` to show what {queue} borrows as wanted"),
        JOB_TIMEOUT,
        || async move {
            let top = lab.tbctl_ok(&["top", "queues"]).await;
            let mut lines = top.stdout.lines();
            let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
            let col = header
                .iter()
                .position(|h| *h == "BORROWED")
                .unwrap_or_else(|| panic!("no BORROWED column in `tbctl top queues`:\n{top}"));
            let row: Vec<&str> = lines
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|cells| cells.first() == Some(&queue))
                .unwrap_or_else(|| panic!("no row for {queue} in `tbctl top queues`:\n{top}"));
            let borrowed = row.get(col).copied().unwrap_or("").to_string();
            if check(&borrowed) {
                Ok(borrowed)
            } else {
                Err(format!("BORROWED {borrowed:?} in\n{}", top.stdout))
            }
        },
    )
    .await
}

/// When an allocation was created (its gang placed), ms since the epoch.
fn placed_at(alloc: &Value) -> i64 {
    stamp_millis(str_of(
        &alloc["metadata"]["creationTimestamp"],
        "creationTimestamp",
    ))
    .unwrap_or_else(|| panic!("creationTimestamp is not a time: {alloc:#}"))
}

/// When an allocation's process ended, ms since the epoch.
fn finished_at(alloc: &Value) -> i64 {
    stamp_millis(str_of(&alloc["status"]["finishedAt"], "status.finishedAt"))
        .unwrap_or_else(|| panic!("status.finishedAt is not a time: {alloc:#}"))
}

fn touch(path: &Path) {
    std::fs::write(path, b"go\n").unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
}

/// Apply a one-rank job of `memory_mi` MiB in `queue` that prints `NAME running`, holds until
/// the test creates its release file (returned), then prints `NAME done`.
async fn apply_held_job(lab: &Lab, name: &str, queue: &str, memory_mi: u64) -> PathBuf {
    let release = lab.dir().join(format!("release-{name}"));
    let release_s = release.display().to_string();
    lab.apply_yaml(&job_yaml(
        name,
        queue,
        1,
        memory_mi,
        &[("RELEASE", &release_s)],
        "",
        &format!("echo {name} running\n{HOLD}\necho {name} done"),
    ))
    .await;
    release
}

/// Wait until `job` waits with `reason`; its status and message.
async fn wait_reason(lab: &Lab, job: &str, reason: &str) -> (Value, String) {
    let status = lab
        .wait_job(job, &format!("reason {reason}"), JOB_TIMEOUT, |s| {
            s["reason"] == reason
        })
        .await;
    step!("{job}: {reason}: {status}");
    assert_eq!(status["phase"], "Pending", "{status:#}");
    let message = str_of(&status["message"], "status.message").to_string();
    (status, message)
}

/// A queue with a memory quota of 192 MiB: job A (128 MiB) is admitted and runs; job B
/// (128 MiB), which would bring the queue to 256 MiB, stays Pending with reason QuotaExceeded
/// and a message naming the queue, what is in use, the quota, what B needs and how far over it
/// would go — though both Macs have room for it. Once A ends, B is admitted and runs.
#[tokio::test]
async fn a_queue_quota_holds_a_job_until_the_queues_work_ends() {
    let started = Instant::now();
    let lab = Lab::start_with("queues-quota", LabOptions::new(NODELETS)).await;
    let (min, _) = allocatable(&lab).await;
    assert!(
        min >= 4 * 128 * MI,
        "each Mac must have room for both 128Mi jobs at once, so that only the quota holds B \
         back: allocatable {min} bytes"
    );
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-quota
spec:
  quota:
    memory: 192Mi
",
    )
    .await;
    let release = lab.dir().join("release-a");
    let release_s = release.display().to_string();
    lab.apply_yaml(&job_yaml(
        "quota-a",
        "qlab-quota",
        1,
        128,
        &[("RELEASE", &release_s)],
        "",
        &format!("echo a running\n{HOLD}\necho a done"),
    ))
    .await;
    let a = lab.wait_job_phase("quota-a", "Running", JOB_TIMEOUT).await;
    step!("quota-a runs: {a}");
    let a_ranks = running_ranks(&lab, "quota-a", 1, 1).await;

    lab.apply_yaml(&job_yaml(
        "quota-b",
        "qlab-quota",
        1,
        128,
        &[],
        "",
        "echo b ran",
    ))
    .await;
    let (_, message) = wait_reason(&lab, "quota-b", "QuotaExceeded").await;
    let message = message.as_str();
    for want in [
        "queue qlab-quota",
        "128Mi of 192Mi memory in use",
        "needs 128Mi more",
        "64Mi over",
    ] {
        assert!(
            message.contains(want),
            "the QuotaExceeded message must name the queue and the figures ({want:?}): \
             {message:?}"
        );
    }
    let wide = lab.tbctl_ok(&["get", "tj", "-o", "wide"]).await;
    let line = wide
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("quota-b"))
        .unwrap_or_else(|| panic!("no quota-b in `tbctl get tj -o wide`:\n{wide}"));
    for want in ["Pending (QuotaExceeded)", "qlab-quota", message] {
        assert!(
            line.contains(want),
            "`tbctl get tj -o wide` must show {want:?} for quota-b: {line:?}\n{wide}"
        );
    }
    // Held by the quota alone: the Macs have room, yet nothing of B was placed while A runs.
    assert!(
        lab.allocations("quota-b").await.is_empty(),
        "quota-b must not be placed while quota-a holds the queue"
    );
    assert!(
        process_alive(a_ranks[0].pid),
        "quota-a still runs while quota-b waits"
    );

    step!("releasing quota-a");
    touch(&release);
    let a = lab
        .wait_job_phase("quota-a", "Succeeded", JOB_TIMEOUT)
        .await;
    let b = lab
        .wait_job_phase("quota-b", "Succeeded", JOB_TIMEOUT)
        .await;
    step!("quota-a: {a}\nquota-b: {b}");
    assert_eq!(b["restarts"], 0, "{b:#}");
    // B was placed only after A's process had ended.
    let a_alloc = &lab.allocations("quota-a").await[0];
    let b_alloc = &lab.allocations("quota-b").await[0];
    let a_finished = finished_at(a_alloc);
    let b_created = placed_at(b_alloc);
    assert!(
        b_created >= a_finished,
        "quota-b was placed at {b_created} ms, before quota-a ended at {a_finished} ms"
    );
    let logs = lab.tbctl_ok(&["logs", "quota-b"]).await;
    assert!(logs.stdout.contains("b ran"), "{logs}");
    step!("done in {:.1}s", started.elapsed().as_secs_f64());
}

/// The low-priority job: each rank prints its TB_RESUME_FROM, joins a gang barrier (a marker
/// per rank in the checkpoint directory, hidden so that it is no checkpoint), writes a
/// checkpoint `step-<epoch>-rank<rank>` (written under a hidden name, then renamed), and then
/// trains "forever" in its first run, or ends when it resumed from a checkpoint. The barrier
/// makes every rank of an epoch start before any rank of it writes a checkpoint, so each rank's
/// TB_RESUME_FROM names an earlier epoch's checkpoint, whatever the order the ranks start in.
/// Asked to stop (SIGTERM), a rank takes `STOPPING_SECONDS` to wind down (well within the
/// 10 s grace period), so that the preemptor can be seen to wait for the ranks to end.
const TRAINER: &str = r#"
echo "epoch=$TB_EPOCH rank=$TB_RANK TB_CHECKPOINT_DIR=$TB_CHECKPOINT_DIR TB_RESUME_FROM=$TB_RESUME_FROM"
trap 'echo "stopping"; sleep 2; echo "stopped"; exit 0' TERM
d="$TB_CHECKPOINT_DIR"
mkdir -p "$d"
touch "$d/.started-$TB_EPOCH-$TB_RANK"
i=0
while [ ! -e "$d/.started-$TB_EPOCH-0" ] || [ ! -e "$d/.started-$TB_EPOCH-1" ]; do
  i=$((i+1)); if [ $i -gt 600 ]; then echo "the gang never met"; exit 3; fi; sleep 0.1
done
echo "checkpoint of epoch $TB_EPOCH" > "$d/.partial-$TB_RANK"
mv "$d/.partial-$TB_RANK" "$d/step-$TB_EPOCH-rank$TB_RANK"
echo "checkpointed $d/step-$TB_EPOCH-rank$TB_RANK"
if [ -n "$TB_RESUME_FROM" ]; then echo "resumed; done"; exit 0; fi
sleep 120 &
wait $!
"#;
/// How long a TRAINER rank takes to wind down once asked to stop (its trap's `sleep`).
const STOPPING_SECONDS: i64 = 2;

/// A 2-rank TrainingJob of a priority-0 queue fills both Macs (one big rank each) and writes a
/// checkpoint. A 1-rank job of a priority-10 queue, which fits nowhere, preempts it: both ranks
/// are stopped (their processes gone, their allocations Stopped), the gang goes back to
/// Pending with reason Preempted without using a retry, and the urgent job runs. When the
/// urgent job has ended the gang is placed again (epoch 2), and each of its ranks starts with
/// TB_RESUME_FROM pointing at a checkpoint epoch 1 wrote (epoch 1's ranks had none).
#[tokio::test]
async fn priority_preemption_stops_a_whole_gang_which_resumes_from_its_checkpoint() {
    let started = Instant::now();
    let lab = Lab::start_with("queues-preempt", LabOptions::new(NODELETS)).await;
    let big = big_rank_mi(&lab).await;
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-batch
spec:
  priority: 0
---
apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-urgent
spec:
  priority: 10
",
    )
    .await;
    let ckpt = lab.dir().join("checkpoints");
    std::fs::create_dir_all(&ckpt).expect("checkpoint dir");
    let ckpt_s = ckpt.display().to_string();
    lab.apply_yaml(&job_yaml(
        "train",
        "qlab-batch",
        2,
        big,
        &[],
        &format!("  checkpoints:\n    dir: \"{ckpt_s}\"\n"),
        TRAINER,
    ))
    .await;
    let status = lab.wait_job_phase("train", "Running", JOB_TIMEOUT).await;
    let mut nodes = placement_nodes(&status);
    nodes.sort();
    assert_eq!(
        nodes,
        ["node-1", "node-2"],
        "one big rank per Mac: {status:#}"
    );
    let epoch1 = running_ranks(&lab, "train", 1, 2).await;
    // Both ranks met and checkpointed.
    for rank in 0..2 {
        let file = ckpt.join(format!("step-1-rank{rank}"));
        tb_tests::wait::expect(
            &format!("{} to be written", file.display()),
            JOB_TIMEOUT,
            || async {
                if file.exists() {
                    Ok(())
                } else {
                    Err(format!(
                        "rank outputs: {:?}",
                        epoch1.iter().map(stdout_of).collect::<Vec<_>>()
                    ))
                }
            },
        )
        .await;
    }
    for r in &epoch1 {
        let out = stdout_of(r);
        assert_eq!(
            printed(&out, "TB_CHECKPOINT_DIR="),
            Some(ckpt_s.as_str()),
            "{}: {out}",
            r.allocation
        );
        assert_eq!(
            printed(&out, "TB_RESUME_FROM="),
            Some(""),
            "a first run has nothing to resume from: {} printed {out:?}",
            r.allocation
        );
    }
    step!("train epoch 1 runs and checkpointed: {epoch1:?}");

    let release = apply_held_job(&lab, "urgent", "qlab-urgent", big).await;

    let (_, message) = wait_reason(&lab, "train", "Preempted").await;
    assert!(
        message.contains("TrainingJob/urgent") && message.contains("priority 10 over 0"),
        "the message names the preemptor and both priorities: {message:?}"
    );
    // The whole gang is stopped, not just the rank whose Mac the urgent job needs.
    wait_ranks_stopped(&lab, "train", &epoch1).await;
    let urgent = lab.wait_job_phase("urgent", "Running", JOB_TIMEOUT).await;
    step!("urgent runs: {urgent}");
    let urgent_ranks = running_ranks(&lab, "urgent", 1, 1).await;
    // Both ranks were asked to stop (SIGTERM) and wound down within the grace period; the
    // urgent job was placed only once the preempted rank on its Mac had ended (it took
    // STOPPING_SECONDS after SIGTERM): that Mac's memory was never promised twice.
    let train_allocs = lab.allocations("train").await;
    let urgent_alloc = &lab.allocations("urgent").await[0];
    let urgent_node = str_of(&urgent_alloc["spec"]["node"], "spec.node");
    let urgent_placed = placed_at(urgent_alloc);
    for r in &epoch1 {
        let out = stdout_of(r);
        assert!(
            out.contains("stopping") && out.contains("stopped"),
            "{} was asked to stop (SIGTERM) and wound down: {out:?}",
            r.allocation
        );
        if r.node != urgent_node {
            continue;
        }
        let a = train_allocs
            .iter()
            .find(|a| name_of(a) == r.allocation)
            .unwrap_or_else(|| panic!("{} is gone: {train_allocs:#?}", r.allocation));
        let finished = finished_at(a);
        assert!(
            urgent_placed >= finished,
            "urgent was placed on {urgent_node} at {urgent_placed} ms, before {} there ended \
             at {finished} ms ({} ms early; the rank takes {STOPPING_SECONDS} s to stop)",
            r.allocation,
            finished - urgent_placed
        );
    }
    // While they wound down, the urgent job said what it waited for.
    let waited: Vec<String> = lab
        .events("urgent")
        .await
        .iter()
        .filter(|e| e["spec"]["reason"] == "FailedScheduling")
        .map(|e| e["spec"]["message"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        waited
            .iter()
            .any(|m| m.contains("stopping lower-priority TrainingJob/train")),
        "urgent records that it waits for train to be stopped: {waited:?}"
    );
    let train = lab.job_status("train").await;
    assert_eq!(train["phase"], "Pending", "{train:#}");
    assert_eq!(
        train["reason"], "Preempted",
        "a preempted gang keeps saying so until it is placed again: {train:#}"
    );
    assert_eq!(train["restarts"], 0, "preemption uses no retry: {train:#}");
    assert_eq!(train["epoch"], 1, "not placed again yet: {train:#}");
    assert!(
        lab.event_reasons("train")
            .await
            .contains(&"Preempted".to_string()),
        "a Preempted event is recorded for train"
    );
    let epoch1_out: Vec<String> = epoch1.iter().map(stdout_of).collect();

    step!("releasing urgent");
    touch(&release);
    let urgent = lab.wait_job_phase("urgent", "Succeeded", JOB_TIMEOUT).await;
    step!("urgent succeeded: {urgent}");
    wait_process_gone(urgent_ranks[0].pid, "the urgent job's rank", STOP_TIMEOUT).await;

    let done = lab.wait_job_phase("train", "Succeeded", JOB_TIMEOUT).await;
    step!("train succeeded: {done}");
    assert_eq!(
        done["epoch"], 2,
        "placed once more after preemption: {done:#}"
    );
    assert_eq!(done["restarts"], 0, "preemption uses no retry: {done:#}");
    let allocs = lab.allocations("train").await;
    let epoch2: Vec<&Value> = allocs.iter().filter(|a| a["spec"]["epoch"] == 2).collect();
    assert_eq!(epoch2.len(), 2, "{allocs:#?}");
    for a in &epoch2 {
        let node = str_of(&a["spec"]["node"], "spec.node");
        let rank = RankSeen {
            allocation: name_of(a).to_string(),
            node: node.to_string(),
            pid: 0,
            dir: lab
                .nodelet(lab.index_of(node))
                .alloc_dir("default", name_of(a)),
        };
        let out = stdout_of(&rank);
        let resume = printed(&out, "TB_RESUME_FROM=").unwrap_or_else(|| {
            panic!(
                "{} printed no TB_RESUME_FROM: {out:?} (epoch 1 printed {epoch1_out:?})",
                rank.allocation
            )
        });
        let prefix = format!("{ckpt_s}/step-1-rank");
        assert!(
            resume.starts_with(&prefix) && Path::new(resume).is_file(),
            "{} (epoch 2) must resume from a checkpoint epoch 1 wrote ({prefix}N), got \
             TB_RESUME_FROM={resume:?}; output {out:?}",
            rank.allocation
        );
        assert!(
            out.contains("resumed; done"),
            "{}: {out:?}",
            rank.allocation
        );
    }
    let logs = lab.tbctl_ok(&["logs", "train"]).await;
    step!("tbctl logs train:\n{}", logs.stdout);
    assert!(
        logs.stdout
            .contains(&format!("TB_RESUME_FROM={ckpt_s}/step-1-rank")),
        "`tbctl logs train` shows epoch 2 resuming: {logs}"
    );
    step!("done in {:.1}s", started.elapsed().as_secs_f64());
}

/// Queue X (quota one big rank, may borrow one more) runs a 2-rank gang of big ranks: it
/// borrows the idle second Mac (`tbctl top queues` shows it). Queue Y (same priority, quota two
/// big ranks) submits a 1-rank job that fits nowhere: Y is under its quota, so it reclaims what
/// X borrowed: X's whole gang is stopped (Pending, reason Reclaimed, no retry used; X borrows
/// nothing any more) and Y's job runs. X's gang runs again once Y's job has ended.
#[tokio::test]
async fn a_queue_under_its_quota_reclaims_capacity_another_queue_borrowed() {
    let started = Instant::now();
    let lab = Lab::start_with("queues-reclaim", LabOptions::new(NODELETS)).await;
    let big = big_rank_mi(&lab).await;
    lab.apply_yaml(&format!(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-x
spec:
  quota:
    memory: {big}Mi
  borrowingLimit:
    memory: {big}Mi
---
apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-y
spec:
  quota:
    memory: {two}Mi
",
        two = 2 * big
    ))
    .await;
    lab.apply_yaml(&job_yaml(
        "borrower",
        "qlab-x",
        2,
        big,
        &[],
        "",
        "echo borrower epoch=$TB_EPOCH rank=$TB_RANK\nif [ \"$TB_EPOCH\" = 1 ]; then exec sleep 120; fi",
    ))
    .await;
    let status = lab.wait_job_phase("borrower", "Running", JOB_TIMEOUT).await;
    step!("borrower runs beyond qlab-x's quota: {status}");
    let epoch1 = running_ranks(&lab, "borrower", 1, 2).await;
    // qlab-x holds two big ranks against a quota of one: it borrows (BORROWED is not `-`).
    let borrowed = borrowed_by(&lab, "qlab-x", |b| b != "-").await;
    step!("qlab-x borrows {borrowed}");

    let release = apply_held_job(&lab, "owner", "qlab-y", big).await;
    let (_, message) = wait_reason(&lab, "borrower", "Reclaimed").await;
    assert!(
        message.contains("queue qlab-y reclaimed") && message.contains("TrainingJob/owner"),
        "the message names the reclaiming queue and job: {message:?}"
    );
    wait_ranks_stopped(&lab, "borrower", &epoch1).await;
    let owner = lab.wait_job_phase("owner", "Running", JOB_TIMEOUT).await;
    step!("owner runs: {owner}");
    // Placed only once the reclaimed rank on its Mac had ended.
    let owner_alloc = &lab.allocations("owner").await[0];
    let owner_node = str_of(&owner_alloc["spec"]["node"], "spec.node");
    let owner_placed = placed_at(owner_alloc);
    for a in lab.allocations("borrower").await {
        if a["spec"]["node"] == owner_node {
            assert!(
                owner_placed >= finished_at(&a),
                "owner was placed on {owner_node} at {owner_placed} ms, before {} there \
                 ended: {a:#}",
                name_of(&a)
            );
        }
    }
    borrowed_by(&lab, "qlab-x", |b| b == "-").await;
    let b = lab.job_status("borrower").await;
    assert_eq!(b["phase"], "Pending", "{b:#}");
    assert_eq!(b["reason"], "Reclaimed", "{b:#}");
    assert_eq!(b["restarts"], 0, "reclaim uses no retry: {b:#}");
    assert!(
        lab.event_reasons("borrower")
            .await
            .contains(&"Reclaimed".to_string()),
        "a Reclaimed event is recorded for borrower"
    );

    step!("releasing owner");
    touch(&release);
    lab.wait_job_phase("owner", "Succeeded", JOB_TIMEOUT).await;
    let done = lab
        .wait_job_phase("borrower", "Succeeded", JOB_TIMEOUT)
        .await;
    assert_eq!(done["epoch"], 2, "placed once more after reclaim: {done:#}");
    assert_eq!(done["restarts"], 0, "{done:#}");
    step!("done in {:.1}s", started.elapsed().as_secs_f64());
}

/// A high-priority job that its own queue's quota holds back (it could never be admitted: it
/// asks for more than the queue's whole quota) must not preempt anything: preempting work for a
/// job that will not be admitted once there is room only stops that work for nothing. The
/// low-priority gang keeps running in its first epoch; the urgent job waits with QuotaExceeded.
#[tokio::test]
async fn a_job_its_queue_quota_holds_back_preempts_nothing() {
    let lab = Lab::start_with("queues-quota-preempt", LabOptions::new(NODELETS)).await;
    let big = big_rank_mi(&lab).await;
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-batch
spec:
  priority: 0
---
apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-capped
spec:
  priority: 10
  quota:
    memory: 1Gi
",
    )
    .await;
    lab.apply_yaml(&job_yaml(
        "low",
        "qlab-batch",
        2,
        big,
        &[],
        "",
        "echo epoch=$TB_EPOCH\nexec sleep 120",
    ))
    .await;
    lab.wait_job_phase("low", "Running", JOB_TIMEOUT).await;
    let epoch1 = running_ranks(&lab, "low", 1, 2).await;

    lab.apply_yaml(&job_yaml(
        "capped",
        "qlab-capped",
        1,
        big,
        &[],
        "",
        "echo capped ran",
    ))
    .await;
    let capped = lab
        .wait_job("capped", "reason QuotaExceeded", JOB_TIMEOUT, |s| {
            s["reason"] == "QuotaExceeded"
        })
        .await;
    step!("capped held: {capped}");
    // A few more scheduling passes (the controller runs several a second): nothing of the low
    // gang may be stopped in them either. This window bounds an observation, not a speed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let low = lab.job_status("low").await;
    step!("low: {low}");
    let reasons = lab.event_reasons("low").await;
    assert!(
        low["epoch"] == 1 && low["phase"] == "Running",
        "the low gang must keep running in epoch 1 while capped cannot be admitted; it is \
         {} in epoch {} ({} events: {:?}…): {low:#}",
        low["phase"],
        low["epoch"],
        reasons.len(),
        &reasons[..reasons.len().min(8)]
    );
    assert!(
        !reasons.iter().any(|r| r == "Preempted"),
        "low was preempted for a job its queue's quota holds back: {reasons:?}"
    );
    for r in &epoch1 {
        assert!(
            process_alive(r.pid),
            "{} (pid {}) was stopped for a job its queue's quota holds back",
            r.allocation,
            r.pid
        );
    }
    let capped = lab.job_status("capped").await;
    assert_eq!(capped["reason"], "QuotaExceeded", "{capped:#}");
}

/// A queue whose quota is one Mac (`macs: 1`, "a Mac counts once however many ranks it runs")
/// that runs a small job on one Mac can run a second small job on that same Mac, which has
/// plenty of memory left: the quota limits the Macs used, and using the Mac the queue already
/// holds adds none.
#[tokio::test]
async fn a_mac_quota_lets_more_work_share_the_mac_the_queue_holds() {
    let lab = Lab::start_with("queues-mac-quota", LabOptions::new(NODELETS)).await;
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-one-mac
spec:
  quota:
    macs: 1
",
    )
    .await;
    let release = lab.dir().join("release-first");
    let release_s = release.display().to_string();
    lab.apply_yaml(&job_yaml(
        "first",
        "qlab-one-mac",
        1,
        64,
        &[("RELEASE", &release_s)],
        "",
        HOLD,
    ))
    .await;
    let first = lab.wait_job_phase("first", "Running", JOB_TIMEOUT).await;
    let first_node = placement_nodes(&first)[0].clone();
    lab.apply_yaml(&job_yaml(
        "second",
        "qlab-one-mac",
        1,
        64,
        &[],
        "",
        "echo second ran",
    ))
    .await;
    let second = lab
        .wait_job("second", "phase Succeeded", JOB_TIMEOUT, |s| {
            s["phase"] == "Succeeded"
        })
        .await;
    assert_eq!(
        placement_nodes(&second),
        std::slice::from_ref(&first_node),
        "second shares {first_node}, the one Mac its queue may use: {second:#}"
    );
    touch(&release);
    lab.wait_job_phase("first", "Succeeded", JOB_TIMEOUT).await;
}

/// A quota lowered below what the queue's running work holds is accepted as written: the
/// running job keeps running (only preemption stops work), new work of the queue waits, and
/// the queue gets a QuotaBelowUsage Warning event and condition naming both figures.
#[tokio::test]
async fn a_quota_lowered_below_usage_warns_and_stops_nothing() {
    let lab = Lab::start_with("queues-lowered", LabOptions::new(NODELETS)).await;
    let queue = |memory: &str| {
        format!(
            "apiVersion: tb/v1
kind: Queue
metadata:
  name: qlab-lowered
spec:
  quota:
    memory: {memory}
"
        )
    };
    lab.apply_yaml(&queue("512Mi")).await;
    let release = apply_held_job(&lab, "held", "qlab-lowered", 256).await;
    lab.wait_job_phase("held", "Running", JOB_TIMEOUT).await;
    let ranks = running_ranks(&lab, "held", 1, 1).await;

    step!("lowering the quota to 64Mi, below the 256Mi held");
    let applied = lab.apply_yaml(&queue("64Mi")).await;
    step!("{applied}");
    assert!(
        applied.stderr.contains(
            "Warning: queue qlab-lowered: memory quota 64Mi is below the 256Mi its running work holds"
        ),
        "`tbctl apply` warns that the quota is below usage:\n{applied}"
    );
    let warning = tb_tests::wait::expect(
        "a QuotaBelowUsage event for the queue",
        JOB_TIMEOUT,
        || async {
            let out = lab
                .tbctl(&["events", "--for", "queue/qlab-lowered", "-o", "json"])
                .await;
            let items = out.json()["items"].as_array().cloned().unwrap_or_default();
            items
                .into_iter()
                .find(|e| e["spec"]["reason"] == "QuotaBelowUsage")
                .ok_or_else(|| format!("no QuotaBelowUsage event yet: {out}"))
        },
    )
    .await;
    assert_eq!(warning["spec"]["type"], "Warning", "{warning:#}");
    let message = str_of(&warning["spec"]["message"], "event message");
    assert!(
        message.contains("memory quota 64Mi is below the 256Mi its running work holds"),
        "{message:?}"
    );
    let described = lab.tbctl_ok(&["describe", "queue", "qlab-lowered"]).await;
    assert!(
        described.stdout.contains("QuotaBelowUsage"),
        "`tbctl describe queue` shows the condition and event:\n{described}"
    );
    // Nothing running was stopped; new work of the queue waits on the quota.
    lab.apply_yaml(&job_yaml(
        "small",
        "qlab-lowered",
        1,
        32,
        &[],
        "",
        "echo small ran",
    ))
    .await;
    wait_reason(&lab, "small", "QuotaExceeded").await;
    assert!(process_alive(ranks[0].pid), "the running rank was stopped");
    let held = lab.job_status("held").await;
    assert_eq!(held["phase"], "Running", "{held:#}");
    assert_eq!(held["epoch"], 1, "{held:#}");

    touch(&release);
    lab.wait_job_phase("held", "Succeeded", JOB_TIMEOUT).await;
    lab.wait_job_phase("small", "Succeeded", JOB_TIMEOUT).await;
}
