//! A damaged database (`tb.redb` truncated, or overwritten with garbage): a controller refuses
//! to start from it, exits non-zero and says which file and what to do; a member of a healthy
//! three-member cluster started with `--rebuild-from-peers` moves the file aside, is removed
//! from the cluster and added back, is caught up by the leader's snapshot, and says so in its
//! log.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tb_tests::objects::{model, request_id, unique_namespace};
use tb_tests::{Cluster, ClusterOptions, step, wait};

const BUDGET: Duration = Duration::from_secs(20);

fn db_of(cluster: &Cluster, i: usize) -> PathBuf {
    cluster.member(i).config().data_dir.join("tb.redb")
}

/// Cut the file to half its length.
fn truncate(db: &Path) {
    let len = std::fs::metadata(db).expect("stat").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(db)
        .expect("open");
    f.set_len(len / 2).expect("truncate");
}

/// Overwrite everything after the first 4 KiB (redb's header) with a pattern: every page the
/// database uses is damaged, the length is kept.
fn scribble(db: &Path) {
    let mut bytes = std::fs::read(db).expect("read");
    for b in bytes.iter_mut().skip(4096) {
        *b = 0xAB;
    }
    std::fs::write(db, bytes).expect("write");
}

async fn write_models(cluster: &Cluster, ns: &str, n: usize) {
    let client = cluster.client();
    for i in 0..n {
        client
            .apply(
                &[model(ns, &format!("m{i}"), &format!("v{i}"))],
                &request_id(),
                i % cluster.len(),
                BUDGET,
            )
            .await
            .unwrap_or_else(|e| panic!("apply m{i}: {e:?}"));
    }
}

/// Wait for member `i` to exit on its own; its exit status and log.
async fn wait_exit(cluster: &mut Cluster, i: usize) -> (std::process::ExitStatus, String) {
    let status = wait::expect("the controller to exit", Duration::from_secs(30), || {
        let s = cluster.member_mut(i).exit_status();
        async move { s.ok_or("still running") }
    })
    .await;
    (status, cluster.member(i).log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_controller_refuses_a_damaged_database_and_says_what_to_do() {
    let mut cluster = Cluster::start("corrupt-one", ClusterOptions::new(1)).await;
    let ns = unique_namespace("cd");
    write_models(&cluster, &ns, 10).await;
    let db = db_of(&cluster, 0);
    let _ = cluster
        .member_mut(0)
        .terminate(Duration::from_secs(10))
        .await;
    let good = std::fs::read(&db).expect("read the database");

    for (how, damage) in [
        ("truncated", truncate as fn(&Path)),
        ("overwritten", scribble as fn(&Path)),
    ] {
        std::fs::write(&db, &good).expect("put the good file back");
        damage(&db);
        step!("starting on a {how} database");
        let before = cluster.member(0).log().len();
        cluster.member_mut(0).restart();
        let (status, log) = wait_exit(&mut cluster, 0).await;
        let log = &log[before..];
        assert!(!status.success(), "{how}: exited {status}; log:\n{log}");
        assert!(
            log.contains(&format!("{} is damaged", db.display()))
                && log.contains("--rebuild-from-peers")
                && log.contains("tb-controller restore"),
            "{how}: the message names the file and what to do; log:\n{log}"
        );
        assert!(!log.contains("tb-controller serving"), "{how}: {log}");
    }
    // The good file starts again: nothing was changed by the refusals but the damage.
    std::fs::write(&db, &good).expect("put the good file back");
    cluster.restart(0).await;
    let list = cluster
        .client()
        .list("Model", &ns, 0, BUDGET)
        .await
        .expect("list");
    assert_eq!(list.objects_json.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_damaged_database_is_rebuilt_from_its_peers() {
    // Snapshots every 20 entries, 5 kept after: the rebuilt member needs a snapshot.
    let mut cluster =
        Cluster::start("corrupt-rebuild", ClusterOptions::new(3).snapshots(20, 5)).await;
    let ns = unique_namespace("cd");
    write_models(&cluster, &ns, 60).await;
    let leader = cluster.leader_index().await;
    let victim = (leader + 1) % 3;
    let db = db_of(&cluster, victim);
    let _ = cluster
        .member_mut(victim)
        .terminate(Duration::from_secs(10))
        .await;
    scribble(&db);
    // Writes the victim misses while it is down.
    write_models(&cluster, &format!("{ns}-late"), 10).await;

    step!(
        "restarting controller {} with --rebuild-from-peers",
        victim + 1
    );
    cluster
        .member_mut(victim)
        .config_mut()
        .extra_args
        .push("--rebuild-from-peers".into());
    cluster.restart(victim).await;
    wait::expect(
        "the rebuilt member to say it was caught up",
        Duration::from_secs(60),
        || {
            let log = cluster.member(victim).log();
            async move {
                if log.contains("rebuilt from peers: caught up by the leader") {
                    Ok(())
                } else {
                    Err("not yet")
                }
            }
        },
    )
    .await;
    let log = cluster.member(victim).log();
    for said in [
        "the database is damaged; rebuilding this member from its peers",
        "removed this member from the cluster while it has no state",
        "moved the damaged database aside",
        "snapshot installed",
    ] {
        assert!(log.contains(said), "the log says {said:?}:\n{log}");
    }
    let aside: Vec<_> = std::fs::read_dir(db.parent().expect("data dir"))
        .expect("ls")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("tb.redb.damaged-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "the damaged file is kept aside");

    // A voter again, holding every write, the ones it missed included.
    let status = cluster.status().await;
    let me = status
        .members
        .iter()
        .find(|m| m.id == cluster.member(victim).id())
        .expect("listed");
    assert_eq!(me.role, "voter", "{status:?}");
    let client = cluster.client();
    let addr = cluster.addr(victim);
    for (namespace, n) in [(ns.clone(), 60), (format!("{ns}-late"), 10)] {
        let list = client
            .list_on(&addr, "Model", &namespace, true)
            .await
            .expect("a stale list on the rebuilt member");
        assert_eq!(list.objects_json.len(), n, "{namespace}");
    }
    // And it counts towards a majority: with the third member down, writes still commit.
    let other = (0..3).find(|&i| i != victim && i != leader).expect("third");
    cluster.kill(other);
    client
        .apply(
            &[model(&ns, "after", "x")],
            &request_id(),
            victim,
            Duration::from_secs(30),
        )
        .await
        .expect("a write with the rebuilt member as the majority's second");
}
