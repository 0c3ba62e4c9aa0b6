//! Linearizability of writes and (non-stale) reads, checked on a recorded concurrent history.
//!
//! Four client tasks write unique values to a few "register" objects (a Model per key, the value
//! in its spec) and read them back, each operation on a random member of a three-controller
//! cluster, while the leader is SIGKILLed half-way through. Every invocation and return is
//! recorded in one log, in real-time order; the log is then split per key (linearizability is
//! local: a history is linearizable iff each object's is) and checked with stateright's
//! `LinearizabilityTester` against a sequential register.
//!
//! Failures are modelled by what they can mean:
//! - a read that failed has no effect and is left out;
//! - a write whose request could not even be sent (connection refused) is left out;
//! - any other failed write may or may not have taken effect, now or later: it stays invoked
//!   and never returns, and its client continues under a new thread id (the tester allows one
//!   operation in flight per thread).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use tb_api::proto::ApplyRequest;
use tb_tests::objects::{self, model, model_value, parse, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions, step, wait};
use tonic::{Code, Status};

/// The value every register holds before the recorded history starts.
pub(super) const INITIAL: &str = "init";

/// A client task and its incarnation: a new one after each write of unknown outcome.
pub(super) type ThreadId = (usize, usize);
type Op = RegisterOp<String>;
type Ret = RegisterRet<String>;

#[derive(Debug, Clone)]
pub(super) enum Event {
    Invoke {
        id: usize,
        thread: ThreadId,
        key: usize,
        op: Op,
    },
    Return {
        id: usize,
        ret: Ret,
    },
    /// The operation certainly had no effect (a failed read, an unsent write): drop it.
    Dropped {
        id: usize,
    },
    /// The outcome is unknown: the operation stays in flight for ever.
    Unknown {
        id: usize,
    },
}

/// The history of all clients, in the order things happened.
#[derive(Default)]
pub(super) struct History {
    events: Mutex<Vec<Event>>,
    next_id: AtomicUsize,
}

impl History {
    pub(super) fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// Record an invocation *before* the request is sent.
    pub(super) fn invoke(&self, thread: ThreadId, key: usize, op: Op) -> usize {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.push(Event::Invoke {
            id,
            thread,
            key,
            op,
        });
        id
    }

    pub(super) fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Check each key's history; `Err` describes the first key whose history is not linearizable.
pub(super) fn check(events: &[Event], initial: &str) -> Result<(), String> {
    let dropped: std::collections::HashSet<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::Dropped { id } => Some(*id),
            _ => None,
        })
        .collect();
    let mut invoked: HashMap<usize, (ThreadId, usize)> = HashMap::new();
    let mut testers: BTreeMap<usize, LinearizabilityTester<ThreadId, Register<String>>> =
        BTreeMap::new();
    let mut per_key: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for e in events {
        match e {
            Event::Invoke {
                id,
                thread,
                key,
                op,
            } if !dropped.contains(id) => {
                invoked.insert(*id, (*thread, *key));
                per_key.entry(*key).or_default().push(e);
                testers
                    .entry(*key)
                    .or_insert_with(|| LinearizabilityTester::new(Register(initial.to_string())))
                    .on_invoke(*thread, op.clone())
                    .map_err(|m| format!("malformed history: {m}"))?;
            }
            Event::Return { id, ret } => {
                let (thread, key) = invoked[id];
                per_key.entry(key).or_default().push(e);
                testers
                    .get_mut(&key)
                    .expect("invoked first")
                    .on_return(thread, ret.clone())
                    .map_err(|m| format!("malformed history: {m}"))?;
            }
            Event::Unknown { id } => {
                if let Some((_, key)) = invoked.get(id) {
                    per_key.entry(*key).or_default().push(e);
                }
            }
            Event::Invoke { .. } | Event::Dropped { .. } => {}
        }
    }
    for (key, tester) in &testers {
        if tester.serialized_history().is_none() {
            return Err(format!(
                "the history of key {key} is not linearizable ({} operations):\n{:#?}",
                tester.len(),
                per_key[key]
            ));
        }
    }
    Ok(())
}

/// Whether a failed call certainly never reached a server.
fn never_sent(e: &Status) -> bool {
    let m = e.message().to_ascii_lowercase();
    e.code() == Code::Unavailable
        && (m.contains("tcp connect error") || m.contains("connection refused"))
}

pub(super) async fn client_task(
    client: Arc<Client>,
    ns: String,
    c: usize,
    ops: usize,
    keys: usize,
    history: Arc<History>,
    done: Arc<AtomicUsize>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7 + c as u64);
    let mut incarnation = 0;
    let members = client.addrs().to_vec();
    for i in 0..ops {
        let key = rng.random_range(0..keys);
        let name = format!("reg-{key}");
        let addr = &members[rng.random_range(0..members.len())];
        if rng.random_bool(0.5) {
            let value = format!("c{c}-{i}");
            let id = history.invoke((c, incarnation), key, RegisterOp::Write(value.clone()));
            // One attempt, no retry: a failure is an operation of unknown outcome.
            let req = ApplyRequest {
                objects_json: vec![model(&ns, &name, &value).to_string()],
                dry_run: false,
                request_id: objects::request_id(),
            };
            match client.apply_on(addr, req).await {
                Ok(resp) => {
                    assert_eq!(
                        resp.results[0].outcome, "configured",
                        "write {value}: {resp:?}"
                    );
                    history.push(Event::Return {
                        id,
                        ret: RegisterRet::WriteOk,
                    });
                }
                Err(e) if never_sent(&e) => history.push(Event::Dropped { id }),
                Err(e) => {
                    assert!(
                        tb_tests::is_retryable(&e),
                        "write {value} on {addr} failed with an error that is not about availability: {e:?}"
                    );
                    history.push(Event::Unknown { id });
                    incarnation += 1;
                }
            }
        } else {
            let id = history.invoke((c, incarnation), key, RegisterOp::Read);
            match client.get_on(addr, "Model", &ns, &name, false).await {
                Ok(json) => {
                    let value =
                        model_value(&parse(&json)).unwrap_or_else(|| panic!("no value in {json}"));
                    history.push(Event::Return {
                        id,
                        ret: RegisterRet::ReadOk(value),
                    });
                }
                Err(e) => {
                    assert!(
                        tb_tests::is_retryable(&e),
                        "read on {addr} failed with an error that is not about availability: {e:?}"
                    );
                    history.push(Event::Dropped { id });
                }
            }
        }
        done.fetch_add(1, Ordering::SeqCst);
    }
}

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
            tokio::spawn(client_task(
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
