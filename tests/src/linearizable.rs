//! A linearizability checker for registers: concurrent clients record every invocation and
//! return of reads and writes in one [`History`], in real-time order; [`check`] splits it per
//! key (linearizability is local: a history is linearizable iff each object's is) and checks
//! each with stateright's `LinearizabilityTester` against a sequential register.
//!
//! Failures are modelled by what they can mean:
//! - a read that failed has no effect and is left out ([`Event::Dropped`]);
//! - a write whose request could not even be sent (connection refused, [`never_sent`]) is left
//!   out;
//! - any other failed write may or may not have taken effect, now or later: it stays invoked
//!   and never returns ([`Event::Unknown`]), and its client continues under a new thread id
//!   (the tester allows one operation in flight per thread).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use tb_api::proto::ApplyRequest;
use tonic::{Code, Status};

use crate::Client;
use crate::objects::{self, model, model_value, parse};

/// A client task and its incarnation: a new one after each write of unknown outcome.
pub type ThreadId = (usize, usize);
pub type Op = RegisterOp<String>;
pub type Ret = RegisterRet<String>;

#[derive(Debug, Clone)]
pub enum Event {
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
pub struct History {
    events: Mutex<Vec<Event>>,
    next_id: AtomicUsize,
}

impl History {
    pub fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// Record an invocation *before* the request is sent.
    pub fn invoke(&self, thread: ThreadId, key: usize, op: Op) -> usize {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.push(Event::Invoke {
            id,
            thread,
            key,
            op,
        });
        id
    }

    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Check each key's history; `Err` describes the first key whose history is not linearizable.
pub fn check(events: &[Event], initial: &str) -> Result<(), String> {
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
pub fn never_sent(e: &Status) -> bool {
    let m = e.message().to_ascii_lowercase();
    e.code() == Code::Unavailable
        && (m.contains("tcp connect error") || m.contains("connection refused"))
}

/// One client of the registers `reg-0` … `reg-<keys-1>` (Models in namespace `ns`, see
/// [`crate::objects::model`]): `ops` operations, each a write of a unique value or a read, on a
/// random member, one attempt each, recorded in `history` under thread `(c, incarnation)`;
/// `done` counts finished operations. A failure must be about availability.
pub async fn register_client(
    client: Arc<Client>,
    ns: String,
    c: usize,
    ops: usize,
    keys: usize,
    history: Arc<History>,
    done: Arc<AtomicUsize>,
) {
    register_client_paced(client, ns, c, ops, keys, history, done, Duration::ZERO).await
}

/// [`register_client`], pausing `pause` after each operation (so that a few operations span a
/// fault that lasts seconds).
#[allow(clippy::too_many_arguments)]
pub async fn register_client_paced(
    client: Arc<Client>,
    ns: String,
    c: usize,
    ops: usize,
    keys: usize,
    history: Arc<History>,
    done: Arc<AtomicUsize>,
    pause: Duration,
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
                        crate::is_retryable(&e),
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
                        crate::is_retryable(&e),
                        "read on {addr} failed with an error that is not about availability: {e:?}"
                    );
                    history.push(Event::Dropped { id });
                }
            }
        }
        done.fetch_add(1, Ordering::SeqCst);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}
