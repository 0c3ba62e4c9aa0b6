//! The replicated store under failure: three controllers on loopback take concurrent writes
//! while the leader is SIGKILLed and restarted, then the whole cluster is SIGKILLed and
//! restarted from its data directories, and a fourth controller joins after the log has been
//! purged by snapshots. Also: a member cut off from the majority refuses writes and
//! linearizable reads (but serves stale ones), and SIGTERM stops a controller cleanly even
//! with watches open.
//!
//! Writers retry a write whose outcome is unknown on another member with the same
//! `request_id`, until it is acknowledged. Each writer owns a few objects and changes one spec
//! field on every write, so the answers are predictable: the k-th write to an object must say
//! `created` (k = 1) or `configured` with `generation == k`. A write applied twice would answer
//! `unchanged` or skip a generation; a lost one would leave an older value or generation behind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use tb_tests::objects::{model, model_value, parse, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions, step, wait};

/// How long one write may take, retries included, before the test gives up on it.
const WRITE_BUDGET: Duration = Duration::from_secs(30);
/// How long members may take to apply the same log after the writes.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// One acknowledged write.
#[derive(Debug, Clone)]
struct Ack {
    name: String,
    value: String,
    outcome: String,
    generation: u64,
    resource_version: u64,
}

/// What an object must look like after all acknowledged writes.
#[derive(Debug, Clone, PartialEq)]
struct Expected {
    value: String,
    generation: u64,
    resource_version: u64,
}

/// Writer `w` applies `writes` writes round-robin over `objects` Models it owns, each through a
/// random member, and returns the acknowledgements in order.
async fn writer(
    client: Arc<Client>,
    ns: String,
    w: usize,
    writes: usize,
    objects: usize,
    acked: Arc<AtomicUsize>,
) -> Vec<Ack> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
    let mut acks = Vec::with_capacity(writes);
    for step in 0..writes {
        let name = format!("w{w}-{}", step % objects);
        let value = format!("w{w}-s{step}");
        let request_id = format!("{ns}-w{w}-s{step}");
        let first = rng.random_range(0..client.addrs().len());
        let resp = client
            .apply(
                &[model(&ns, &name, &value)],
                &request_id,
                first,
                WRITE_BUDGET,
            )
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "write {request_id} not acknowledged: {}: {}",
                    e.code(),
                    e.message()
                )
            });
        assert_eq!(resp.results.len(), 1, "{resp:?}");
        let obj = parse(&resp.results[0].object_json);
        acks.push(Ack {
            name,
            value,
            outcome: resp.results[0].outcome.clone(),
            generation: obj.metadata.generation,
            resource_version: obj.metadata.resource_version,
        });
        acked.fetch_add(1, Ordering::SeqCst);
    }
    acks
}

/// Check every answer against what the write sequence implies; return the final expectation
/// per object.
fn check_acks(acks: &[Ack]) -> BTreeMap<String, Expected> {
    let mut expected: BTreeMap<String, Expected> = BTreeMap::new();
    let mut versions = BTreeSet::new();
    for ack in acks {
        assert!(
            versions.insert(ack.resource_version),
            "two acknowledged writes share resourceVersion {}: {ack:?}",
            ack.resource_version
        );
        let k = expected.get(&ack.name).map_or(1, |e| e.generation + 1);
        let want_outcome = if k == 1 { "created" } else { "configured" };
        assert_eq!(
            ack.outcome, want_outcome,
            "write #{k} to {}: {ack:?}",
            ack.name
        );
        assert_eq!(
            ack.generation, k,
            "write #{k} to {} left the wrong generation: {ack:?}",
            ack.name
        );
        if let Some(prev) = expected.get(&ack.name) {
            assert!(
                ack.resource_version > prev.resource_version,
                "resourceVersion went backwards on {}: {prev:?} then {ack:?}",
                ack.name
            );
        }
        expected.insert(
            ack.name.clone(),
            Expected {
                value: ack.value.clone(),
                generation: ack.generation,
                resource_version: ack.resource_version,
            },
        );
    }
    expected
}

/// Check a member's list of Models against the expectation.
fn check_objects(member: u64, objects: &[Value], expected: &BTreeMap<String, Expected>) {
    let mut seen = BTreeSet::new();
    for json in objects {
        let obj = parse(&json.to_string());
        let name = obj.metadata.name.clone();
        assert!(
            seen.insert(name.clone()),
            "member {member} lists {name} twice"
        );
        let Some(want) = expected.get(&name) else {
            panic!("member {member} has {name}, which nobody wrote");
        };
        assert_eq!(
            model_value(&obj).as_ref(),
            Some(&want.value),
            "member {member}: {name} lost a write"
        );
        assert_eq!(
            obj.metadata.generation, want.generation,
            "member {member}: {name} has the wrong generation"
        );
        assert!(
            obj.metadata.resource_version >= want.resource_version,
            "member {member}: {name} is older than its last acknowledged write"
        );
    }
    let missing: Vec<&String> = expected.keys().filter(|n| !seen.contains(*n)).collect();
    assert!(missing.is_empty(), "member {member} is missing {missing:?}");
}

/// Stale (local) lists from every running member, which must all be identical; returns one.
async fn identical_lists(cluster: &mut Cluster, ns: &str) -> Vec<Value> {
    let running = cluster.running();
    let mut first: Option<(u64, Vec<Value>)> = None;
    for i in running {
        let id = cluster.member(i).id();
        let list = cluster.stale_list(i, "Model", ns).await;
        match &first {
            None => first = Some((id, list)),
            Some((id0, list0)) => assert!(
                &list == list0,
                "members {id0} and {id} hold different objects:\n{id0}: {list0:#?}\n{id}: {list:#?}"
            ),
        }
    }
    first.map(|(_, l)| l).unwrap_or_default()
}

/// A linearizable list of Models on member `i` specifically, waiting for it to be able to serve one.
async fn linearizable_list_on(cluster: &Cluster, i: usize, ns: &str) -> Vec<Value> {
    let client = cluster.client();
    let addr = cluster.addr(i);
    let resp = wait::expect(
        &format!("a linearizable list on {addr}"),
        Duration::from_secs(30),
        || {
            let client = client.clone();
            let addr = addr.clone();
            let ns = ns.to_string();
            async move { client.list_on(&addr, "Model", &ns, false).await }
        },
    )
    .await;
    resp.objects_json
        .iter()
        .map(|j| serde_json::from_str(j).expect("valid JSON"))
        .collect()
}

/// Wait until at least `n` writes are acknowledged.
async fn wait_acked(acked: &AtomicUsize, n: usize) {
    wait::expect(
        &format!("{n} acknowledged writes"),
        Duration::from_secs(60),
        || async {
            let done = acked.load(Ordering::SeqCst);
            if done >= n { Ok(()) } else { Err(done) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_leader_kill_and_full_restart() {
    const WRITERS: usize = 4;
    const WRITES_PER_WRITER: usize = 125;
    const OBJECTS_PER_WRITER: usize = 5;

    let mut cluster = Cluster::start("raft-kill", ClusterOptions::new(3).snapshots(50, 10)).await;
    let ns = unique_namespace("raft");
    let acked = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                cluster.client(),
                ns.clone(),
                w,
                WRITES_PER_WRITER,
                OBJECTS_PER_WRITER,
                acked.clone(),
            ))
        })
        .collect();

    // Kill the leader mid-stream; restart it while the writes go on.
    wait_acked(&acked, 150).await;
    let old_leader = cluster.leader_index().await;
    let old_leader_id = cluster.member(old_leader).id();
    cluster.kill(old_leader);
    let at_kill = acked.load(Ordering::SeqCst);
    step!("killed leader {old_leader_id} after {at_kill} acknowledged writes");
    let new_leader = cluster.leader_index().await;
    assert_ne!(new_leader, old_leader, "a killed controller cannot lead");
    wait_acked(&acked, at_kill + 100).await;
    cluster.restart(old_leader).await;

    let mut acks = Vec::new();
    for w in writers {
        acks.extend(w.await.expect("writer task"));
    }
    assert_eq!(acks.len(), WRITERS * WRITES_PER_WRITER);
    let expected = check_acks(&acks);
    assert_eq!(expected.len(), WRITERS * OBJECTS_PER_WRITER);
    step!(
        "{} writes acknowledged; waiting for the members to converge",
        acks.len()
    );

    let applied = cluster.wait_converged(CONVERGE_TIMEOUT).await;
    step!("all members applied up to {applied}");
    let before = identical_lists(&mut cluster, &ns).await;
    check_objects(0, &before, &expected);

    // Lose every process at once; the data directories must hold every acknowledged write.
    cluster.kill_all();
    cluster.restart_all().await;
    cluster.leader_index().await;
    for i in 0..cluster.len() {
        let after = linearizable_list_on(&cluster, i, &ns).await;
        assert!(
            after == before,
            "member {} after a full restart differs from before:\nbefore: {before:#?}\nafter: {after:#?}",
            cluster.member(i).id()
        );
    }
    cluster.wait_converged(CONVERGE_TIMEOUT).await;
    let after = identical_lists(&mut cluster, &ns).await;
    check_objects(0, &after, &expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_catches_up_from_a_snapshot() {
    const WRITERS: usize = 3;
    const WRITES_PER_WRITER: usize = 50;
    const OBJECTS_PER_WRITER: usize = 10;

    let mut cluster = Cluster::start("raft-join", ClusterOptions::new(3).snapshots(50, 10)).await;
    let ns = unique_namespace("join");
    let acked = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                cluster.client(),
                ns.clone(),
                w,
                WRITES_PER_WRITER,
                OBJECTS_PER_WRITER,
                acked.clone(),
            ))
        })
        .collect();
    let mut acks = Vec::new();
    for w in writers {
        acks.extend(w.await.expect("writer task"));
    }
    let expected = check_acks(&acks);
    cluster.wait_converged(CONVERGE_TIMEOUT).await;

    // 150 writes with a snapshot every 50 entries keeping 10: the leader no longer has the
    // entries from index 1, so the new member can only catch up by installing a snapshot.
    let joined = cluster.start_joiner().await;
    cluster.add_member(joined, Duration::from_secs(60)).await;
    let joined_id = cluster.member(joined).id();
    let applied = cluster.wait_converged(CONVERGE_TIMEOUT).await;
    step!("controller {joined_id} joined; all members applied up to {applied}");
    let status = cluster
        .member_view(joined)
        .await
        .unwrap_or_else(|e| panic!("status of controller {joined_id}: {e:?}"));
    assert_eq!(
        status.role, "voter",
        "controller {joined_id} was not promoted: {status:?}"
    );
    let membership = cluster.status().await;
    let voters: Vec<u64> = membership
        .members
        .iter()
        .filter(|m| m.role == "voter")
        .map(|m| m.id)
        .collect();
    assert_eq!(voters, vec![1, 2, 3, joined_id], "{membership:?}");
    let on_joined = cluster.stale_list(joined, "Model", &ns).await;
    check_objects(joined_id, &on_joined, &expected);
    identical_lists(&mut cluster, &ns).await;

    // Evidence that it came by snapshot: the new member's watch history starts at the
    // snapshot, so resuming from the first entries is refused.
    let mut objects = cluster.client().objects(&cluster.addr(joined));
    let watch = objects
        .watch(tb_api::proto::WatchRequest {
            kind: "Model".into(),
            namespace: ns.clone(),
            label_selector: String::new(),
            resource_version: 1,
        })
        .await;
    let code = match watch {
        Err(e) => e.code(),
        Ok(stream) => {
            match tokio::time::timeout(Duration::from_secs(5), stream.into_inner().message()).await
            {
                Ok(Err(e)) => e.code(),
                other => panic!(
                    "a watch from resourceVersion 1 on a member that installed a snapshot: {other:?}"
                ),
            }
        }
    };
    assert_eq!(code, tonic::Code::OutOfRange);

    // The new member takes part: writes through it reach everyone.
    let client = cluster.client();
    let resp = client
        .apply(
            &[model(&ns, "after-join", "x")],
            &tb_tests::objects::request_id(),
            joined,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write through controller {joined_id}: {e:?}"));
    assert_eq!(resp.results[0].outcome, "created");
    cluster.wait_converged(CONVERGE_TIMEOUT).await;
    let lists = identical_lists(&mut cluster, &ns).await;
    assert_eq!(lists.len(), expected.len() + 1);
}

#[tokio::test]
async fn sigterm_stops_a_controller_cleanly_and_keeps_its_data() {
    let mut cluster = Cluster::start("sigterm", ClusterOptions::new(1)).await;
    let ns = unique_namespace("term");
    let client = cluster.client();
    client
        .apply(
            &[model(&ns, "m", "kept")],
            &tb_tests::objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));

    let status = cluster
        .member_mut(0)
        .terminate(Duration::from_secs(10))
        .await;
    let status = status.expect("tb-controller did not exit within 10s of SIGTERM");
    assert!(
        status.success(),
        "tb-controller exited with {status} after SIGTERM"
    );

    cluster.restart(0).await;
    let list = linearizable_list_on(&cluster, 0, &ns).await;
    assert_eq!(list.len(), 1);
    assert_eq!(
        model_value(&parse(&list[0].to_string())).as_deref(),
        Some("kept")
    );
}

/// A controller must stop on SIGTERM even while clients hold watches open (nodelets and
/// `tbctl get -w` always do), ending those streams so the clients resume elsewhere.
#[tokio::test]
async fn sigterm_ends_open_watches_and_exits() {
    let mut cluster = Cluster::start("sigterm-watch", ClusterOptions::new(1)).await;
    let ns = unique_namespace("termw");
    let client = cluster.client();
    client
        .apply(
            &[model(&ns, "m", "v")],
            &tb_tests::objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));
    let mut objects = client.objects(&cluster.addr(0));
    let mut stream = objects
        .watch(tb_api::proto::WatchRequest {
            kind: "Model".into(),
            namespace: ns.clone(),
            label_selector: String::new(),
            resource_version: 0,
        })
        .await
        .unwrap_or_else(|e| panic!("watch: {e:?}"))
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    assert!(
        matches!(first, Ok(Ok(Some(_)))),
        "the watch should start with m: {first:?}"
    );
    // Keep reading, as a real watcher would, so the stream's end is seen.
    let reader = tokio::spawn(async move { stream.message().await.map(|m| m.map(|e| e.r#type)) });

    let status = cluster
        .member_mut(0)
        .terminate(Duration::from_secs(10))
        .await;
    let status =
        status.expect("tb-controller did not exit within 10s of SIGTERM while a watch was open");
    assert!(
        status.success(),
        "tb-controller exited with {status} after SIGTERM"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), reader).await;
    assert!(
        matches!(end, Ok(Ok(Ok(None))) | Ok(Ok(Err(_)))),
        "the watch stream should end when its controller stops: {end:?}"
    );
}

/// Without a majority, a member must refuse what needs one (writes, linearizable reads) with
/// UNAVAILABLE within a bounded time, and still serve stale reads from its copy.
#[tokio::test]
async fn a_member_without_a_majority_refuses_writes_and_linearizable_reads() {
    let mut cluster = Cluster::start("minority", ClusterOptions::new(3)).await;
    let ns = unique_namespace("minority");
    let client = cluster.client();
    client
        .apply(
            &[model(&ns, "m", "v1")],
            &tb_tests::objects::request_id(),
            0,
            WRITE_BUDGET,
        )
        .await
        .unwrap_or_else(|e| panic!("write: {e:?}"));
    cluster.wait_converged(CONVERGE_TIMEOUT).await;

    // Keep the leader, lose both followers: the leader is now a minority of one.
    let survivor = cluster.leader_index().await;
    for i in (0..cluster.len()).filter(|&i| i != survivor) {
        cluster.kill(i);
    }
    let addr = cluster.addr(survivor);
    let mut objects = client.objects(&addr);
    let bound = Duration::from_secs(20);

    let started = std::time::Instant::now();
    let read = tokio::time::timeout(
        bound,
        objects.get(tb_api::proto::GetRequest {
            kind: "Model".into(),
            namespace: ns.clone(),
            name: "m".into(),
            stale: false,
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("a linearizable read without a majority hung for {bound:?}"));
    let err = read.expect_err("a linearizable read without a majority must fail");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    step!("linearizable read refused after {:?}", started.elapsed());

    let started = std::time::Instant::now();
    let write = tokio::time::timeout(
        bound,
        objects.apply(tb_api::proto::ApplyRequest {
            objects_json: vec![model(&ns, "m", "v2").to_string()],
            dry_run: false,
            request_id: tb_tests::objects::request_id(),
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("a write without a majority hung for {bound:?}"));
    let err = write.expect_err("a write without a majority must fail");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    step!("write refused after {:?}", started.elapsed());

    let stale = client
        .get_on(&addr, "Model", &ns, "m", true)
        .await
        .unwrap_or_else(|e| panic!("a stale read must be served without a majority: {e:?}"));
    assert_eq!(model_value(&parse(&stale)).as_deref(), Some("v1"));
}
