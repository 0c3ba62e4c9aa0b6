//! A well-behaved client, the same for both systems: it sends every write to the member that
//! says it is the leader, and when a write fails in a way that may succeed elsewhere or later
//! (unavailable, timed out, member gone) it looks for the leader again and retries the same
//! write until a deadline. Concurrent writers share the leader they found; only one of them
//! searches at a time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, RpcError, Write};

#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    /// Deadline of one attempt.
    pub attempt_timeout: Duration,
    /// Give a write up after this long.
    pub give_up_after: Duration,
    /// Pause between leader searches that found none.
    pub poll: Duration,
    /// Deadline of one probe while searching.
    pub probe_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            attempt_timeout: Duration::from_secs(5),
            give_up_after: Duration::from_secs(30),
            poll: Duration::from_millis(10),
            probe_timeout: Duration::from_secs(1),
        }
    }
}

/// The outcome of a write that succeeded.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub attempts: u32,
}

/// A write that did not succeed, with the last error.
#[derive(Debug, Clone)]
pub struct Failed {
    pub attempts: u32,
    pub error: RpcError,
}

#[derive(Debug, Clone, Copy, Default)]
struct Cached {
    /// Bumped by every search, so a writer can tell whether someone searched since it failed.
    epoch: u64,
    leader: Option<usize>,
}

pub struct LeaderClient<B: Backend> {
    backend: Arc<B>,
    opts: ClientOptions,
    cached: Mutex<Cached>,
    searching: tokio::sync::Mutex<()>,
}

impl<B: Backend> LeaderClient<B> {
    pub fn new(backend: Arc<B>, opts: ClientOptions) -> Self {
        LeaderClient {
            backend,
            opts,
            cached: Mutex::new(Cached::default()),
            searching: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Cached {
        *self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget the leader found in `epoch` (unless someone has found another since).
    fn forget(&self, epoch: u64) {
        let mut c = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if c.epoch == epoch {
            c.leader = None;
        }
    }

    /// The member that answers that it is the leader (in the highest term if several claim).
    pub async fn search(&self) -> Option<usize> {
        let asks = (0..self.backend.endpoints())
            .map(|i| async move { (i, self.backend.probe(i, self.opts.probe_timeout).await) });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .filter_map(|(i, r)| r.ok().filter(|p| p.is_leader).map(|p| (p.term, i)))
            .max()
            .map(|(_, i)| i)
    }

    /// The leader to send to: the cached one, or a fresh search if the cache was forgotten in
    /// `seen_epoch` and nobody has searched since.
    async fn leader(&self, seen_epoch: u64) -> (u64, Option<usize>) {
        let _one_at_a_time = self.searching.lock().await;
        let c = self.cached();
        if c.leader.is_some() && c.epoch != seen_epoch {
            return (c.epoch, c.leader);
        }
        let found = self.search().await;
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        cached.epoch += 1;
        cached.leader = found;
        (cached.epoch, found)
    }

    /// Find the leader now and remember it (before a run, so the first write goes straight to it).
    pub async fn refresh(&self) -> Option<usize> {
        let epoch = self.cached().epoch;
        self.forget(epoch);
        self.leader(epoch).await.1
    }

    /// Store `write`, through the leader, retrying retryable failures until the deadline.
    pub async fn write(&self, write: &Write) -> Result<Written, Failed> {
        let deadline = Instant::now() + self.opts.give_up_after;
        let mut attempts = 0;
        let mut last = RpcError {
            retryable: true,
            message: "no member said it was the leader".into(),
        };
        loop {
            let c = self.cached();
            let (epoch, leader) = match c.leader {
                Some(l) => (c.epoch, Some(l)),
                None => self.leader(c.epoch).await,
            };
            if let Some(endpoint) = leader {
                attempts += 1;
                match self
                    .backend
                    .put(endpoint, write, self.opts.attempt_timeout)
                    .await
                {
                    Ok(()) => return Ok(Written { attempts }),
                    Err(e) if e.retryable => {
                        self.forget(epoch);
                        last = e;
                    }
                    Err(error) => return Err(Failed { attempts, error }),
                }
            }
            if Instant::now() >= deadline {
                return Err(Failed {
                    attempts,
                    error: last,
                });
            }
            if leader.is_none() {
                tokio::time::sleep(self.opts.poll).await;
            }
        }
    }
}
