//! Upgrades: the data dir's format version (an older data dir is read and gets its record; a
//! newer one is refused before anything in it is opened), a rolling restart of a three-member
//! cluster under concurrent reads and writes that loses no acknowledged write (checked with the
//! linearizability checker of `tb_tests::linearizability`), and the version skew controllers
//! allow nodelets: their own protocol version and the one before, no older and no newer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use stateright::semantics::register::{RegisterOp, RegisterRet};
use tb_api::version::PROTOCOL;
use tb_tests::lab::Lab;
use tb_tests::objects::{self, model, model_value, parse, unique_namespace};
use tb_tests::{Cluster, ClusterOptions, step, wait};

use tb_tests::linearizability::{Event, History, INITIAL, check, register_client_paced};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_of_a_newer_format_is_refused_and_an_older_one_is_read() {
    let mut cluster = Cluster::start("format", ClusterOptions::new(1)).await;
    let ns = unique_namespace("fmt");
    cluster
        .client()
        .apply(
            &[model(&ns, "m", "v")],
            &objects::request_id(),
            0,
            Duration::from_secs(20),
        )
        .await
        .expect("apply");
    let data_dir = cluster.member(0).config().data_dir.clone();
    let record = data_dir.join("format-version");
    assert_eq!(
        std::fs::read_to_string(&record).expect("recorded").trim(),
        "1"
    );
    let _ = cluster
        .member_mut(0)
        .terminate(Duration::from_secs(10))
        .await;

    // A data dir from before the record: read as format 1, and recorded.
    std::fs::remove_file(&record).expect("rm");
    cluster.restart(0).await;
    assert_eq!(
        std::fs::read_to_string(&record)
            .expect("recorded again")
            .trim(),
        "1"
    );
    let got = cluster
        .client()
        .get_on(&cluster.addr(0), "Model", &ns, "m", false)
        .await
        .expect("the object is still there");
    assert_eq!(model_value(&parse(&got)).as_deref(), Some("v"));
    let _ = cluster
        .member_mut(0)
        .terminate(Duration::from_secs(10))
        .await;

    // Written by a newer tb-controller: refused, untouched.
    std::fs::write(&record, "2\n").expect("write");
    let db = data_dir.join("tb.redb");
    let before = std::fs::read(&db).expect("read");
    let log_before = cluster.member(0).log().len();
    cluster.member_mut(0).restart();
    let status = wait::expect("the controller to exit", Duration::from_secs(30), || {
        let s = cluster.member_mut(0).exit_status();
        async move { s.ok_or("still running") }
    })
    .await;
    let log = cluster.member(0).log()[log_before..].to_string();
    assert!(!status.success(), "{log}");
    let want = format!(
        "data dir {} has format version 2; this tb-controller reads up to 1 — upgrade tb-controller",
        data_dir.display()
    );
    assert!(log.contains(&want), "expected {want:?} in:\n{log}");
    assert_eq!(
        std::fs::read(&db).expect("read"),
        before,
        "the database is untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_no_acknowledged_write() {
    const CLIENTS: usize = 3;
    const OPS_PER_BATCH: usize = 15;
    const KEYS: usize = 3;

    let mut cluster = Cluster::start("rolling", ClusterOptions::new(3)).await;
    let client = cluster.client();
    let ns = unique_namespace("roll");
    for key in 0..KEYS {
        client
            .apply(
                &[model(&ns, &format!("reg-{key}"), INITIAL)],
                &objects::request_id(),
                0,
                Duration::from_secs(20),
            )
            .await
            .unwrap_or_else(|e| panic!("creating register {key}: {e:?}"));
    }

    // Clients read and write in batches until told to stop; each batch's clients have ids of
    // their own, so an operation of unknown outcome never shares a thread with a later one.
    let history = Arc::new(History::default());
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (client, ns, history, done, stop) = (
            client.clone(),
            ns.clone(),
            history.clone(),
            done.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut batch = 0;
            while !stop.load(Ordering::SeqCst) {
                let tasks: Vec<_> = (0..CLIENTS)
                    .map(|j| {
                        tokio::spawn(register_client_paced(
                            client.clone(),
                            ns.clone(),
                            batch * CLIENTS + j,
                            OPS_PER_BATCH,
                            KEYS,
                            history.clone(),
                            done.clone(),
                            Duration::ZERO,
                        ))
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("client task");
                }
                batch += 1;
            }
            batch
        })
    };
    let progress = |at_least: usize| {
        let done = done.clone();
        async move {
            wait::expect(
                &format!("{at_least} completed operations"),
                Duration::from_secs(60),
                || {
                    let n = done.load(Ordering::SeqCst);
                    async move { if n >= at_least { Ok(()) } else { Err(n) } }
                },
            )
            .await
        }
    };

    progress(20).await;
    for i in 0..cluster.len() {
        let leader = cluster.leader_index().await;
        let applied = cluster
            .member_view(leader)
            .await
            .map(|v| v.applied_index)
            .unwrap_or(0);
        step!("rolling restart: stopping controller {}", i + 1);
        let stopped = cluster
            .member_mut(i)
            .terminate(Duration::from_secs(10))
            .await;
        assert!(
            stopped.is_some_and(|s| s.success()),
            "a clean stop: {stopped:?}"
        );
        // The others keep serving while it is down.
        let n = done.load(Ordering::SeqCst);
        progress(n + 10).await;
        cluster.restart(i).await;
        wait::expect(
            &format!("controller {} to catch up", i + 1),
            Duration::from_secs(30),
            || {
                let view = cluster.member_view(i);
                async move {
                    match view.await {
                        Ok(v) if v.has_leader && v.applied_index >= applied => Ok(()),
                        Ok(v) => Err(format!("applied {} of {applied}", v.applied_index)),
                        Err(e) => Err(e.message().to_string()),
                    }
                }
            },
        )
        .await;
        let n = done.load(Ordering::SeqCst);
        progress(n + 10).await;
    }
    stop.store(true, Ordering::SeqCst);
    let batches = driver.await.expect("driver");

    // One last read of every register, after everything: an acknowledged write that was lost
    // would show here, if not before.
    let members = cluster.addrs();
    for key in 0..KEYS {
        let id = history.invoke((usize::MAX, key), key, RegisterOp::Read);
        let json = client
            .get_on(
                &members[key % members.len()],
                "Model",
                &ns,
                &format!("reg-{key}"),
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("the final read of reg-{key}: {e:?}"));
        let value = model_value(&parse(&json)).expect("a value");
        history.push(Event::Return {
            id,
            ret: RegisterRet::ReadOk(value),
        });
    }

    let events = history.events();
    let returned = events
        .iter()
        .filter(|e| matches!(e, Event::Return { .. }))
        .count();
    let unknown = events
        .iter()
        .filter(|e| matches!(e, Event::Unknown { .. }))
        .count();
    step!(
        "rolling restart history: {batches} batches, {returned} returned, {unknown} of unknown outcome"
    );
    assert!(
        returned >= 50,
        "too few operations for the check to mean much: {returned}"
    );
    let checked = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::task::spawn_blocking(move || check(&events, INITIAL)),
    )
    .await
    .expect("the linearizability check did not finish within 120s")
    .expect("checker task");
    if let Err(e) = checked {
        panic!("{e}");
    }
}

/// Controllers serve nodelets of their protocol version and the one before, at join and at
/// every heartbeat; an older or a newer nodelet is refused and logs what to upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodelets_one_version_behind_are_served_and_others_refused() {
    let mut lab = Lab::start("skew", 2).await;
    let previous = (PROTOCOL - 1).to_string();
    let too_old = (PROTOCOL - 2).to_string();
    let too_new = (PROTOCOL + 1).to_string();
    let grace = tb_tests::lab::NODE_GRACE + Duration::from_secs(1);

    // N-1 at heartbeat: node-1 keeps its credential and beats as the version before.
    lab.restart_nodelet_with(0, &[("--test-protocol-version", &previous)]);
    tokio::time::sleep(grace).await;
    lab.wait_node_ready("node-1", true, Duration::from_secs(10))
        .await;
    assert!(
        !lab.nodelet_log(0).contains("heartbeat refused"),
        "{}",
        lab.nodelet_log(0)
    );

    // N-1 at join: node-2 joins again (a reinstalled Mac) as the version before.
    let rejoin = |lab: &mut Lab, version: &str| {
        let data_dir = lab.nodelet(1).data_dir.clone();
        let token = lab.dir().join(format!("rejoin-{version}.token"));
        (data_dir, token)
    };
    let (data_dir, token) = rejoin(&mut lab, &previous);
    let out = lab.tbctl_ok(&["token", "create", "--node", "node-2"]).await;
    std::fs::write(&token, out.stdout.trim()).expect("write token");
    tb_tests::lab::set_private(&token);
    lab.kill_nodelet(1);
    std::fs::remove_dir_all(&data_dir).expect("wipe node-2");
    let token_arg = token.display().to_string();
    lab.restart_nodelet_with(
        1,
        &[
            ("--join-token-file", &token_arg),
            ("--test-protocol-version", &previous),
        ],
    );
    wait::expect("node-2 to join again", Duration::from_secs(30), || {
        let log = lab.nodelet_log(1);
        async move {
            if log.matches("joined the cluster").count() >= 2 {
                Ok(())
            } else {
                Err("not yet")
            }
        }
    })
    .await;
    lab.wait_node_ready("node-2", true, Duration::from_secs(10))
        .await;

    // N-2 at heartbeat: refused, logged, and the Node goes NotReady.
    lab.restart_nodelet_with(0, &[("--test-protocol-version", &too_old)]);
    wait::expect("node-1 to log the refusal", Duration::from_secs(30), || {
        let log = lab.nodelet_log(0);
        async move {
            if log.contains("heartbeat refused") && log.contains("upgrade tb-nodelet") {
                Ok(())
            } else {
                Err("not yet")
            }
        }
    })
    .await;
    lab.wait_node_ready("node-1", false, Duration::from_secs(30))
        .await;

    // N+1 at join: refused; the nodelet stops and says to upgrade the controllers first.
    let (data_dir, token) = rejoin(&mut lab, &too_new);
    let out = lab.tbctl_ok(&["token", "create", "--node", "node-2"]).await;
    std::fs::write(&token, out.stdout.trim()).expect("write token");
    tb_tests::lab::set_private(&token);
    lab.kill_nodelet(1);
    std::fs::remove_dir_all(&data_dir).expect("wipe node-2");
    let token_arg = token.display().to_string();
    lab.restart_nodelet_with(
        1,
        &[
            ("--join-token-file", &token_arg),
            ("--test-protocol-version", &too_new),
        ],
    );
    let status = wait::expect("node-2 to stop", Duration::from_secs(30), || {
        let s = lab.nodelet_exit_status(1);
        async move { s.ok_or("still running") }
    })
    .await;
    let log = lab.nodelet_log(1);
    assert!(!status.success(), "{log}");
    assert!(log.contains("upgrade the controllers first"), "{log}");
}
