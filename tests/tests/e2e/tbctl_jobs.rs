//! tbctl driving jobs as a user does on one machine: `tbctl up` starts a controller and two
//! nodelets and points a context at them (the config file is a temporary `TB_CONFIG`, so every
//! later command runs without `--server`); jobs are applied, waited for and read back; cordon,
//! uncordon and drain steer placement; `tbctl down` stops every process it started. And `tbctl
//! wait` on a job that cannot run gives up at once with the job's failure, exit 1.
//!
//! `tbctl up` runs the controller with its default timings and gives node-N the rank ports
//! 32323+100·(N-1) ..= +99 (the jobs here never listen on them), or, with `--port-range`, every
//! port from that range: two clusters started at once that way must not collide. Its processes
//! are detached (a session each), so the test's guard kills whatever `down` did not stop, rank
//! processes included, and prints the logs when the test fails.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_tests::lab::{
    Lab, condition, kill_leftover_ranks, process_alive, rank_lines, wait_process_gone,
};
use tb_tests::workdir::TestDir;
use tb_tests::{TbctlOutput, step};

/// The longest one tbctl run may take (`up` waits for the nodelets; `drain` for the work to go).
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
const JOB_TIMEOUT: Duration = Duration::from_secs(60);

const ECHO: &str = r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: echo
spec:
  ranks: 3
  memory: 64Mi
  backoffLimit: 0
  command: ["sh", "-c", "echo rank=$TB_RANK world=$TB_WORLD_SIZE job=$TB_JOB mlx=$MLX_RANK; cat $MLX_HOSTFILE"]
"#;

/// A local cluster made by `tbctl up` in a test directory, with its own config file and home.
struct Local {
    data: PathBuf,
    home: PathBuf,
    config: PathBuf,
    port: u16,
    dir: TestDir,
}

impl Local {
    fn new(name: &str) -> Local {
        let dir = TestDir::new(name);
        let home = dir.sub("home");
        Local {
            data: dir.path().join("cluster"),
            config: dir.path().join("tbconfig.yaml"),
            port: tb_tests::ports::free_up_port(),
            home,
            dir,
        }
    }

    /// `tbctl ARGS...` with `TB_CONFIG` set and no `--server`: the context decides.
    async fn tbctl(&self, args: &[&str]) -> TbctlOutput {
        let mut cmd = tokio::process::Command::new(tb_tests::bins::tbctl());
        cmd.args(args)
            .current_dir(&self.home)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("XDG_DATA_HOME", self.home.join(".local/share"))
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
        cmd.env("TB_CONFIG", &self.config);
        let child = cmd.spawn().expect("starting tbctl");
        let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "tbctl {} did not finish within {RUN_TIMEOUT:?}",
                    args.join(" ")
                )
            })
            .expect("waiting for tbctl");
        TbctlOutput {
            args: args.iter().map(|a| a.to_string()).collect(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn ok(&self, args: &[&str]) -> TbctlOutput {
        let out = self.tbctl(args).await;
        assert!(out.success(), "expected success from {out}");
        out
    }

    fn data_arg(&self) -> String {
        self.data.display().to_string()
    }

    async fn apply(&self, name: &str, yaml: &str) {
        let path = self.dir.write(&format!("{name}.yaml"), yaml);
        self.ok(&["apply", "-f", &path.display().to_string()]).await;
    }

    async fn get_json(&self, args: &[&str]) -> Value {
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "json"]);
        self.ok(&full).await.json()
    }

    async fn job(&self, name: &str) -> Value {
        self.get_json(&["tj", name]).await
    }

    async fn allocations(&self, job: &str) -> Vec<Value> {
        let mut items: Vec<Value> = self.get_json(&["allocs"]).await["items"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        items.retain(|a| a["metadata"]["labels"]["tb/job"] == job);
        items.sort_by_key(|a| (a["spec"]["epoch"].as_u64(), a["spec"]["rank"].as_u64()));
        items
    }

    /// Poll `tbctl get tj NAME -o json` until `check` accepts its status.
    async fn wait_job(&self, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let check = &check;
        tb_tests::wait::expect(&format!("tj/{name}: {what}"), JOB_TIMEOUT, || async move {
            let status = self.job(name).await["status"].clone();
            if check(&status) {
                Ok(status)
            } else {
                Err(status.to_string())
            }
        })
        .await
    }

    /// The pids file `up` wrote: `(name, pid)` per line.
    fn pids(&self) -> Vec<(String, i64)> {
        std::fs::read_to_string(self.data.join("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (name, pid) = l.split_once(' ')?;
                Some((name.to_string(), pid.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // Whatever `down` did not stop: only session leaders, as `up` starts them.
        for (name, pid) in self.pids() {
            // SAFETY: getsid and kill on a pid read from the pids file; a recycled pid is very
            // unlikely to lead its own session, and is then left alone.
            unsafe {
                if process_alive(pid) && libc::getsid(pid as libc::pid_t) == pid as libc::pid_t {
                    eprintln!("killing {name} (pid {pid}), left running");
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.data) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("nodelet-") {
                    kill_leftover_ranks(&e.path());
                }
            }
        }
        if std::thread::panicking() {
            for log in ["controller", "node-1", "node-2"] {
                let path = self.data.join(format!("{log}.log"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "----- {} (last 60 lines) -----\n{}",
                    path.display(),
                    lines[lines.len().saturating_sub(60)..].join("\n")
                );
            }
        }
    }
}

fn nodes_of(status: &Value) -> Vec<String> {
    status["placement"]
        .as_array()
        .unwrap_or_else(|| panic!("no placement: {status:#}"))
        .iter()
        .map(|p| p["node"].as_str().expect("node").to_string())
        .collect()
}

fn ready_nodes(nodes: &Value) -> Vec<String> {
    let mut names: Vec<String> = nodes["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|n| condition(&n["status"], "Ready") == Some("True"))
        .map(|n| n["metadata"]["name"].as_str().expect("name").to_string())
        .collect();
    names.sort();
    names
}

fn ensure_binaries() {
    // `up` finds tb-controller and tb-nodelet next to tbctl: build all three.
    let tbctl = tb_tests::bins::tbctl();
    let controller = tb_tests::bins::controller();
    let nodelet = tb_tests::lab::nodelet_bin();
    let dir = |p: &Path| p.parent().map(Path::to_path_buf);
    assert_eq!(dir(&tbctl), dir(&controller));
    assert_eq!(dir(&tbctl), dir(&nodelet));
}

/// `tbctl up` → apply → wait → get/top → cordon/uncordon → drain → delete → `tbctl down`.
#[tokio::test]
async fn up_run_cordon_drain_down() {
    ensure_binaries();
    let _rank_ports = tb_tests::ports::default_rank_ports().await;
    let local = Local::new("tbctl-up");
    let port = local.port.to_string();
    let data = local.data_arg();
    let started = Instant::now();
    let up = local
        .ok(&[
            "up",
            "--nodelets",
            "2",
            "--data-dir",
            &data,
            "--port",
            &port,
        ])
        .await;
    step!(
        "tbctl up took {:?}:\n{}{}",
        started.elapsed(),
        up.stdout,
        up.stderr
    );
    let server = format!("127.0.0.1:{port}");
    let config = std::fs::read_to_string(&local.config).expect("up writes the config file");
    assert!(
        config.contains("local") && config.contains(&server),
        "the context `local` points at {server}:\n{config}"
    );
    let procs = local.pids();
    let names: Vec<&str> = procs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["controller", "node-1", "node-2"], "{procs:?}");
    for (name, pid) in &procs {
        assert!(process_alive(*pid), "{name} (pid {pid}) runs");
    }

    // The cluster as the context sees it: two Ready nodes.
    assert_eq!(
        ready_nodes(&local.get_json(&["nodes"]).await),
        ["node-1", "node-2"]
    );
    let top = local.ok(&["top", "nodes"]).await;
    for node in ["node-1", "node-2"] {
        assert!(top.stdout.contains(node), "top nodes lists {node}: {top}");
    }
    assert!(top.stdout.contains("ALLOCATABLE"), "{top}");

    // A job, waited for, its output read back.
    local.apply("echo", ECHO).await;
    let wait = local
        .ok(&[
            "wait",
            "tj/echo",
            "--for=condition=Complete",
            "--timeout",
            "60s",
        ])
        .await;
    assert!(wait.stdout.contains("condition met"), "{wait}");
    let echo = local.job("echo").await;
    assert_eq!(echo["status"]["phase"], "Succeeded", "{echo:#}");
    let logs = local.ok(&["logs", "echo"]).await;
    for rank in 0..3u64 {
        let lines = rank_lines(&logs.stdout, rank);
        assert_eq!(
            lines.first().map(String::as_str),
            Some(format!("rank={rank} world=3 job=echo mlx={rank}").as_str()),
            "{logs}"
        );
        let ring: Vec<Vec<String>> = serde_json::from_str(lines.get(1).expect("the hostfile line"))
            .unwrap_or_else(|e| {
                panic!("rank {rank}'s MLX_HOSTFILE is not a ring hostfile ({e}): {logs}")
            });
        assert_eq!(ring.len(), 3, "{logs}");
    }

    // Cordoned node-1 takes no new work: both ranks of a new job stack on node-2.
    let out = local.ok(&["cordon", "node-1"]).await;
    assert!(out.stdout.contains("node/node-1 cordoned"), "{out}");
    local
        .apply(
            "stacked",
            r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: stacked
spec:
  ranks: 2
  memory: 64Mi
  command: ["sleep", "120"]
"#,
        )
        .await;
    let status = local
        .wait_job("stacked", "Running", |s| s["phase"] == "Running")
        .await;
    assert_eq!(nodes_of(&status), ["node-2", "node-2"], "{status:#}");
    let allocs = local.allocations("stacked").await;
    assert_eq!(allocs.len(), 2);
    assert_ne!(
        allocs[0]["spec"]["mlx"]["hosts"][0], allocs[0]["spec"]["mlx"]["hosts"][1],
        "two ranks on one Mac get two ports: {:#}",
        allocs[0]
    );
    let first_pids: Vec<i64> = allocs
        .iter()
        .map(|a| a["status"]["pid"].as_i64().expect("pid"))
        .collect();

    let out = local.ok(&["uncordon", "node-1"]).await;
    assert!(out.stdout.contains("node/node-1 uncordoned"), "{out}");
    let nodes = local.get_json(&["nodes", "node-1"]).await;
    assert_ne!(nodes["spec"]["unschedulable"], true, "{nodes:#}");
    // Uncordoning moves nothing.
    assert_eq!(local.job("stacked").await["status"]["epoch"], 1);

    // Drain moves the running job off node-2, onto node-1, without using a retry.
    let drain = local.ok(&["drain", "node-2", "--timeout", "60s"]).await;
    step!("drain: {drain}");
    assert!(drain.stdout.contains("node/node-2 drained"), "{drain}");
    let moved = local
        .wait_job("stacked", "Running again after the drain", |s| {
            s["phase"] == "Running" && s["epoch"].as_u64() > Some(1)
        })
        .await;
    assert_eq!(nodes_of(&moved), ["node-1", "node-1"], "{moved:#}");
    assert_eq!(moved["restarts"], 0, "a drain uses no retry: {moved:#}");
    for pid in first_pids {
        wait_process_gone(pid, "a rank drained off node-2", Duration::from_secs(15)).await;
    }
    let events = local.ok(&["events", "--for", "tj/stacked"]).await;
    assert!(events.stdout.contains("Evicted"), "{events}");
    let node2 = local.get_json(&["nodes", "node-2"]).await;
    assert_eq!(
        node2["spec"]["unschedulable"], true,
        "drain cordons: {node2:#}"
    );

    // Deleting the job stops its ranks.
    let ranks: Vec<i64> = local
        .allocations("stacked")
        .await
        .iter()
        .filter(|a| a["spec"]["epoch"] == moved["epoch"])
        .map(|a| a["status"]["pid"].as_i64().expect("pid"))
        .collect();
    assert_eq!(ranks.len(), 2);
    local.ok(&["delete", "tj", "stacked"]).await;
    for pid in ranks {
        wait_process_gone(pid, "a rank of the deleted job", Duration::from_secs(20)).await;
    }

    // Down stops every process up started.
    let down = local.ok(&["down", "--data-dir", &data]).await;
    step!("down: {down}");
    for (name, pid) in &procs {
        assert!(
            down.stdout.contains(&format!("{name} (pid {pid}) stopped")),
            "down reports {name} stopped: {down}"
        );
        wait_process_gone(*pid, name, Duration::from_secs(5)).await;
    }
    assert!(
        !local.data.join("pids").exists(),
        "down removes the pids file"
    );
    let again = local.ok(&["down", "--data-dir", &data]).await;
    assert!(again.stdout.contains("no local cluster"), "{again}");
}

/// Two `tbctl up` at once on one machine, each with `--port-range` of its own (and its own data
/// directory and config): both come up, every port each took is inside its range, and a job's
/// ranks in each get rank ports from their cluster's range.
#[tokio::test]
async fn two_local_clusters_with_port_ranges_do_not_collide() {
    ensure_binaries();
    // 1 controller + 2 nodelet endpoints + 2 × 18 rank ports.
    let ranges = [
        tb_tests::ports::free_range(39),
        tb_tests::ports::free_range(39),
    ];
    let clusters = [
        Local::new("tbctl-up-range-a"),
        Local::new("tbctl-up-range-b"),
    ];
    let args: Vec<[String; 7]> = clusters
        .iter()
        .zip(&ranges)
        .map(|(c, (lo, hi))| {
            [
                "up".into(),
                "--nodelets".into(),
                "2".into(),
                "--data-dir".into(),
                c.data_arg(),
                "--port-range".into(),
                format!("{lo}-{hi}"),
            ]
        })
        .collect();
    let argv = |i: usize| args[i].iter().map(String::as_str).collect::<Vec<_>>();
    let (a_args, b_args) = (argv(0), argv(1));
    let started = Instant::now();
    let (a, b) = tokio::join!(clusters[0].tbctl(&a_args), clusters[1].tbctl(&b_args));
    step!("both up in {:?}:\n{a}\n{b}", started.elapsed());
    for (i, (out, (lo, hi))) in [a, b].iter().zip(&ranges).enumerate() {
        assert!(out.success(), "cluster {i}: {out}");
        let config = std::fs::read_to_string(&clusters[i].config).expect("config");
        assert!(
            config.contains(&format!("127.0.0.1:{lo}")),
            "the controller serves on the first port of {lo}-{hi}:\n{config}"
        );
        // The table lists each process's address and rank ports: all inside the range.
        for line in out.stdout.lines().filter(|l| l.starts_with("node-")) {
            // Not the log's path: a temporary directory's random name may hold digits too.
            let ports: Vec<u16> = line
                .split_whitespace()
                .filter(|field| !field.contains('/'))
                .flat_map(|field| field.split(|c: char| !c.is_ascii_digit()))
                .filter_map(|w| w.parse().ok())
                .filter(|p| *p > 1000)
                .collect();
            assert!(
                ports.len() >= 3 && ports.iter().skip(1).all(|p| (lo..=hi).contains(&p)),
                "cluster {i}: {line} (range {lo}-{hi})"
            );
        }
    }
    for (i, c) in clusters.iter().enumerate() {
        assert_eq!(
            ready_nodes(&c.get_json(&["nodes"]).await),
            ["node-1", "node-2"],
            "cluster {i}"
        );
    }

    // A job in each: its ranks' MLX ring hostfile names ports of that cluster's range.
    for c in &clusters {
        c.apply("echo", ECHO).await;
    }
    for (i, c) in clusters.iter().enumerate() {
        let (lo, hi) = ranges[i];
        c.ok(&[
            "wait",
            "tj/echo",
            "--for=condition=Complete",
            "--timeout",
            "60s",
        ])
        .await;
        let logs = c.ok(&["logs", "echo"]).await;
        let hostfile = rank_lines(&logs.stdout, 0)
            .get(1)
            .cloned()
            .unwrap_or_else(|| panic!("no hostfile line: {logs}"));
        let ring: Vec<Vec<String>> = serde_json::from_str(&hostfile)
            .unwrap_or_else(|e| panic!("not a ring hostfile ({e}): {logs}"));
        for addr in ring.iter().flatten() {
            let port: u16 = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{addr}: no port"));
            assert!(
                (lo..=hi).contains(&port),
                "cluster {i}: rank address {addr} outside {lo}-{hi}"
            );
        }
    }
    for c in &clusters {
        c.ok(&["down", "--data-dir", &c.data_arg()]).await;
    }
}

/// `tbctl wait --for=condition=Complete` on a job whose command does not exist exits 1 at once
/// (not after its timeout) with the job's failure: reason ExecNotFound and the command.
#[tokio::test]
async fn wait_gives_up_at_once_when_the_job_fails() {
    let lab = Lab::start("tbctl-wait-fail", 1).await;
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: nocmd
spec:
  ranks: 1
  memory: 64Mi
  command: ["tb-no-such-trainer", "--lr", "0.1"]
"#,
    )
    .await;
    let started = Instant::now();
    let out = lab
        .tbctl(&[
            "wait",
            "tj/nocmd",
            "--for=condition=Complete",
            "--timeout",
            "60s",
        ])
        .await;
    let took = started.elapsed();
    step!("wait took {took:?}: {out}");
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        took < Duration::from_secs(20),
        "wait should fail at once, took {took:?}"
    );
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("error:") && text.contains("trainingjob/nocmd failed:"),
        "the failure is reported: {out}"
    );
    assert!(
        text.contains("ExecNotFound") && text.contains("tb-no-such-trainer"),
        "{out}"
    );
    let status = lab.job_status("nocmd").await;
    assert_eq!(status["phase"], "Failed", "{status:#}");
}
