//! A linearizability checker for registers, and the one client operation that feeds it.
//!
//! Clients write unique values to "register" objects (a Model per key, the value in its spec)
//! and read them back, one attempt per operation on a chosen member. Every invocation and
//! return is recorded in one [`History`], in real-time order; [`check`] splits it per key
//! (linearizability is local: a history is linearizable iff each object's is) and checks each
//! with stateright's `LinearizabilityTester` against a sequential register.
//!
//! Failures are modelled by what they can mean:
//! - a read that failed has no effect and is left out;
//! - a write whose request could not even be sent (connection refused) is left out;
//! - any other failed write may or may not have taken effect, now or later: it stays invoked
//!   and never returns, and its client continues under a new thread id (the tester allows one
//!   operation in flight per thread).
//!
//! Used by the e2e test `linearizability` (one leader kill) and by `tb-chaos` (a thousand
//! faults), so both check with the same code.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stateright::semantics::register::Register;
pub use stateright::semantics::register::{RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use tb_api::proto::ApplyRequest;
use tonic::{Code, Status};

use crate::Client;
use crate::objects::{self, model, model_value};

/// The value a register holds before anything was written to it (also: the object is absent).
pub const INITIAL: &str = "init";

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

/// How many events of each outcome a history holds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub returned: usize,
    pub unknown: usize,
    pub dropped: usize,
}

impl Counts {
    pub fn of(events: &[Event]) -> Counts {
        let mut c = Counts::default();
        for e in events {
            match e {
                Event::Return { .. } => c.returned += 1,
                Event::Unknown { .. } => c.unknown += 1,
                Event::Dropped { .. } => c.dropped += 1,
                Event::Invoke { .. } => {}
            }
        }
        c
    }
}

/// Check each key's history; `Err` describes the first key whose history is not linearizable.
pub fn check(events: &[Event], initial: &str) -> Result<(), String> {
    let dropped: HashSet<usize> = events
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
                let Some(&(thread, key)) = invoked.get(id) else {
                    return Err(format!(
                        "malformed history: return of {id} before its invoke"
                    ));
                };
                per_key.entry(key).or_default().push(e);
                testers
                    .get_mut(&key)
                    .ok_or_else(|| format!("malformed history: no tester for key {key}"))?
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

/// What became of one recorded operation.
#[derive(Debug)]
pub enum Outcome {
    /// It returned (a write acknowledged, a read answered).
    Done,
    /// A write of unknown outcome: the caller must continue under a new thread id.
    Unknown(Status),
    /// No effect (a failed read, an unsent write).
    Dropped(Status),
}

/// One register operation, recorded in `history`, one attempt on `addr`: `write` is the value
/// to write, `None` a read. `register` names the Model (`key` identifies it in the history).
/// `Err` is an error that is not about availability (a bug: the caller decides what to do).
#[allow(clippy::too_many_arguments)]
pub async fn register_op(
    client: &Client,
    addr: &str,
    ns: &str,
    register: &str,
    key: usize,
    thread: ThreadId,
    write: Option<String>,
    history: &History,
) -> Result<Outcome, String> {
    match write {
        Some(value) => {
            let id = history.invoke(thread, key, RegisterOp::Write(value.clone()));
            let req = ApplyRequest {
                objects_json: vec![model(ns, register, &value).to_string()],
                dry_run: false,
                request_id: objects::request_id(),
            };
            match client.apply_on(addr, req).await {
                Ok(resp) => {
                    let outcome = resp.results.first().map(|r| r.outcome.as_str());
                    if !matches!(outcome, Some("configured" | "created")) {
                        return Err(format!("write {value}: unexpected answer {resp:?}"));
                    }
                    history.push(Event::Return {
                        id,
                        ret: RegisterRet::WriteOk,
                    });
                    Ok(Outcome::Done)
                }
                Err(e) if never_sent(&e) => {
                    history.push(Event::Dropped { id });
                    Ok(Outcome::Dropped(e))
                }
                Err(e) => {
                    // Record it first: whatever the caller does, the history stays well formed.
                    history.push(Event::Unknown { id });
                    if crate::is_retryable(&e) {
                        Ok(Outcome::Unknown(e))
                    } else {
                        Err(format!(
                            "write {value} on {addr} failed with an error that is not about \
                             availability: {e:?}"
                        ))
                    }
                }
            }
        }
        None => {
            let id = history.invoke(thread, key, RegisterOp::Read);
            match client.get_on(addr, "Model", ns, register, false).await {
                Ok(json) => {
                    let value = objects::parse(&json);
                    let Some(value) = model_value(&value) else {
                        history.push(Event::Dropped { id });
                        return Err(format!("no value in {json}"));
                    };
                    history.push(Event::Return {
                        id,
                        ret: RegisterRet::ReadOk(value),
                    });
                    Ok(Outcome::Done)
                }
                Err(e) if e.code() == Code::NotFound => {
                    history.push(Event::Return {
                        id,
                        ret: RegisterRet::ReadOk(INITIAL.to_string()),
                    });
                    Ok(Outcome::Done)
                }
                Err(e) => {
                    history.push(Event::Dropped { id });
                    if crate::is_retryable(&e) {
                        Ok(Outcome::Dropped(e))
                    } else {
                        Err(format!(
                            "read on {addr} failed with an error that is not about availability: \
                             {e:?}"
                        ))
                    }
                }
            }
        }
    }
}

/// One client of the registers `reg-0` … `reg-<keys-1>` (Models in namespace `ns`): `ops`
/// operations, each a write of a unique value or a read, on a random member, one attempt each,
/// recorded in `history` under thread `(c, incarnation)`, pausing `pause` after each (so that a
/// few operations span a fault that lasts seconds); `done` counts finished operations. A
/// failure must be about availability.
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
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7 + c as u64);
    let mut incarnation = 0;
    let members = client.addrs().to_vec();
    for i in 0..ops {
        let key = rng.random_range(0..keys);
        let addr = &members[rng.random_range(0..members.len())];
        let write = rng.random_bool(0.5).then(|| format!("c{c}-{i}"));
        let register = format!("reg-{key}");
        let outcome = register_op(
            &client,
            addr,
            &ns,
            &register,
            key,
            (c, incarnation),
            write,
            &history,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        if let Outcome::Unknown(_) = outcome {
            incarnation += 1;
        }
        done.fetch_add(1, Ordering::SeqCst);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checker itself must tell right from wrong, or the tests using it prove nothing.
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
}
