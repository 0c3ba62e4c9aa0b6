//! TrainingJobs end to end: a real controller (short timings: node grace 3 s, backoff base
//! 0.5 s) and real nodelets on loopback run exec jobs, and the tests check what a user of tb
//! relies on: each rank's environment, working directory and MLX hostfile; logs, after the fact
//! and followed live; gang restarts with backoff up to `backoffLimit`; a Mac lost (SIGKILL) or
//! hung (SIGSTOP) and its job moved to the other Macs without using a retry, the stale rank
//! killed when its nodelet comes back and never started again; errors a user can act on (a
//! missing command, a job too big for every Mac, an unknown node); and the memory guard that
//! keeps two jobs from overcommitting one Mac.
//!
//! Every test starts its own lab (see `tb_tests::lab`): its own ports, directories and logs.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_tests::lab::{
    Lab, LabOptions, NODE_GRACE, NODELET_HEARTBEAT_MS, condition, process_alive, processes_of,
    rank_lines, stamp_millis, wait_process_gone,
};
use tb_tests::step;

/// Generous bound for a short job to finish on a loaded 2-core machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a Node may take to be declared NotReady after its nodelet goes silent.
const LOSS_TIMEOUT: Duration = Duration::from_secs(15);

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

fn u64_of(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// The nodes of a job's placement, by rank.
fn placement_nodes(status: &Value) -> Vec<String> {
    let mut placement: Vec<&Value> = status["placement"]
        .as_array()
        .unwrap_or_else(|| panic!("no placement in {status:#}"))
        .iter()
        .collect();
    placement.sort_by_key(|p| p["rank"].as_u64());
    placement
        .iter()
        .map(|p| str_of(&p["node"], "placement.node").to_string())
        .collect()
}

/// The allocation of `rank` in `epoch` among `allocs`.
fn alloc_of(allocs: &[Value], epoch: u64, rank: u64) -> Option<&Value> {
    allocs
        .iter()
        .find(|a| a["spec"]["epoch"] == epoch && a["spec"]["rank"] == rank)
}

fn name_of(obj: &Value) -> &str {
    str_of(&obj["metadata"]["name"], "metadata.name")
}

/// A 3-rank job on 3 Macs: every rank gets its own TB_*/MLX_* environment, the working
/// directory under its nodelet's data directory, and the same ring hostfile whose entry `i` is a
/// port from the range of the Mac running rank `i`. Logs are there after the job ended, per
/// rank and merged with `[rank N] ` prefixes; `tbctl logs -f` streams a running job's lines as
/// they are written and returns once the job has ended.
#[tokio::test]
async fn ranks_get_their_environment_hostfile_and_logs() {
    let lab = Lab::start("jobs-env", 3).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: echo
spec:
  ranks: 3
  memory: 64Mi
  backoffLimit: 0
  command:
    - sh
    - -c
    - |
      echo rank=$TB_RANK world=$TB_WORLD_SIZE job=$TB_JOB mlx=$MLX_RANK epoch=$TB_EPOCH
      printf 'hostfile=%s\n' "$(cat "$MLX_HOSTFILE")"
      echo "cwd=$(pwd)"
      echo "allocdir=$TB_ALLOCATION_DIR"
"#,
    )
    .await;
    let status = lab.wait_job_phase("echo", "Succeeded", JOB_TIMEOUT).await;
    step!("echo succeeded: {status}");
    assert_eq!(status["epoch"], 1, "{status:#}");
    assert_eq!(status["restarts"], 0, "{status:#}");
    assert_eq!(condition(&status, "Complete"), Some("True"), "{status:#}");
    let nodes = placement_nodes(&status);
    assert_eq!(nodes.len(), 3, "{status:#}");
    let distinct: BTreeSet<&String> = nodes.iter().collect();
    assert_eq!(
        distinct.len(),
        3,
        "3 ranks on 3 empty Macs spread one per Mac: {nodes:?}"
    );

    let allocs = lab.allocations("echo").await;
    assert_eq!(allocs.len(), 3, "{allocs:#?}");
    let hosts = allocs[0]["spec"]["mlx"]["hosts"].clone();
    for a in &allocs {
        assert_eq!(a["status"]["phase"], "Succeeded", "{a:#}");
        assert_eq!(a["status"]["exitCode"], 0, "{a:#}");
        assert_eq!(
            a["spec"]["mlx"]["hosts"], hosts,
            "every rank shares one ring: {a:#}"
        );
    }

    // The ring every rank was handed: rank i listens on a port of the Mac running rank i.
    let expected_ring: Vec<Vec<String>> = (0..3)
        .map(|rank| {
            let node = lab.nodelet(lab.index_of(&nodes[rank]));
            let entry = str_of(&hosts[rank], "mlx.hosts[i]");
            let (ip, port) = entry.rsplit_once(':').expect("ip:port");
            assert_eq!(ip, "127.0.0.1", "{entry}");
            let port: u16 = port.parse().expect("port");
            assert!(
                (node.ports.0..=node.ports.1).contains(&port),
                "rank {rank} on {} got port {port}, outside its range {:?}",
                node.name,
                node.ports
            );
            vec![entry.to_string()]
        })
        .collect();
    let ports: BTreeSet<&String> = expected_ring.iter().flatten().collect();
    assert_eq!(ports.len(), 3, "distinct addresses: {expected_ring:?}");

    // Logs, read after the job has ended, one rank at a time.
    let mut per_rank = Vec::new();
    for rank in 0..3u64 {
        let out = lab
            .tbctl_ok(&["logs", "echo", "--rank", &rank.to_string()])
            .await;
        let lines: Vec<String> = out.stdout.lines().map(str::to_string).collect();
        let node = lab.nodelet(lab.index_of(&nodes[rank as usize]));
        let alloc = name_of(&allocs[rank as usize]);
        let alloc_dir = node.alloc_dir("default", alloc);
        assert_eq!(
            lines,
            vec![
                format!("rank={rank} world=3 job=echo mlx={rank} epoch=1"),
                format!(
                    "hostfile={}",
                    serde_json::to_string(&expected_ring).expect("json")
                ),
                format!("cwd={}", alloc_dir.join("work").display()),
                format!("allocdir={}", alloc_dir.display()),
            ],
            "rank {rank}'s output: {out}"
        );
        // The file the rank read is the one the nodelet wrote, and it parses as MLX's ring.
        let file = std::fs::read_to_string(alloc_dir.join("hostfile.json")).expect("hostfile.json");
        let ring: Vec<Vec<String>> = serde_json::from_str(&file).expect("a JSON ring hostfile");
        assert_eq!(ring, expected_ring);
        per_rank.push(lines);
    }
    // All ranks at once: each line prefixed with its rank, each rank's lines in order.
    let all = lab.tbctl_ok(&["logs", "echo"]).await;
    for (rank, lines) in per_rank.iter().enumerate() {
        assert_eq!(&rank_lines(&all.stdout, rank as u64), lines, "{all}");
    }
    assert_eq!(all.stdout.lines().count(), 12, "{all}");
    let tail = lab
        .tbctl_ok(&["logs", "echo", "--rank", "2", "--tail", "1"])
        .await;
    assert_eq!(
        tail.stdout.lines().collect::<Vec<_>>(),
        [per_rank[2][3].as_str()],
        "{tail}"
    );

    // Following a running job: 15 lines per rank, one every 200 ms.
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: ticker
spec:
  ranks: 2
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "i=1; while [ $i -le 15 ]; do echo tick $i; i=$((i+1)); sleep 0.2; done"]
"#,
    )
    .await;
    // Logs need the ranks started (their log files exist once they run).
    lab.wait_job_phase("ticker", "Running", JOB_TIMEOUT).await;
    let started = Instant::now();
    let mut follow = lab
        .tbctl_command(&["logs", "ticker", "-f"])
        .spawn()
        .expect("tbctl logs -f");
    let stdout = follow.stdout.take().expect("stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut received: Vec<String> = Vec::new();
    let mut phase_at_first_line = None;
    let deadline = tokio::time::Instant::now() + JOB_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                if phase_at_first_line.is_none() {
                    let s = lab.job_status("ticker").await;
                    step!(
                        "first followed line after {:?}: {line:?}, job {}",
                        started.elapsed(),
                        s["phase"]
                    );
                    phase_at_first_line = Some(s["phase"].as_str().unwrap_or("").to_string());
                }
                received.push(line);
            }
            Ok(Ok(None)) => break,
            Ok(Err(e)) => panic!("reading tbctl logs -f: {e}"),
            Err(_) => {
                panic!("tbctl logs -f still streaming after {JOB_TIMEOUT:?}; got {received:?}")
            }
        }
    }
    let exit = tokio::time::timeout(Duration::from_secs(10), follow.wait())
        .await
        .expect("tbctl logs -f exits once its stream ends")
        .expect("wait");
    step!("tbctl logs -f ended after {:?} ({exit})", started.elapsed());
    assert!(exit.success(), "tbctl logs -f exited {exit}");
    assert!(
        matches!(
            phase_at_first_line.as_deref(),
            Some("Running" | "Scheduled")
        ),
        "the first line must arrive while the job runs, not after: phase was {phase_at_first_line:?}"
    );
    let text = received.join("\n");
    let ticks: Vec<String> = (1..=15).map(|i| format!("tick {i}")).collect();
    for rank in 0..2 {
        assert_eq!(
            rank_lines(&(text.clone() + "\n"), rank),
            ticks,
            "rank {rank} in:\n{text}"
        );
    }
    // -f returned because the job ended, not before: the job is (or is about to be) Succeeded.
    lab.wait_job_phase("ticker", "Succeeded", Duration::from_secs(10))
        .await;
}

/// A rank that exits 1 takes its whole gang down: the other rank is stopped, the gang is placed
/// again under a new epoch after the backoff (base 0.5 s), and once `backoffLimit` (1) restarts
/// are used up the job is Failed with reason BackoffLimitExceeded.
#[tokio::test]
async fn failing_rank_restarts_the_gang_with_backoff_until_the_limit() {
    let lab = Lab::start("jobs-backoff", 2).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: flaky
spec:
  ranks: 2
  memory: 64Mi
  backoffLimit: 1
  command: ["sh", "-c", "if [ \"$TB_RANK\" = 1 ]; then sleep 1; echo failing; exit 1; fi; exec sleep 60"]
"#,
    )
    .await;

    // Rank 0 of epoch 1 sleeps; rank 1 fails after 1 s. Catch rank 0's process while it runs.
    let rank0 = tb_tests::wait::expect("rank 0 of epoch 1 running", JOB_TIMEOUT, || async {
        let allocs = lab.allocations("flaky").await;
        match alloc_of(&allocs, 1, 0) {
            Some(a) if a["status"]["phase"] == "Running" => Ok(a.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let rank0_pid = rank0["status"]["pid"]
        .as_i64()
        .expect("a running rank has a pid");
    step!("epoch 1 rank 0 runs as pid {rank0_pid}");

    // Watch the status go through BackOff: restarts 1, a retry time 0.5 s ahead.
    let backoff = lab
        .wait_job(
            "flaky",
            "BackOff after the first failure",
            JOB_TIMEOUT,
            |s| s["reason"] == "BackOff",
        )
        .await;
    step!("backing off: {backoff}");
    assert_eq!(backoff["phase"], "Pending", "{backoff:#}");
    assert_eq!(backoff["restarts"], 1, "{backoff:#}");
    assert_eq!(backoff["epoch"], 1, "{backoff:#}");
    let message = str_of(&backoff["message"], "message");
    assert!(
        message.contains("rank 1")
            && message.contains("exited with code 1")
            && message.contains("0.5s"),
        "the message says which rank failed and when the gang restarts: {message}"
    );
    let retry_at = stamp_millis(str_of(&backoff["nextRetryTime"], "nextRetryTime"))
        .expect("nextRetryTime is an RFC 3339 time");

    // The whole gang went down: rank 0's process is stopped too.
    wait_process_gone(rank0_pid, "rank 0 of epoch 1", Duration::from_secs(15)).await;

    // Epoch 2 is placed no earlier than the retry time.
    let epoch2 = tb_tests::wait::expect("epoch 2 placed", JOB_TIMEOUT, || async {
        let allocs = lab.allocations("flaky").await;
        alloc_of(&allocs, 2, 0)
            .cloned()
            .ok_or_else(|| format!("{} allocations, none of epoch 2", allocs.len()))
    })
    .await;
    let created = stamp_millis(str_of(
        &epoch2["metadata"]["creationTimestamp"],
        "creationTimestamp",
    ))
    .expect("creationTimestamp");
    assert!(
        created >= retry_at,
        "epoch 2 created at {created} ms, before the retry time {retry_at} ms"
    );

    let failed = lab.wait_job_phase("flaky", "Failed", JOB_TIMEOUT).await;
    step!("failed: {failed}");
    assert_eq!(failed["reason"], "BackoffLimitExceeded", "{failed:#}");
    assert_eq!(failed["epoch"], 2, "one restart, so two epochs: {failed:#}");
    assert_eq!(condition(&failed, "Failed"), Some("True"), "{failed:#}");
    assert_ne!(condition(&failed, "Complete"), Some("True"), "{failed:#}");
    assert!(
        str_of(&failed["message"], "message").contains("backoffLimit 1"),
        "{failed:#}"
    );

    let reasons = lab.event_reasons("flaky").await;
    step!("events: {reasons:?}");
    let order = ["Scheduled", "BackOff", "Scheduled", "BackoffLimitExceeded"];
    let mut it = reasons.iter();
    for want in order {
        assert!(
            it.any(|r| r == want),
            "events must include {order:?} in that order: {reasons:?}"
        );
    }
    // Nothing of the job runs any more.
    for a in lab.allocations("flaky").await {
        if let Some(pid) = a["status"]["pid"].as_i64() {
            wait_process_gone(pid, name_of(&a), Duration::from_secs(15)).await;
        }
    }
    // `restarts` is "gang restarts after a failure": with backoffLimit 1 the gang was restarted
    // once (epoch 1 -> 2); the second failure ends the job and restarts nothing.
    assert_eq!(
        failed["restarts"], 1,
        "status.restarts must count the restarts that happened (epoch 2 = one restart): {failed:#}"
    );
}

/// `kill -9` of a nodelet whose Mac runs one rank of a 3-rank job: the Node goes NotReady, the
/// rank's allocation Lost (NodeLost), and the gang is placed again (epoch 2) on the two other
/// Macs without using a retry, and succeeds there. The killed nodelet's rank keeps running (it
/// is in a session of its own) until the nodelet restarts: then it is killed, and it is not
/// started again.
///
/// Epoch 1 ranks sleep 30 s so the stale rank surely outlives the restart; later epochs sleep
/// 3 s and exit 0.
#[tokio::test]
async fn lost_mac_moves_the_job_and_restart_kills_the_stale_rank() {
    let mut lab = Lab::start("jobs-kill9", 3).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: survivor
spec:
  ranks: 3
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "if [ \"$TB_EPOCH\" = 1 ]; then sleep 30; else sleep 3; fi; echo done epoch=$TB_EPOCH"]
"#,
    )
    .await;
    let status = lab.wait_job_phase("survivor", "Running", JOB_TIMEOUT).await;
    let nodes = placement_nodes(&status);
    let victim_name = nodes[1].clone();
    let victim = lab.index_of(&victim_name);
    let allocs = lab.allocations("survivor").await;
    let stale = alloc_of(&allocs, 1, 1).expect("rank 1 of epoch 1").clone();
    let stale_name = name_of(&stale).to_string();
    let stale_pid = stale["status"]["pid"]
        .as_i64()
        .expect("pid of a running rank");
    let stale_dir = lab.nodelet(victim).alloc_dir("default", &stale_name);
    assert!(process_alive(stale_pid), "rank 1 (pid {stale_pid}) runs");
    step!("rank 1 runs on {victim_name} as pid {stale_pid} ({stale_name})");

    let allocs_watch = lab.watch("allocs").await;
    lab.kill_nodelet(victim);
    let node = lab.wait_node_ready(&victim_name, false, LOSS_TIMEOUT).await;
    step!("{victim_name} NotReady: {}", node["status"]["conditions"]);
    let lost = allocs_watch
        .wait_for(&format!("{stale_name} Lost"), LOSS_TIMEOUT, |a| {
            a["metadata"]["name"] == stale_name.as_str() && a["status"]["phase"] == "Lost"
        })
        .await;
    assert_eq!(lost["status"]["reason"], "NodeLost", "{lost:#}");

    let moved = lab
        .wait_job("survivor", "epoch 2 running", JOB_TIMEOUT, |s| {
            s["epoch"] == 2 && s["phase"] == "Running"
        })
        .await;
    let new_nodes = placement_nodes(&moved);
    step!("epoch 2 on {new_nodes:?}");
    assert_eq!(new_nodes.len(), 3, "{moved:#}");
    assert!(
        !new_nodes.contains(&victim_name),
        "nothing may be placed on the lost {victim_name}: {new_nodes:?}"
    );
    assert_eq!(
        moved["restarts"], 0,
        "losing a Mac uses no retry: {moved:#}"
    );
    assert!(
        lab.event_reasons("survivor")
            .await
            .contains(&"NodeLost".to_string())
    );

    // Nobody could stop the rank on the dead nodelet's Mac: it still runs...
    assert!(
        process_alive(stale_pid),
        "the stale rank (pid {stale_pid}) should outlive its killed nodelet"
    );
    // ...until the nodelet comes back, reusing its credential, and kills it.
    lab.restart_nodelet(victim);
    wait_process_gone(
        stale_pid,
        "the stale rank after its nodelet restarted",
        Duration::from_secs(10),
    )
    .await;
    lab.wait_node_ready(&victim_name, true, LOSS_TIMEOUT).await;
    assert!(
        lab.nodelet_exit_status(victim).is_none(),
        "the restarted nodelet exited:\n{}",
        lab.nodelet_log(victim)
    );
    // Not resurrected: no process serves the old allocation, none of epoch 1 is running.
    assert_eq!(
        processes_of(&stale_dir),
        Vec::<i64>::new(),
        "processes of {stale_name}"
    );
    for a in lab.allocations("survivor").await {
        assert!(
            !(a["spec"]["epoch"] == 1 && a["status"]["phase"] == "Running"),
            "an epoch-1 allocation runs again: {a:#}"
        );
    }

    let done = lab
        .wait_job_phase("survivor", "Succeeded", JOB_TIMEOUT)
        .await;
    assert_eq!(done["epoch"], 2, "{done:#}");
    assert_eq!(done["restarts"], 0, "{done:#}");
    assert!(!placement_nodes(&done).contains(&victim_name), "{done:#}");
    let logs = lab.tbctl_ok(&["logs", "survivor"]).await;
    for rank in 0..3 {
        assert_eq!(rank_lines(&logs.stdout, rank), ["done epoch=2"], "{logs}");
    }
    // The whole run: the stale rank never reported Running again after it was lost.
    let objects = allocs_watch.objects();
    let after_lost = objects
        .iter()
        .skip_while(|a| {
            !(a["metadata"]["name"] == stale_name.as_str() && a["status"]["phase"] == "Lost")
        })
        .filter(|a| a["metadata"]["name"] == stale_name.as_str())
        .map(|a| a["status"]["phase"].as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>();
    assert!(
        !after_lost.iter().any(|p| p == "Running"),
        "{stale_name} after it was lost: {after_lost:?}"
    );
}

/// A nodelet frozen with SIGSTOP past the grace period looks dead: its rank is Lost and the job
/// moves to the other Macs. When it wakes up (SIGCONT) it learns its allocation is gone and kills
/// the stale rank within a few seconds (fencing), while the job goes on elsewhere untouched.
#[tokio::test]
async fn hung_nodelet_is_fenced_when_it_wakes_up() {
    let mut lab = Lab::start("jobs-sigstop", 3).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: fenced
spec:
  ranks: 3
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "if [ \"$TB_EPOCH\" = 1 ]; then sleep 30; else sleep 4; fi; echo done epoch=$TB_EPOCH"]
"#,
    )
    .await;
    let status = lab.wait_job_phase("fenced", "Running", JOB_TIMEOUT).await;
    let victim_name = placement_nodes(&status)[2].clone();
    let victim = lab.index_of(&victim_name);
    let allocs = lab.allocations("fenced").await;
    let stale = alloc_of(&allocs, 1, 2).expect("rank 2 of epoch 1").clone();
    let stale_pid = stale["status"]["pid"].as_i64().expect("pid");
    step!("rank 2 runs on {victim_name} as pid {stale_pid}");

    lab.stop_nodelet(victim);
    let stopped_at = Instant::now();
    lab.wait_node_ready(&victim_name, false, LOSS_TIMEOUT).await;
    let moved = lab
        .wait_job("fenced", "epoch 2 running", JOB_TIMEOUT, |s| {
            s["epoch"] == 2 && s["phase"] == "Running"
        })
        .await;
    let new_nodes = placement_nodes(&moved);
    assert!(!new_nodes.contains(&victim_name), "{new_nodes:?}");
    assert_eq!(moved["restarts"], 0, "{moved:#}");
    // Not before the grace period (counted from its last heartbeat, at most one interval
    // before the SIGSTOP) had passed.
    let heartbeat = Duration::from_millis(NODELET_HEARTBEAT_MS);
    assert!(
        stopped_at.elapsed() + heartbeat >= NODE_GRACE,
        "the node was declared lost {:?} after it stopped, within the grace period",
        stopped_at.elapsed()
    );
    // Frozen, the nodelet cannot stop its rank: it still runs, next to the new gang.
    assert!(
        process_alive(stale_pid),
        "the stale rank (pid {stale_pid}) is still running"
    );
    let epoch2_pids = |allocs: &[Value]| -> Vec<(String, Option<i64>)> {
        allocs
            .iter()
            .filter(|a| a["spec"]["epoch"] == 2)
            .map(|a| (name_of(a).to_string(), a["status"]["pid"].as_i64()))
            .collect()
    };
    let before = epoch2_pids(&lab.allocations("fenced").await);

    lab.cont_nodelet(victim);
    let woke = Instant::now();
    wait_process_gone(stale_pid, "the fenced stale rank", Duration::from_secs(5)).await;
    step!("stale rank fenced {:?} after SIGCONT", woke.elapsed());
    lab.wait_node_ready(&victim_name, true, LOSS_TIMEOUT).await;

    // The job went on where it was: same epoch, no retry, and it succeeds.
    let s = lab.job_status("fenced").await;
    assert_eq!(s["epoch"], 2, "{s:#}");
    let done = lab.wait_job_phase("fenced", "Succeeded", JOB_TIMEOUT).await;
    assert_eq!(done["epoch"], 2, "{done:#}");
    assert_eq!(done["restarts"], 0, "{done:#}");
    // The ranks of epoch 2 are the processes that ran before the fencing, each exited 0.
    let after = lab.allocations("fenced").await;
    assert_eq!(epoch2_pids(&after), before, "epoch 2's ranks were replaced");
    for a in after.iter().filter(|a| a["spec"]["epoch"] == 2) {
        assert_eq!(a["status"]["phase"], "Succeeded", "{a:#}");
    }
    let logs = lab.tbctl_ok(&["logs", "fenced"]).await;
    for rank in 0..3 {
        assert_eq!(rank_lines(&logs.stdout, rank), ["done epoch=2"], "{logs}");
    }
}

/// Errors a user can act on: a command that does not exist fails the job at once (no retry)
/// naming the command; a job too big for every Mac stays Pending, Unschedulable, with a message
/// naming each Mac and how much it is short; draining a Node that does not exist is a clear
/// error.
#[tokio::test]
async fn missing_command_unschedulable_job_and_unknown_node() {
    let lab = Lab::start("jobs-errors", 2).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: typo
spec:
  ranks: 1
  memory: 64Mi
  backoffLimit: 3
  command: ["tb-no-such-command", "--epochs", "3"]
---
apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: huge
spec:
  ranks: 1
  memory: 1000Gi
  command: ["true"]
"#,
    )
    .await;

    let typo = lab.wait_job_phase("typo", "Failed", JOB_TIMEOUT).await;
    step!("typo: {typo}");
    assert_eq!(typo["reason"], "ExecNotFound", "{typo:#}");
    assert!(
        str_of(&typo["message"], "message").contains("tb-no-such-command"),
        "the message names the command: {typo:#}"
    );
    assert_eq!(typo["epoch"], 1, "no retry for a missing command: {typo:#}");
    assert_eq!(typo["restarts"], 0, "{typo:#}");
    assert_eq!(condition(&typo, "Failed"), Some("True"), "{typo:#}");

    let huge = lab
        .wait_job("huge", "Unschedulable", JOB_TIMEOUT, |s| {
            s["reason"] == "Unschedulable"
        })
        .await;
    step!("huge: {huge}");
    assert_eq!(huge["phase"], "Pending", "{huge:#}");
    let message = str_of(&huge["message"], "message");
    for node in ["node-1", "node-2"] {
        assert!(
            message.contains(node),
            "the message names {node}: {message}"
        );
    }
    assert!(
        message.contains("short"),
        "the message says how much is missing: {message}"
    );
    assert_eq!(condition(&huge, "Scheduled"), Some("False"), "{huge:#}");
    // It stays that way: a few more reconcile passes place nothing.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s = lab.job_status("huge").await;
        assert_eq!(s["phase"], "Pending", "{s:#}");
        assert!(
            lab.allocations("huge").await.is_empty(),
            "huge got allocations"
        );
    }
    assert!(
        lab.event_reasons("huge")
            .await
            .contains(&"FailedScheduling".to_string())
    );

    let out = lab.tbctl(&["drain", "nope"]).await;
    step!("drain nope: {out}");
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr.contains("nope") && out.stderr.to_lowercase().contains("not found"),
        "the error names the missing node: {out}"
    );
    assert!(!out.stderr.contains("panicked"), "{out}");
    // Nothing changed on the real nodes.
    for n in lab.nodes().await {
        assert_ne!(n["spec"]["unschedulable"], true, "{n:#}");
    }
}

/// The memory guard: two 1-rank jobs that each need 60 % of a Mac's allocatable memory never
/// run on it at once. With one nodelet the second stays Pending (Unschedulable) while the first
/// runs, and starts only after the first has ended.
#[tokio::test]
async fn jobs_that_do_not_fit_together_run_one_after_the_other() {
    let lab = Lab::start_with("jobs-guard", LabOptions::new(1)).await;
    let node = lab.node("node-1").await.expect("node-1");
    let allocatable = u64_of(
        &node["status"]["capacity"]["allocatableBytes"],
        "allocatableBytes",
    );
    let each = allocatable / 10 * 6;
    step!("allocatable {allocatable} bytes; each job asks for {each}");
    let job = |name: &str| {
        format!(
            "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  ranks: 1
  memory: \"{each}\"
  backoffLimit: 0
  command: [\"sh\", \"-c\", \"sleep 3; echo {name} done\"]
"
        )
    };
    lab.apply_yaml(&job("first")).await;
    lab.wait_job_phase("first", "Running", JOB_TIMEOUT).await;
    lab.apply_yaml(&job("second")).await;

    let second = lab
        .wait_job("second", "Unschedulable", JOB_TIMEOUT, |s| {
            s["reason"] == "Unschedulable"
        })
        .await;
    let first = lab.job_status("first").await;
    assert_eq!(
        first["phase"], "Running",
        "the second job must be refused while the first runs: {first:#}"
    );
    assert_eq!(second["phase"], "Pending", "{second:#}");
    let message = str_of(&second["message"], "message");
    assert!(
        message.contains("node-1") && message.contains("short"),
        "{message}"
    );
    assert!(lab.allocations("second").await.is_empty());

    // While both exist, what runs on the Mac never exceeds what it may hand out.
    let deadline = Instant::now() + JOB_TIMEOUT;
    loop {
        let node = lab.node("node-1").await.expect("node-1");
        let allocated = node["status"]["allocatedBytes"].as_u64().unwrap_or(0);
        assert!(
            allocated <= allocatable,
            "{allocated} > {allocatable}: {node:#}"
        );
        let s = lab.job_status("second").await;
        if s["phase"] == "Succeeded" {
            break;
        }
        assert!(s["phase"] != "Failed", "{s:#}");
        assert!(Instant::now() < deadline, "second did not succeed: {s:#}");
        tokio::time::sleep(tb_tests::wait::POLL).await;
    }
    lab.wait_job_phase("first", "Succeeded", JOB_TIMEOUT).await;

    let a = lab.allocations("first").await;
    let b = lab.allocations("second").await;
    assert_eq!((a.len(), b.len()), (1, 1), "{a:#?} {b:#?}");
    let first_end =
        stamp_millis(str_of(&a[0]["status"]["finishedAt"], "finishedAt")).expect("time");
    let second_start =
        stamp_millis(str_of(&b[0]["status"]["startedAt"], "startedAt")).expect("time");
    let second_created = stamp_millis(str_of(
        &b[0]["metadata"]["creationTimestamp"],
        "creationTimestamp",
    ))
    .expect("time");
    assert!(
        second_created >= first_end && second_start >= first_end,
        "second placed at {second_created} / started at {second_start}, before first ended at {first_end}"
    );
    assert_eq!(a[0]["spec"]["node"], "node-1");
    assert_eq!(b[0]["spec"]["node"], "node-1");
}

/// A nodelet that restarts quickly (SIGKILL, then started again well within the grace period)
/// cannot supervise the ranks its predecessor started: it kills them and reports their
/// allocations Lost with reason NodeletRestarted, and the job is placed again without using a
/// retry. The Node itself never goes NotReady, and it keeps its identity (no join token needed).
#[tokio::test]
async fn quick_nodelet_restart_reports_its_ranks_lost() {
    let mut lab = Lab::start("jobs-restart", 2).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: phoenix
spec:
  ranks: 2
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "if [ \"$TB_EPOCH\" = 1 ]; then sleep 30; else sleep 2; fi; echo done epoch=$TB_EPOCH"]
"#,
    )
    .await;
    let status = lab.wait_job_phase("phoenix", "Running", JOB_TIMEOUT).await;
    let victim_name = placement_nodes(&status)[0].clone();
    let victim = lab.index_of(&victim_name);
    let allocs = lab.allocations("phoenix").await;
    let stale = alloc_of(&allocs, 1, 0).expect("rank 0 of epoch 1").clone();
    let stale_name = name_of(&stale).to_string();
    let stale_pid = stale["status"]["pid"].as_i64().expect("pid");
    let stale_dir = lab.nodelet(victim).alloc_dir("default", &stale_name);

    let allocs_watch = lab.watch("allocs").await;
    let nodes_watch = lab.watch("nodes").await;
    lab.kill_nodelet(victim);
    assert!(
        process_alive(stale_pid),
        "killing a nodelet leaves its ranks running"
    );
    lab.restart_nodelet(victim);
    wait_process_gone(
        stale_pid,
        "the rank of the previous nodelet",
        Duration::from_secs(10),
    )
    .await;
    let lost = allocs_watch
        .wait_for(&format!("{stale_name} Lost"), JOB_TIMEOUT, |a| {
            a["metadata"]["name"] == stale_name.as_str() && a["status"]["phase"] == "Lost"
        })
        .await;
    assert_eq!(lost["status"]["reason"], "NodeletRestarted", "{lost:#}");
    assert!(
        lost["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&victim_name)),
        "{lost:#}"
    );

    let done = lab
        .wait_job_phase("phoenix", "Succeeded", JOB_TIMEOUT)
        .await;
    assert_eq!(done["epoch"], 2, "placed again once: {done:#}");
    assert_eq!(
        done["restarts"], 0,
        "a restarted nodelet costs the job no retry: {done:#}"
    );
    assert_eq!(
        processes_of(&stale_dir),
        Vec::<i64>::new(),
        "{stale_name} runs again"
    );
    let logs = lab.tbctl_ok(&["logs", "phoenix"]).await;
    for rank in 0..2 {
        assert_eq!(rank_lines(&logs.stdout, rank), ["done epoch=2"], "{logs}");
    }
    assert!(
        lab.nodelet_exit_status(victim).is_none(),
        "the restarted nodelet (no join token) exited:\n{}",
        lab.nodelet_log(victim)
    );
    let flapped: Vec<Value> = nodes_watch
        .objects()
        .into_iter()
        .filter(|n| n["metadata"]["name"] == victim_name.as_str())
        .filter(|n| condition(&n["status"], "Ready") == Some("False"))
        .collect();
    assert!(
        flapped.is_empty(),
        "{victim_name} went NotReady: {flapped:#?}"
    );
}

/// A nodelet started with a relative `--data-dir` (as `tbctl up --data-dir DIR` passes one on
/// when DIR is relative) must still hand its ranks paths they can open: a rank runs in its own
/// working directory, so MLX_HOSTFILE and TB_ALLOCATION_DIR must be absolute.
#[tokio::test]
async fn relative_data_dir_still_gives_ranks_paths_they_can_open() {
    let mut opts = LabOptions::new(1);
    opts.relative_data_dirs = true;
    let lab = Lab::start_with("jobs-reldir", opts).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: paths
spec:
  ranks: 1
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "echo hostfile=$MLX_HOSTFILE; echo allocdir=$TB_ALLOCATION_DIR; cat \"$MLX_HOSTFILE\" && test -d \"$TB_ALLOCATION_DIR\""]
"#,
    )
    .await;
    let status = lab
        .wait_job("paths", "an end", JOB_TIMEOUT, |s| {
            s["phase"] == "Succeeded" || s["phase"] == "Failed"
        })
        .await;
    let logs = lab.tbctl_ok(&["logs", "paths"]).await;
    step!("paths: {status}\n{logs}");
    let hostfile = logs
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("hostfile="))
        .unwrap_or_else(|| panic!("no hostfile line: {logs}"))
        .to_string();
    let allocs = lab.allocations("paths").await;
    let dir = lab.nodelet(0).alloc_dir("default", name_of(&allocs[0]));
    assert!(
        Path::new(&hostfile).is_absolute() && status["phase"] == "Succeeded",
        "with --data-dir node-1 the rank got MLX_HOSTFILE={hostfile:?}, which it cannot open \
         from its working directory {}: job {}, output:\n{}",
        dir.join("work").display(),
        status["phase"],
        logs.stdout
    );
}
