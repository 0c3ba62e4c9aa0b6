//! Full disks: a controller's data directory on a small filesystem (a size-limited tmpfs the
//! test mounts; the tests run as root) that a filler file fills to the last byte.
//!
//! - A lone controller refuses writes with RESOURCE_EXHAUSTED "no space left on the
//!   controller's data disk" (at once, not a hang, not a raw I/O error), keeps serving reads,
//!   does not exit, and takes writes again as soon as the filler is deleted — no restart. Every
//!   acknowledged object is still there, also after a SIGKILL and restart (redb intact).
//! - In a cluster of three, the leader whose disk fills hands leadership to another member and
//!   the cluster keeps taking writes; the full member lags, and catches up once space returns.
//!   No acknowledged write is lost.
//! - A nodelet staging a model onto a small data disk fails with a status naming the disk and
//!   the sizes, keeps no unverified bytes it would trust, and stages once space returns.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_tests::cluster::ELECTION_TIMEOUT;
use tb_tests::objects::{self, model, smollm2_service_yaml, unique_namespace};
use tb_tests::workdir::TestDir;
use tb_tests::{Client, Cluster, ClusterOptions, Controller, ControllerConfig, step, wait};
use tonic::Code;

/// What a controller keeps free in these tests (the filesystems are 16 MiB).
const RESERVE: &str = "4Mi";
const DISK_SIZE: &str = "16m";

/// A tmpfs of a given size mounted for one test; unmounted when dropped.
struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    fn mount(path: PathBuf, size: &str) -> SmallDisk {
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs at {} (these tests run as root): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { path }
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }

    /// Write zeros to a filler file until the filesystem refuses (ENOSPC). Returns its size.
    fn fill(&self) -> u64 {
        let mut f = std::fs::File::create(self.filler()).expect("creating the filler");
        let chunk = vec![0u8; 64 << 10];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", self.path.display()),
            }
        }
        // Smaller writes take the last pages.
        for _ in 0..64 {
            match f.write(&[0u8; 512]) {
                Ok(n) if n > 0 => written += n as u64,
                _ => break,
            }
        }
        written
    }

    fn free_filler(&self) {
        std::fs::remove_file(self.filler()).expect("deleting the filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a process of a failed test may still hold a file open there.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

async fn apply_one(client: &Client, addr: &str, ns: &str, name: &str) -> Result<(), tonic::Status> {
    let req = tb_api::proto::ApplyRequest {
        objects_json: vec![model(ns, name, name).to_string()],
        dry_run: false,
        request_id: objects::request_id(),
    };
    client.apply_on(addr, req).await.map(|_| ())
}

/// Names of the Models in `ns` as member `addr` has them (a linearizable list).
async fn names_on(client: &Client, addr: &str, ns: &str) -> Vec<String> {
    let resp = client
        .list_on(addr, "Model", ns, false)
        .await
        .unwrap_or_else(|e| panic!("list on {addr}: {}: {}", e.code(), e.message()));
    resp.objects_json
        .iter()
        .filter_map(|j| serde_json::from_str::<Value>(j).ok())
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn assert_all_there(acked: &[String], present: &[String], when: &str) {
    let missing: Vec<&String> = acked.iter().filter(|n| !present.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "{when}: acknowledged writes lost: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_disk_refuses_writes_clearly_and_recovers_without_a_restart() {
    let dir = TestDir::new("disk-full-single");
    let disk = SmallDisk::mount(dir.path().join("disk"), DISK_SIZE);
    let mut config = ControllerConfig::single(dir.path(), 1);
    config.data_dir = disk.path.join("data");
    config.extra_args = vec!["--min-free-disk".into(), RESERVE.into()];
    let mut c = Controller::start(config);
    c.wait_serving(Duration::from_secs(20)).await;
    let addr = c.addr().to_string();
    let client = Client::new(vec![addr.clone()]);
    let ns = unique_namespace("disk");

    let mut acked = Vec::new();
    for i in 0..20 {
        let name = format!("before-{i}");
        wait::expect(&format!("write {name}"), ELECTION_TIMEOUT, || async {
            apply_one(&client, &addr, &ns, &name)
                .await
                .map_err(|e| format!("{}: {}", e.code(), e.message()))
        })
        .await;
        acked.push(name);
    }

    let filled = disk.fill();
    step!("filled the data disk with {filled} bytes");
    let started = Instant::now();
    let err = apply_one(&client, &addr, &ns, "during")
        .await
        .expect_err("a write on a full data disk must be refused");
    let took = started.elapsed();
    step!("refused in {took:?}: {}: {}", err.code(), err.message());
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message()
            .starts_with("no space left on the controller's data disk"),
        "{}",
        err.message()
    );
    assert!(
        err.message().contains(&disk.path.display().to_string()),
        "the error names the directory: {}",
        err.message()
    );
    assert!(took < Duration::from_secs(5), "refused only after {took:?}");
    // The same through tbctl: the message, not a raw I/O error, and exit non-zero.
    let tbctl = tb_tests::Tbctl::new(std::slice::from_ref(&addr), &dir.sub("home"));
    let manifest = dir.write(
        "m.yaml",
        &format!(
            "apiVersion: tb/v1\nkind: Model\nmetadata: {{name: via-tbctl, namespace: {ns}}}\n\
             spec: {{format: gguf, source: {{path: /models/x.gguf}}}}\n"
        ),
    );
    let out = tbctl
        .run(&["apply", "-f", &manifest.display().to_string()])
        .await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr
            .contains("no space left on the controller's data disk"),
        "{out:?}"
    );

    // Reads still work, and the controller is alive, still refusing a while later.
    assert_all_there(
        &acked,
        &names_on(&client, &addr, &ns).await,
        "on a full disk",
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(c.is_running(), "the controller exited:\n{}", c.log_tail(40));
    let again = apply_one(&client, &addr, &ns, "during").await;
    assert_eq!(
        again.as_ref().err().map(|e| e.code()),
        Some(Code::ResourceExhausted),
        "{again:?}"
    );

    disk.free_filler();
    let started = Instant::now();
    wait::expect(
        "a write once space returns",
        Duration::from_secs(10),
        || async {
            apply_one(&client, &addr, &ns, "after")
                .await
                .map_err(|e| format!("{}: {}", e.code(), e.message()))
        },
    )
    .await;
    step!(
        "writable again {:?} after the filler went",
        started.elapsed()
    );
    acked.push("after".into());
    assert!(c.is_running());
    assert_all_there(&acked, &names_on(&client, &addr, &ns).await, "after");

    // The database on disk is whole: a SIGKILL and a restart find every object.
    c.kill();
    c.restart();
    c.wait_serving(Duration::from_secs(20)).await;
    let present = wait::expect("a list after the restart", ELECTION_TIMEOUT, || async {
        client
            .list_on(&addr, "Model", &ns, false)
            .await
            .map_err(|e| format!("{}: {}", e.code(), e.message()))
    })
    .await;
    let present: Vec<String> = present
        .objects_json
        .iter()
        .filter_map(|j| serde_json::from_str::<Value>(j).ok())
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_all_there(&acked, &present, "after a restart");
    assert!(
        !c.log().contains("PreviousIo") && !c.log().contains("raft log write failed"),
        "a write reached the full disk:\n{}",
        c.log_tail(60)
    );
    drop(c);
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_fills_hands_over_and_catches_up_when_space_returns() {
    let dir = TestDir::new("disk-full-cluster");
    let disks: Vec<SmallDisk> = (1..=3)
        .map(|i| SmallDisk::mount(dir.path().join(format!("disk{i}")), DISK_SIZE))
        .collect();
    let mut opts = ClusterOptions::new(3).args(["--min-free-disk", RESERVE]);
    opts.data_dirs = disks.iter().map(|d| d.path.join("data")).collect();
    let mut cluster = Cluster::start("disk-full-cluster", opts).await;
    let client = cluster.client();
    let ns = unique_namespace("disk");
    let mut acked = Vec::new();
    let write = |name: String| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            client
                .apply(
                    &[model(&ns, &name, &name)],
                    &objects::request_id(),
                    0,
                    Duration::from_secs(30),
                )
                .await
                .map(|_| name.clone())
                .unwrap_or_else(|e| panic!("write {name}: {}: {}", e.code(), e.message()))
        }
    };
    for i in 0..20 {
        acked.push(write(format!("before-{i}")).await);
    }

    let full = cluster.leader_index().await;
    step!("filling the leader's (controller {}) data disk", full + 1);
    disks[full].fill();
    let started = Instant::now();
    let leader = wait::expect("another leader", ELECTION_TIMEOUT, || {
        let addrs = cluster.addrs();
        let client = client.clone();
        async move {
            for a in &addrs {
                if let Ok(s) = client.status_on(a).await
                    && s.has_leader
                    && s.leader_id != full as u64 + 1
                {
                    return Ok(s.leader_id);
                }
            }
            Err("the full member still leads")
        }
    })
    .await;
    step!(
        "controller {leader} leads {:?} after the disk filled",
        started.elapsed()
    );
    // The cluster takes writes through the other members.
    for i in 0..20 {
        acked.push(write(format!("during-{i}")).await);
    }
    // Through the full member a write is forwarded when it knows the new leader, or refused
    // clearly: the new leader's first heartbeat carries a vote the member would have to write
    // before anything else, and a failed write would stop its Raft, so it refuses that too
    // until space returns.
    match apply_one(&client, &cluster.addr(full), &ns, "via-full").await {
        Ok(()) => acked.push("via-full".into()),
        Err(e) => assert!(
            e.code() == Code::ResourceExhausted && e.message().contains("no space left"),
            "a write through the full member: {e:?}"
        ),
    }
    let view = cluster
        .member_view(full)
        .await
        .expect("the full member answers");
    step!("the full member: {view:?}");
    assert!(
        cluster.member_mut(full).is_running(),
        "the full member exited"
    );
    assert_ne!(
        view.state, "shutdown",
        "the full member's Raft stopped (a write hit the full disk): {view:?}"
    );

    disks[full].free_filler();
    let started = Instant::now();
    cluster.wait_converged(Duration::from_secs(30)).await;
    step!("converged {:?} after the filler went", started.elapsed());
    let present = cluster.stale_list(full, "Model", &ns).await;
    let present: Vec<String> = present
        .iter()
        .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_all_there(&acked, &present, "on the member whose disk was full");
    let log = cluster.member(full).log();
    assert!(
        log.contains("no space left on the controller's data disk"),
        "the full member's log says why it refused"
    );
    assert!(
        !log.contains("PreviousIo") && !log.contains("raft log write failed"),
        "a write reached the full disk"
    );
    drop(cluster);
    drop(disks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_onto_a_full_nodelet_disk_says_so_and_succeeds_once_space_returns() {
    use tb_tests::lab::{Lab, LabOptions};
    let model = tb_engine::test_model_path();
    assert!(
        model.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        model.display()
    );
    let model = model.canonicalize().unwrap_or(model);
    let dir = TestDir::new("disk-full-staging");
    // node-2's data disk: 160 MiB, of which the filler leaves about 12 (its shard needs ~50).
    let disk = SmallDisk::mount(dir.path().join("node2-disk"), "160m");
    let topology = dir.write(
        "lab.yaml",
        "macs:
  - {name: node-1, ports: [{name: lo, address: 127.0.3.1}]}
  - {name: node-2, ports: [{name: lo, address: 127.0.3.2}]}
links:
  - {between: [node-1/lo, node-2/lo], bandwidthGbps: 80, latencyUs: 10}
",
    );
    {
        let mut f = std::fs::File::create(disk.filler()).expect("filler");
        f.write_all(&vec![0u8; 148 << 20])
            .expect("writing the filler");
    }
    let mut opts = LabOptions::new(2);
    opts.topology = Some(topology);
    opts.nodelet_data_dirs = vec![dir.path().join("node-1"), disk.path.join("node-2")];
    let lab = Lab::start_with("disk-full-staging", opts).await;
    lab.apply_yaml(&smollm2_service_yaml(
        &model.display().to_string(),
        Some("node-1"),
    ))
    .await;

    let refused = wait::expect(
        "node-2's rank failing to stage for want of space",
        Duration::from_secs(120),
        || async {
            let allocs = lab.list("Allocation", "default").await?;
            allocs
                .into_iter()
                .filter(|a| a["spec"]["node"] == "node-2")
                .map(|a| {
                    a["status"]["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .find(|m| m.contains("no space left on the nodelet's data disk"))
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    step!("refused: {refused}");
    assert!(
        refused.contains(&disk.path.display().to_string()) && refused.contains("MiB more"),
        "the message names the disk and the sizes: {refused}"
    );
    // Nothing unverified is trusted: no tensor is recorded as verified.
    for cache in std::fs::read_dir(disk.path.join("node-2/models"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let verified = std::fs::read_to_string(cache.join("verified.json")).unwrap_or_default();
        assert!(
            verified.is_empty() || verified.trim() == "[]",
            "tensors recorded as verified after a refused staging: {verified}"
        );
    }

    disk.free_filler();
    step!("filler deleted");
    let ready = wait::expect(
        "the service Ready once space returns",
        Duration::from_secs(240),
        || async {
            let out = lab.tbctl(&["get", "isvc", "chat", "-o", "json"]).await;
            let v: Value = serde_json::from_str(&out.stdout).map_err(|e| e.to_string())?;
            let ready = v["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            if ready {
                Ok(v["status"].clone())
            } else {
                Err(v["status"].to_string())
            }
        },
    )
    .await;
    step!("ready: {ready}");
    let allocs = lab
        .list("Allocation", "default")
        .await
        .expect("allocations");
    let staged = allocs
        .iter()
        .filter(|a| a["spec"]["node"] == "node-2")
        .filter_map(|a| a["status"]["stagedBytes"].as_u64())
        .max()
        .unwrap_or(0);
    assert!(staged > 0, "node-2 staged nothing: {allocs:#?}");
    drop(lab);
    drop(disk);
}
