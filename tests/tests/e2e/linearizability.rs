//! Linearizability of writes and (non-stale) reads, checked on a recorded concurrent history.
//!
//! Four client tasks write unique values to a few "register" objects (a Model per key, the value
//! in its spec) and read them back, each operation on a random member of a three-controller
//! cluster, while the leader is SIGKILLed half-way through. Every invocation and return is
//! recorded in one log, in real-time order, and checked by `tb_tests::linearizable` (which says
//! how failed operations count).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use stateright::semantics::register::{RegisterOp, RegisterRet};
use tb_tests::linearizable::{Event, History, check, register_client};
use tb_tests::objects::{self, model, unique_namespace};
use tb_tests::{Cluster, ClusterOptions, step, wait};

/// The value every register holds before the recorded history starts.
const INITIAL: &str = "init";

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
            tokio::spawn(register_client(
                client.clone(),
                ns.clone(),
                c,
                OPS_PER_CLIENT,
                KEYS,
                history.clone(),
                done.clone(),
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
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
    let returned = count(|e| matches!(e, Event::Return { .. }));
    let unknown = count(|e| matches!(e, Event::Unknown { .. }));
    let dropped = count(|e| matches!(e, Event::Dropped { .. }));
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

/// The checker itself must tell right from wrong, or the test above proves nothing.
#[test]
fn checker_rejects_a_stale_read_and_accepts_an_in_flight_write() {
    let w = |id, thread, v: &str| Event::Invoke {
        id,
        thread,
        key: 0,
        op: RegisterOp::Write(v.into()),
    };
    let r = |id, thread| Event::Invoke {
        id,
        thread,
        key: 0,
        op: RegisterOp::Read,
    };
    let ok = |id| Event::Return {
        id,
        ret: RegisterRet::WriteOk,
    };
    let read = |id, v: &str| Event::Return {
        id,
        ret: RegisterRet::ReadOk(v.into()),
    };

    // A write completes, then a later read returns the old value: not linearizable.
    let stale = vec![w(0, (0, 0), "x"), ok(0), r(1, (1, 0)), read(1, INITIAL)];
    assert!(check(&stale, INITIAL).is_err());

    // The same read overlapping the write may see either value.
    let overlapping = vec![w(0, (0, 0), "x"), r(1, (1, 0)), read(1, INITIAL), ok(0)];
    assert!(check(&overlapping, INITIAL).is_ok());

    // A write of unknown outcome may take effect...
    let took_effect = vec![
        w(0, (0, 0), "x"),
        Event::Unknown { id: 0 },
        r(1, (1, 0)),
        read(1, "x"),
    ];
    assert!(check(&took_effect, INITIAL).is_ok());
    // ...or not...
    let did_not = vec![
        w(0, (0, 0), "x"),
        Event::Unknown { id: 0 },
        r(1, (1, 0)),
        read(1, INITIAL),
    ];
    assert!(check(&did_not, INITIAL).is_ok());
    // ...but not both: once a read saw it, a later read cannot see the old value again.
    let flicker = vec![
        w(0, (0, 0), "x"),
        Event::Unknown { id: 0 },
        r(1, (1, 0)),
        read(1, "x"),
        r(2, (1, 0)),
        read(2, INITIAL),
    ];
    assert!(check(&flicker, INITIAL).is_err());

    // A dropped read is ignored, whatever it would have said.
    let dropped = vec![
        w(0, (0, 0), "x"),
        ok(0),
        r(1, (1, 0)),
        Event::Dropped { id: 1 },
    ];
    assert!(check(&dropped, INITIAL).is_ok());
    // Values never written cannot be read.
    let invented = vec![r(0, (0, 0)), read(0, "y")];
    assert!(check(&invented, INITIAL).is_err());
}
