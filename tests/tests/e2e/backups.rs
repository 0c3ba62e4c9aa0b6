//! Backups: `tbctl snapshot save FILE` takes a consistent copy of a three-member cluster
//! (asked of a follower, taken on the leader after every acknowledged write), written 0600;
//! `tb-controller restore FILE --data-dir D` makes a new cluster of one from it, which serves
//! every object, user, token and schedule. Only admins may take a snapshot; restore refuses a
//! truncated, altered or foreign file and a data dir that is not empty.
//!
//! `ten_thousand_objects_save_and_restore` (ignored: run it by name) measures the file's size
//! and the time to save and restore a store of 10,000 objects.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_tests::objects::{model, model_value, parse, request_id, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions, Controller, ControllerConfig, Tbctl, step};

const BUDGET: Duration = Duration::from_secs(20);

/// Run `tb-controller ARGS` to completion: (success, stdout + stderr).
pub(crate) fn controller_cmd(args: &[&str]) -> (bool, String) {
    let out = Command::new(tb_tests::bins::controller())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("running tb-controller {args:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `tb-controller restore FILE --data-dir DIR --id 1 --advertise ADDR`.
pub(crate) fn restore(file: &Path, dir: &Path, addr: &str) -> (bool, String) {
    controller_cmd(&[
        "restore",
        &file.display().to_string(),
        "--data-dir",
        &dir.display().to_string(),
        "--id",
        "1",
        "--advertise",
        addr,
    ])
}

/// A controller started on a restored data dir (the harness's CA and secret; its admin token
/// is in the restored store already).
async fn start_restored(dir: &Path, data_dir: PathBuf, addr: String) -> Controller {
    let mut config = ControllerConfig::single(dir, 1);
    config.data_dir = data_dir;
    config.log_path = dir.join("restored.log");
    config.addr = addr;
    let mut c = Controller::start(config);
    c.wait_serving(Duration::from_secs(30)).await;
    c
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The token a `tbctl admin user create` printed.
fn token_of(out: &tb_tests::TbctlOutput) -> String {
    assert!(out.success(), "{out}");
    let t = out.stdout.trim().to_string();
    assert!(t.starts_with("tbuser-"), "{out}");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_every_object_user_and_schedule_as_a_new_cluster() {
    let mut cluster = Cluster::start("backups", ClusterOptions::new(3)).await;
    let client = cluster.client();
    let dir = cluster.dir().path().to_path_buf();
    let ns = unique_namespace("bk");

    // Objects, a schedule, users with tokens.
    for i in 0..20 {
        client
            .apply(
                &[model(&ns, &format!("m{i}"), &format!("v{i}"))],
                &request_id(),
                i % 3,
                BUDGET,
            )
            .await
            .unwrap_or_else(|e| panic!("apply m{i}: {e:?}"));
    }
    let admin = Tbctl::new(&cluster.addrs(), &dir.join("home"));
    let schedule = tb_tests::lab::manifest("schedule-nightly-finetune.yaml");
    let out = admin
        .run(&["apply", "-f", &schedule.display().to_string()])
        .await;
    assert!(out.success(), "{out}");
    let viewer = token_of(
        &admin
            .run(&["admin", "user", "create", "vic", "--role", "viewer"])
            .await,
    );
    let member = token_of(
        &admin
            .run(&[
                "admin", "user", "create", "mia", "--role", "member", "-n", &ns,
            ])
            .await,
    );
    // The last write before the snapshot, acknowledged: the snapshot must hold it.
    client
        .apply(&[model(&ns, "m0", "last")], &request_id(), 1, BUDGET)
        .await
        .expect("the last write");

    // Asked of a follower: taken on the leader.
    let leader = cluster.leader_index().await;
    let follower = (leader + 1) % 3;
    let via_follower = Tbctl::new(&[cluster.addr(follower)], &dir.join("home"));
    let file = dir.join("backup.tbsnap");
    let started = Instant::now();
    let out = via_follower
        .run(&["snapshot", "save", &file.display().to_string()])
        .await;
    assert!(out.success(), "{out}");
    step!("saved in {:?}: {}", started.elapsed(), out.stdout.trim());
    assert_eq!(mode(&file), 0o600, "a snapshot holds credential hashes");
    let bytes = std::fs::read(&file).expect("reading the snapshot");
    let (header, _) = tb_api::snapshot_file::decode(&bytes).expect("a valid snapshot file");
    assert!(!header.cluster_id.is_empty(), "{header:?}");
    assert!(out.stdout.contains(&header.cluster_id), "{out}");

    // Non-admins may not take one: nothing written.
    for (who, token) in [("viewer", &viewer), ("member", &member)] {
        let denied = dir.join(format!("{who}.tbsnap"));
        let out = admin
            .with_token(Some(token))
            .run(&["snapshot", "save", &denied.display().to_string()])
            .await;
        assert!(
            !out.success() && out.stderr.contains("may not get ClusterSnapshot"),
            "{who}: {out}"
        );
        assert!(!denied.exists(), "{who}: no file for a refusal");
    }
    let answer = Client::with_token(cluster.addrs(), Some(&viewer))
        .cluster(&cluster.addr(leader))
        .save_snapshot(tb_api::proto::SaveSnapshotRequest {})
        .await;
    match answer {
        Err(e) => assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}"),
        Ok(_) => panic!("a viewer's SaveSnapshot was answered"),
    }

    // Restore refuses what it must not restore, and writes nothing then.
    let restored = dir.join("restored");
    let truncated = dir.join("truncated.tbsnap");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).expect("write");
    let (ok, text) = restore(&truncated, &restored, "127.0.0.1:1");
    assert!(!ok && text.contains("truncated"), "{text}");
    let altered = dir.join("altered.tbsnap");
    let mut changed = bytes.clone();
    let n = changed.len();
    changed[n - 2] ^= 0x20;
    std::fs::write(&altered, &changed).expect("write");
    let (ok, text) = restore(&altered, &restored, "127.0.0.1:1");
    assert!(!ok && text.contains("checksum"), "{text}");
    let (ok, text) = restore(cluster.member(0).log_path(), &restored, "x:1");
    assert!(!ok && text.contains("not a tb snapshot file"), "{text}");
    assert!(!restored.exists(), "nothing written for a refused file");

    // Restore into a new data dir; not over one that holds anything.
    let addr = tb_tests::ports::free_addr();
    let started = Instant::now();
    let (ok, text) = restore(&file, &restored, &addr);
    assert!(ok, "{text}");
    step!("restored in {:?}: {}", started.elapsed(), text.trim());
    assert!(
        text.contains("(1 schedules)") && text.contains("3 users"),
        "{text}"
    );
    let (ok, text) = restore(&file, &restored, &addr);
    assert!(!ok && text.contains("is not empty"), "{text}");

    // The original cluster stops; the restored one serves what it held.
    cluster.kill_all();
    let mut c = start_restored(&dir, restored.clone(), addr.clone()).await;
    let restored_client = Client::new(vec![addr.clone()]);
    let models = restored_client
        .list("Model", &ns, 0, BUDGET)
        .await
        .expect("list the restored models");
    assert_eq!(models.objects_json.len(), 20);
    for json in &models.objects_json {
        let m = parse(json);
        let want = if m.metadata.name == "m0" {
            "last".to_string()
        } else {
            format!("v{}", &m.metadata.name[1..])
        };
        assert_eq!(model_value(&m).as_deref(), Some(want.as_str()), "{json}");
    }
    let tbctl = Tbctl::new(std::slice::from_ref(&addr), &dir.join("home"));
    let out = tbctl.run(&["get", "schedules", "-o", "json"]).await;
    assert!(
        out.success() && out.stdout.contains("nightly-finetune"),
        "{out}"
    );
    // Users and their tokens came along: each is still who it was.
    let out = tbctl.with_token(Some(&viewer)).run(&["whoami"]).await;
    assert!(
        out.success() && out.stdout.contains("user vic (role viewer)"),
        "{out}"
    );
    let out = tbctl.with_token(Some(&member)).run(&["whoami"]).await;
    assert!(out.success() && out.stdout.contains("user mia"), "{out}");
    // A new cluster of one, with an id of its own, that takes writes.
    let status = restored_client.status_on(&addr).await.expect("status");
    assert_eq!(status.members.len(), 1, "{status:?}");
    restored_client
        .apply(&[model(&ns, "after", "x")], &request_id(), 0, BUDGET)
        .await
        .expect("a write to the restored cluster");
    let again = dir.join("again.tbsnap");
    let out = tbctl
        .run(&["snapshot", "save", &again.display().to_string()])
        .await;
    assert!(out.success(), "{out}");
    let (h2, _) =
        tb_api::snapshot_file::decode(&std::fs::read(&again).expect("read")).expect("valid");
    assert_ne!(
        h2.cluster_id, header.cluster_id,
        "a restored cluster has a new id"
    );
    assert!(h2.revision > header.revision, "{h2:?} after {header:?}");
    let _ = c.terminate(Duration::from_secs(10)).await;
}

/// The numbers for docs/backups.md: a store of 10,000 Models saved and restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: run by name to measure"]
async fn ten_thousand_objects_save_and_restore() {
    const OBJECTS: usize = 10_000;
    const BATCH: usize = 250;
    let mut cluster = Cluster::start("backups-10k", ClusterOptions::new(1)).await;
    let client = cluster.client();
    let dir = cluster.dir().path().to_path_buf();
    let ns = unique_namespace("bk10k");
    let started = Instant::now();
    for b in 0..OBJECTS / BATCH {
        let objects: Vec<Value> = (0..BATCH)
            .map(|i| {
                let n = b * BATCH + i;
                model(&ns, &format!("m{n}"), &format!("value-{n}"))
            })
            .collect();
        client
            .apply(&objects, &request_id(), 0, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("batch {b}: {e:?}"));
    }
    step!("{OBJECTS} objects applied in {:?}", started.elapsed());
    let tbctl = Tbctl::new(&cluster.addrs(), &dir.join("home"));
    let file = dir.join("10k.tbsnap");
    let started = Instant::now();
    let out = tbctl
        .run(&["snapshot", "save", &file.display().to_string()])
        .await;
    assert!(out.success(), "{out}");
    let save = started.elapsed();
    let size = std::fs::metadata(&file).expect("stat").len();
    let restored = dir.join("restored");
    let addr = tb_tests::ports::free_addr();
    let started = Instant::now();
    let (ok, text) = restore(&file, &restored, &addr);
    assert!(ok, "{text}");
    let restore_time = started.elapsed();
    cluster.kill_all();
    let started = Instant::now();
    let _c = start_restored(&dir, restored, addr.clone()).await;
    let list = Client::new(vec![addr])
        .list("Model", &ns, 0, Duration::from_secs(60))
        .await
        .expect("list");
    assert_eq!(list.objects_json.len(), OBJECTS);
    let serve = started.elapsed();
    println!(
        "BACKUP-NUMBERS objects={OBJECTS} file_bytes={size} save_ms={} restore_ms={} \
         start_and_list_ms={} ({})",
        save.as_millis(),
        restore_time.as_millis(),
        serve.as_millis(),
        out.stdout.trim()
    );
}
