//! Watches against real controllers: a watcher that resumes on another member after its member
//! is SIGKILLed sees exactly the changes the writers were acknowledged (none missing, none
//! repeated, in order); a watch from 0 starts with the current objects; a watch from before
//! the member's history is refused with OUT_OF_RANGE; a follower that catches up from a
//! snapshot ends the watches it serves with OUT_OF_RANGE.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tb_api::proto::{WatchEvent, WatchRequest};
use tb_tests::objects::{self, model, model_value, parse, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions, step, wait};
use tonic::{Code, Status, Streaming};

const WRITE_BUDGET: Duration = Duration::from_secs(30);
/// Longest wait for one expected event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A change as a watch reports it, or as a writer's acknowledgement implies it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    resource_version: u64,
    kind: String,
    name: String,
    /// The model's value; `None` for deletions (the last state is not compared).
    value: Option<String>,
}

fn seen_from_event(ev: &WatchEvent) -> Seen {
    let obj = parse(&ev.object_json);
    assert_eq!(
        obj.metadata.resource_version, ev.resource_version,
        "the event's resourceVersion differs from its object's: {ev:?}"
    );
    Seen {
        resource_version: ev.resource_version,
        kind: ev.r#type.clone(),
        value: (ev.r#type != "DELETED")
            .then(|| model_value(&obj))
            .flatten(),
        name: obj.metadata.name,
    }
}

async fn open_watch(
    client: &Client,
    addr: &str,
    ns: &str,
    from: u64,
) -> Result<Streaming<WatchEvent>, Status> {
    let mut c = client.objects(addr);
    let req = WatchRequest {
        kind: "Model".into(),
        namespace: ns.into(),
        label_selector: String::new(),
        resource_version: from,
    };
    match tokio::time::timeout(Duration::from_secs(5), c.watch(req)).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded("watch did not open within 5s")),
    }
}

/// The next event, failing the test if none comes within `EVENT_TIMEOUT`.
async fn next_event(stream: &mut Streaming<WatchEvent>) -> Result<WatchEvent, Status> {
    match tokio::time::timeout(EVENT_TIMEOUT, stream.message()).await {
        Ok(Ok(Some(ev))) => Ok(ev),
        Ok(Ok(None)) => Err(Status::unavailable("the watch stream ended")),
        Ok(Err(e)) => Err(e),
        Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
    }
}

/// Follows the namespace's Models from `from`, starting on member `first` and resuming on the
/// next member from the last resourceVersion seen whenever the stream breaks. Stops once it has
/// seen `target` (sent when the writers are done).
async fn follow(
    client: Arc<Client>,
    ns: String,
    first: usize,
    from: u64,
    mut target: tokio::sync::watch::Receiver<Option<u64>>,
) -> (Vec<Seen>, Vec<String>) {
    let addrs = client.addrs().to_vec();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let mut breaks = Vec::new();
    let mut last = from;
    let done = |last: u64, target: &Option<u64>| target.is_some_and(|t| last >= t);
    for attempt in 0..200usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watcher gave up: {breaks:#?}"
        );
        if done(last, &target.borrow()) {
            return (seen, breaks);
        }
        let addr = &addrs[(first + attempt) % addrs.len()];
        let mut stream = match open_watch(&client, addr, &ns, last).await {
            Ok(s) => s,
            Err(e) => {
                breaks.push(format!(
                    "open on {addr} from {last}: {}: {}",
                    e.code(),
                    e.message()
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            if done(last, &target.borrow()) {
                return (seen, breaks);
            }
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(ev)) => {
                        let s = seen_from_event(&ev);
                        last = s.resource_version;
                        seen.push(s);
                    }
                    Ok(None) => {
                        breaks.push(format!("stream on {addr} ended after {last}"));
                        break;
                    }
                    Err(e) => {
                        breaks.push(format!("stream on {addr} broke after {last}: {}: {}", e.code(), e.message()));
                        break;
                    }
                },
                _ = target.changed() => {}
                _ = tokio::time::sleep_until(deadline) => panic!("watcher timed out at {last}; target {:?}", *target.borrow()),
            }
        }
    }
    panic!("watcher reconnected too often: {breaks:#?}");
}

/// Writer `w`: applies and deletes its own Models through random members; returns the change
/// each acknowledged write made.
async fn writer(
    client: Arc<Client>,
    ns: String,
    w: usize,
    writes: usize,
    acked: Arc<AtomicUsize>,
) -> Vec<Seen> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + w as u64);
    let mut existing = BTreeSet::new();
    let mut changes = Vec::with_capacity(writes);
    for step in 0..writes {
        let request_id = format!("{ns}-w{w}-s{step}");
        let first = rng.random_range(0..client.addrs().len());
        let change = if !existing.is_empty() && rng.random_ratio(1, 5) {
            let victim: String = existing
                .iter()
                .nth(rng.random_range(0..existing.len()))
                .cloned()
                .expect("non-empty");
            let resp = client
                .delete("Model", &ns, &victim, &request_id, first, WRITE_BUDGET)
                .await
                .unwrap_or_else(|e| panic!("delete {request_id}: {e:?}"));
            existing.remove(&victim);
            Seen {
                resource_version: resp.resource_version,
                kind: "DELETED".into(),
                name: victim,
                value: None,
            }
        } else {
            let name = format!("w{w}-{}", step % 4);
            let value = format!("w{w}-s{step}");
            let resp = client
                .apply(
                    &[model(&ns, &name, &value)],
                    &request_id,
                    first,
                    WRITE_BUDGET,
                )
                .await
                .unwrap_or_else(|e| panic!("apply {request_id}: {e:?}"));
            let result = &resp.results[0];
            let kind = match (result.outcome.as_str(), existing.insert(name.clone())) {
                ("created", true) => "ADDED",
                ("configured", false) => "MODIFIED",
                (outcome, new) => {
                    panic!("apply {request_id} of {name} (new: {new}) answered {outcome}")
                }
            };
            Seen {
                resource_version: parse(&result.object_json).metadata.resource_version,
                kind: kind.into(),
                name,
                value: Some(value),
            }
        };
        changes.push(change);
        acked.fetch_add(1, Ordering::SeqCst);
    }
    changes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_across_leader_kill_without_gaps_or_repeats() {
    const WRITERS: usize = 3;
    const WRITES_PER_WRITER: usize = 50;

    let mut cluster = Cluster::start("watch-kill", ClusterOptions::new(3)).await;
    let client = cluster.client();
    let ns = unique_namespace("watch");
    for name in ["before-1", "before-2"] {
        client
            .apply(
                &[model(&ns, name, "old")],
                &objects::request_id(),
                0,
                WRITE_BUDGET,
            )
            .await
            .unwrap_or_else(|e| panic!("seed write: {e:?}"));
    }

    // Watch on the leader, from a list's resourceVersion, so that killing the leader breaks it.
    let watched = cluster.leader_index().await;
    let list = client
        .list_on(&cluster.addr(watched), "Model", &ns, false)
        .await
        .unwrap_or_else(|e| panic!("list: {e:?}"));
    assert_eq!(list.objects_json.len(), 2);
    let (target_tx, target_rx) = tokio::sync::watch::channel(None);
    let watcher = tokio::spawn(follow(
        client.clone(),
        ns.clone(),
        watched,
        list.resource_version,
        target_rx,
    ));

    let acked = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                client.clone(),
                ns.clone(),
                w,
                WRITES_PER_WRITER,
                acked.clone(),
            ))
        })
        .collect();

    wait::expect(
        "50 acknowledged writes",
        Duration::from_secs(60),
        || async {
            let n = acked.load(Ordering::SeqCst);
            if n >= 50 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    let leader = cluster.leader_index().await;
    cluster.kill(leader);
    step!(
        "killed leader {} (watched: {})",
        cluster.member(leader).id(),
        cluster.member(watched).id()
    );

    let mut expected = Vec::new();
    for w in writers {
        expected.extend(w.await.expect("writer task"));
    }
    expected.sort();
    let target = expected
        .last()
        .map(|s| s.resource_version)
        .expect("some writes");
    target_tx.send(Some(target)).expect("watcher alive");
    let (seen, breaks) = watcher.await.expect("watcher task");
    step!(
        "watcher saw {} events, resumed {} times: {breaks:#?}",
        seen.len(),
        breaks.len()
    );

    let versions: Vec<u64> = seen.iter().map(|s| s.resource_version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "events out of order or repeated: {versions:?}"
    );
    if leader == watched {
        assert!(
            !breaks.is_empty(),
            "the watched member was killed but the stream never broke"
        );
    }
    if seen != expected {
        let seen_set: BTreeSet<_> = seen.iter().collect();
        let expected_set: BTreeSet<_> = expected.iter().collect();
        let missing: Vec<_> = expected_set.difference(&seen_set).collect();
        let extra: Vec<_> = seen_set.difference(&expected_set).collect();
        panic!(
            "the watch differs from the acknowledged writes\nmissing: {missing:#?}\nunexpected: {extra:#?}\nresumptions: {breaks:#?}"
        );
    }
}

#[tokio::test]
async fn watch_from_zero_starts_with_the_current_objects() {
    let cluster = Cluster::start("watch-zero", ClusterOptions::new(1)).await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("zero");
    let other_ns = unique_namespace("other");
    let mut current = BTreeSet::new();
    for name in ["a", "b", "c"] {
        let resp = client
            .apply(
                &[model(&ns, name, "v1")],
                &objects::request_id(),
                0,
                WRITE_BUDGET,
            )
            .await
            .unwrap_or_else(|e| panic!("write: {e:?}"));
        let rv = parse(&resp.results[0].object_json)
            .metadata
            .resource_version;
        current.insert((name.to_string(), rv));
    }
    client
        .apply(
            &[model(&other_ns, "elsewhere", "v1")],
            &objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));

    let mut stream = open_watch(&client, &addr, &ns, 0)
        .await
        .unwrap_or_else(|e| panic!("watch: {e:?}"));
    let mut added = BTreeSet::new();
    for _ in 0..current.len() {
        let ev = next_event(&mut stream)
            .await
            .unwrap_or_else(|e| panic!("watch: {e:?}"));
        assert_eq!(
            ev.r#type, "ADDED",
            "a watch from 0 starts with ADDED events: {ev:?}"
        );
        let s = seen_from_event(&ev);
        added.insert((s.name, s.resource_version));
    }
    assert_eq!(
        added, current,
        "the initial events must be exactly the current objects"
    );

    // Then live changes, and only those in the namespace watched.
    client
        .apply(
            &[model(&other_ns, "elsewhere", "v2")],
            &objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));
    let resp = client
        .apply(
            &[model(&ns, "a", "v2")],
            &objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));
    let rv = parse(&resp.results[0].object_json)
        .metadata
        .resource_version;
    let ev = next_event(&mut stream)
        .await
        .unwrap_or_else(|e| panic!("watch: {e:?}"));
    assert_eq!(
        seen_from_event(&ev),
        Seen {
            resource_version: rv,
            kind: "MODIFIED".into(),
            name: "a".into(),
            value: Some("v2".into())
        }
    );
    let deleted = client
        .delete("Model", &ns, "b", &objects::request_id(), 0, WRITE_BUDGET)
        .await
        .unwrap_or_else(|e| panic!("delete: {e:?}"));
    let ev = next_event(&mut stream)
        .await
        .unwrap_or_else(|e| panic!("watch: {e:?}"));
    assert_eq!(ev.r#type, "DELETED");
    assert_eq!(seen_from_event(&ev).name, "b");
    assert_eq!(ev.resource_version, deleted.resource_version);
}

#[tokio::test]
async fn watch_from_before_the_history_is_out_of_range() {
    let mut cluster = Cluster::start("watch-old", ClusterOptions::new(1).snapshots(20, 5)).await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("old");
    for i in 0..60 {
        client
            .apply(
                &[model(&ns, &format!("m{i}"), "v")],
                &objects::request_id(),
                0,
                WRITE_BUDGET,
            )
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e:?}"));
    }
    // The member's history restarts at its snapshot when it restarts.
    wait::expect("a snapshot to be built", Duration::from_secs(20), || {
        let log = cluster.member(0).log();
        async move {
            if log.contains("snapshot built") {
                Ok(())
            } else {
                Err("no 'snapshot built' in the log")
            }
        }
    })
    .await;
    cluster.kill(0);
    cluster.restart(0).await;

    let result = match open_watch(&client, &addr, &ns, 1).await {
        Err(e) => Err(e),
        Ok(mut stream) => next_event(&mut stream).await,
    };
    let err = result
        .expect_err("a watch from resourceVersion 1 must be refused after the log was compacted");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("re-list"),
        "the error should tell the client to re-list: {err:?}"
    );

    // What the error asks for works: list, then watch from the list's version.
    let list = client
        .list("Model", &ns, 0, WRITE_BUDGET)
        .await
        .unwrap_or_else(|e| panic!("list: {e:?}"));
    assert_eq!(list.objects_json.len(), 60);
    let mut stream = open_watch(&client, &addr, &ns, list.resource_version)
        .await
        .unwrap_or_else(|e| panic!("watch from the list's version: {e:?}"));
    let resp = client
        .apply(
            &[model(&ns, "m0", "v2")],
            &objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));
    let ev = next_event(&mut stream)
        .await
        .unwrap_or_else(|e| panic!("watch: {e:?}"));
    assert_eq!(ev.r#type, "MODIFIED");
    assert_eq!(
        ev.resource_version,
        parse(&resp.results[0].object_json)
            .metadata
            .resource_version
    );
}

/// A follower that fell so far behind that it catches up by installing a snapshot ends the
/// watches it was serving with OUT_OF_RANGE: the changes the snapshot covered were never
/// published to them, and a watcher (a nodelet following its allocations) that kept streaming
/// would never hear of them.
#[tokio::test]
async fn a_follower_installing_a_snapshot_ends_its_watches_with_out_of_range() {
    let mut cluster =
        Cluster::start("watch-snapshot", ClusterOptions::new(3).snapshots(20, 5)).await;
    let client = cluster.client();
    let leader = cluster.leader_index().await;
    let follower = (leader + 1) % cluster.len();
    let addr = cluster.addr(follower);
    let ns = unique_namespace("snap");
    client
        .apply(
            &[model(&ns, "m0", "v")],
            &objects::request_id(),
            leader,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("first write: {e:?}"));
    cluster.wait_converged(Duration::from_secs(20)).await;
    let mut stream = open_watch(&client, &addr, &ns, 0)
        .await
        .unwrap_or_else(|e| panic!("watch on the follower: {e:?}"));
    let first = next_event(&mut stream).await.expect("the listing");
    assert_eq!(seen_from_event(&first).name, "m0");

    // Freeze the follower while the others write enough for the leader to purge its log.
    let pid = cluster.member(follower).pid().expect("follower pid") as i32;
    step!("SIGSTOP follower {follower} (pid {pid}); writing until the leader purges its log");
    // SAFETY: signalling a child process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let others = (follower + 1) % cluster.len();
    let purged = |cluster: &Cluster| {
        (0..cluster.len())
            .filter(|i| *i != follower)
            .all(|i| cluster.member(i).log().contains("log purged"))
    };
    let mut written = 0;
    while written < 600 && !purged(&cluster) {
        for _ in 0..40 {
            written += 1;
            let result = client
                .apply(
                    &[model(&ns, &format!("m{written}"), "v")],
                    &objects::request_id(),
                    others,
                    WRITE_BUDGET,
                )
                .await;
            if let Err(e) = result {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
                panic!("write {written}: {e:?}");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(
        purged(&cluster),
        "the others never purged their logs after {written} writes"
    );
    cluster.wait_converged(Duration::from_secs(30)).await;
    assert!(
        cluster
            .member(follower)
            .log()
            .contains("snapshot installed"),
        "the follower was expected to catch up from a snapshot"
    );
    // The stream may deliver changes published after the snapshot, then must end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let err = loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("the watch ended without telling the watcher to re-list"),
            Ok(Err(e)) => break e,
            Err(_) => panic!("the watch stayed open after its member installed a snapshot"),
        }
    };
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("re-list"), "{err:?}");
}
