//! Raft clusters of 3 and 5 controllers inside one test process: the real `RaftNode` (openraft,
//! the redb log and state machine, forwarding and read index) over `MemoryNetwork`, which calls
//! the receiving member's handlers directly and can cut links. No sockets, so these run in
//! about a second and can partition a cluster precisely; the real-process tests
//! (tests/tests/e2e/raft_cluster.rs) keep covering TLS, restarts and durability.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tb_api::{Object, ObjectKey, ObjectMeta};
use tb_controller::raft::{MemoryNetwork, NodeId, RaftNode, RaftOptions};
use tb_controller::store::{Command, Op, Response};

struct Cluster {
    net: MemoryNetwork,
    members: BTreeMap<NodeId, Arc<RaftNode>>,
}

fn addr(id: NodeId) -> String {
    format!("controller-{id}")
}

impl Cluster {
    async fn start(n: u64, opts: &RaftOptions) -> Cluster {
        let net = MemoryNetwork::new();
        let addrs: BTreeMap<NodeId, String> = (1..=n).map(|id| (id, addr(id))).collect();
        let mut members = BTreeMap::new();
        for id in 1..=n {
            let node = RaftNode::start_in_memory(id, addr(id), opts, &net)
                .await
                .expect("member starts");
            members.insert(id, node);
        }
        for node in members.values() {
            node.bootstrap(&addrs).await.expect("bootstrap");
        }
        Cluster { net, members }
    }

    fn member(&self, id: NodeId) -> &Arc<RaftNode> {
        &self.members[&id]
    }

    /// The leader every listed member agrees on, once they agree.
    async fn agreed_leader(&self, among: &[NodeId]) -> NodeId {
        wait_for("a leader all members agree on", || {
            let seen: Vec<Option<NodeId>> = among
                .iter()
                .map(|id| self.member(*id).leader().map(|(l, _)| l))
                .collect();
            match seen[0] {
                Some(l) if among.contains(&l) && seen.iter().all(|s| *s == Some(l)) => Some(l),
                _ => None,
            }
        })
        .await
    }

    /// Take a member away for good: off the network, then stopped.
    async fn kill(&mut self, id: NodeId) {
        self.net.remove(&addr(id));
        if let Some(node) = self.members.remove(&id) {
            node.shutdown().await;
        }
    }

    async fn stop(self) {
        for node in self.members.values() {
            node.shutdown().await;
        }
    }
}

async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn queue(name: &str) -> Object {
    let obj = Object {
        api_version: "tb/v1".into(),
        kind: "Queue".into(),
        metadata: ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        spec: json!({"namespaces": ["default"], "priority": 1}),
        status: serde_json::Value::Null,
    };
    tb_api::validate_object(&obj).expect("a valid queue")
}

fn apply(name: &str) -> Command {
    Command {
        request_id: format!("apply-{name}"),
        now: chrono::Utc::now().to_rfc3339(),
        op: Op::Apply {
            objects: vec![queue(name)],
        },
        user: String::new(),
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        kind: "Queue".into(),
        namespace: String::new(),
        name: name.into(),
    }
}

fn has(node: &RaftNode, name: &str) -> bool {
    node.store().read().get(&key(name)).is_some()
}

async fn write(node: &RaftNode, name: &str) {
    let r = node.propose(apply(name)).await.expect("the write commits");
    assert!(matches!(r, Response::Applied { .. }), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_forward_writes_and_read_linearizably() {
    let cluster = Cluster::start(3, &RaftOptions::default()).await;
    let leader = cluster.agreed_leader(&[1, 2, 3]).await;
    let followers: Vec<NodeId> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();

    // A follower forwards the write to the leader and answers with the leader's result.
    write(cluster.member(followers[0]), "forwarded").await;
    // The other follower, after a read-index barrier, sees it: reads are linearizable.
    let reader = cluster.member(followers[1]);
    reader.linearize().await.expect("read index");
    assert!(has(reader, "forwarded"));

    // A retried write with the same request id is applied once.
    let again = reader.propose(apply("forwarded")).await.expect("retry");
    let first_version = match again {
        Response::Applied {
            resource_version, ..
        } => resource_version,
        other => panic!("{other:?}"),
    };
    let third = cluster
        .member(leader)
        .propose(apply("forwarded"))
        .await
        .expect("retry");
    assert!(
        matches!(third, Response::Applied { resource_version, .. } if resource_version == first_version),
        "a retried write answers as the first did: {third:?}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_survive_losing_the_leader_and_another() {
    let mut cluster = Cluster::start(5, &RaftOptions::default()).await;
    let all = [1, 2, 3, 4, 5];
    let leader = cluster.agreed_leader(&all).await;
    let term_before = cluster.member(leader).member_status().term;
    write(cluster.member(leader), "before").await;

    let other = all
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    cluster.kill(leader).await;
    cluster.kill(other).await;
    let survivors: Vec<NodeId> = cluster.members.keys().copied().collect();
    assert_eq!(survivors.len(), 3);

    let new_leader = cluster.agreed_leader(&survivors).await;
    assert_ne!(new_leader, leader);
    assert!(cluster.member(new_leader).member_status().term > term_before);
    write(cluster.member(survivors[0]), "after").await;
    for id in &survivors {
        let node = cluster.member(*id);
        node.linearize().await.expect("read index");
        assert!(has(node, "before") && has(node, "after"), "member {id}");
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_minority_commits_nothing_and_catches_up_when_healed() {
    let cluster = Cluster::start(5, &RaftOptions::default()).await;
    let all = [1, 2, 3, 4, 5];
    let old_leader = cluster.agreed_leader(&all).await;
    let old_term = cluster.member(old_leader).member_status().term;
    let minority_ids: Vec<NodeId> = std::iter::once(old_leader)
        .chain(all.into_iter().filter(|id| *id != old_leader).take(1))
        .collect();
    let majority_ids: Vec<NodeId> = all
        .into_iter()
        .filter(|id| !minority_ids.contains(id))
        .collect();
    let minority: Vec<String> = minority_ids.iter().map(|id| addr(*id)).collect();
    let majority: Vec<String> = majority_ids.iter().map(|id| addr(*id)).collect();
    cluster.net.partition(
        &minority.iter().map(String::as_str).collect::<Vec<_>>(),
        &majority.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    // The majority elects a leader of its own, in a later term, and commits.
    let new_leader = wait_for("the majority to elect a leader of its own", || {
        let l = cluster.member(majority_ids[0]).leader()?.0;
        (majority_ids.contains(&l)
            && majority_ids
                .iter()
                .all(|id| cluster.member(*id).leader().map(|(x, _)| x) == Some(l)))
        .then_some(l)
    })
    .await;
    assert!(cluster.member(new_leader).member_status().term > old_term);
    write(cluster.member(majority_ids[0]), "majority").await;

    // The old leader cannot commit: its proposal does not reach a quorum.
    let stale = tokio::time::timeout(
        Duration::from_secs(2),
        cluster.member(old_leader).propose(apply("minority")),
    )
    .await;
    assert!(
        !matches!(stale, Ok(Ok(_))),
        "a minority leader must not commit"
    );
    for id in &minority_ids {
        assert!(
            !has(cluster.member(*id), "majority"),
            "member {id} saw a write it could not have"
        );
    }

    // Healed, everyone follows the majority's leader and holds its write; the minority's
    // uncommitted write is either dropped or committed exactly once by the new leader.
    cluster.net.heal();
    let leader = cluster.agreed_leader(&all).await;
    assert!(
        majority_ids.contains(&leader) || cluster.member(leader).member_status().term > old_term
    );
    for id in all {
        let node = cluster.member(id);
        node.linearize().await.expect("read index");
        assert!(has(node, "majority"), "member {id} caught up");
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_catches_up_from_a_snapshot() {
    let opts = RaftOptions {
        snapshot_every: 20,
        keep_after_snapshot: 0,
        ..RaftOptions::default()
    };
    let mut cluster = Cluster::start(3, &opts).await;
    let leader = cluster.agreed_leader(&[1, 2, 3]).await;
    for i in 0..60 {
        write(cluster.member(leader), &format!("q{i}")).await;
    }
    // The leader's log before its last snapshot is gone: a new member must take a snapshot.
    wait_for("a snapshot and a purged log", || {
        let s = cluster.member(leader).member_status();
        (s.applied_index >= 60).then_some(())
    })
    .await;

    let newcomer = RaftNode::start_in_memory(4, addr(4), &opts, &cluster.net)
        .await
        .expect("member starts");
    cluster.members.insert(4, newcomer.clone());
    cluster
        .member(leader)
        .add_member(4, addr(4))
        .await
        .expect("added as learner, then voter");
    newcomer.linearize().await.expect("read index");
    for i in 0..60 {
        assert!(has(&newcomer, &format!("q{i}")), "q{i} on the new member");
    }
    let status = cluster.member(leader).cluster_status().await;
    let four = status
        .members
        .iter()
        .find(|m| m.id == 4)
        .expect("member 4 listed");
    assert_eq!(four.role, "voter");
    cluster.stop().await;
}
