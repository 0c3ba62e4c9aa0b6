//! Linearizability of writes and (non-stale) reads, checked on a recorded concurrent history.
//!
//! Four client tasks write unique values to a few "register" objects and read them back, each
//! operation on a random member of a three-controller cluster, while the leader is SIGKILLed
//! half-way through. The history and its check are `tb_tests::linearizability`'s (shared with
//! `tb-chaos`, which runs the same check across a thousand faults).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tb_tests::linearizability::{Counts, History, INITIAL, check, register_client_paced};
use tb_tests::objects::{self, model, unique_namespace};
use tb_tests::{Cluster, ClusterOptions, step, wait};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_are_linearizable_across_a_leader_kill() {
    const CLIENTS: usize = 4;
    const OPS_PER_CLIENT: usize = 45;
    const KEYS: usize = 3;

    let mut cluster = Cluster::start("linearizable", ClusterOptions::new(3)).await;
    let client = cluster.client();
    let ns = unique_namespace("lin");
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

    let history = Arc::new(History::default());
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(register_client_paced(
                client.clone(),
                ns.clone(),
                c,
                OPS_PER_CLIENT,
                KEYS,
                history.clone(),
                done.clone(),
                Duration::ZERO,
            ))
        })
        .collect();
    let half = CLIENTS * OPS_PER_CLIENT / 2;
    wait::expect(
        &format!("{half} completed operations"),
        Duration::from_secs(60),
        || async {
            let n = done.load(Ordering::SeqCst);
            if n >= half { Ok(()) } else { Err(n) }
        },
    )
    .await;
    let leader = cluster.leader_index().await;
    cluster.kill(leader);
    for t in tasks {
        t.await.expect("client task");
    }

    let events = history.events();
    let Counts {
        returned,
        unknown,
        dropped,
    } = Counts::of(&events);
    step!("history: {returned} returned, {unknown} of unknown outcome, {dropped} dropped");
    assert!(
        returned >= CLIENTS * OPS_PER_CLIENT / 2,
        "too few operations succeeded for the check to mean much: {returned}"
    );

    let checked = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || check(&events, INITIAL)),
    )
    .await
    .expect("the linearizability check did not finish within 60s")
    .expect("checker task");
    if let Err(e) = checked {
        panic!("{e}");
    }
}
