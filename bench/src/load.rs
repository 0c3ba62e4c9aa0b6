//! The throughput experiment: `clients` concurrent writers take write numbers from one shared
//! counter until `writes` have been handed out; each write's latency is timed from the first
//! attempt to success (retries included).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{Backend, Write};
use crate::client::LeaderClient;
use crate::stats::Latencies;

#[derive(Debug, Clone)]
pub struct LoadResult {
    pub clients: usize,
    pub writes: u64,
    pub elapsed: Duration,
    /// Latencies of the writes that succeeded.
    pub latencies: Latencies,
    pub failed: u64,
    /// Attempts beyond the first, over all writes.
    pub retries: u64,
    /// The first few errors of failed writes.
    pub errors: Vec<String>,
}

impl LoadResult {
    pub fn succeeded(&self) -> u64 {
        self.latencies.len() as u64
    }

    /// Successful writes per second of wall-clock time.
    pub fn throughput(&self) -> f64 {
        self.succeeded() as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

#[derive(Default)]
struct WriterTally {
    latencies: Vec<Duration>,
    failed: u64,
    retries: u64,
    errors: Vec<String>,
}

/// Object names are `{prefix}{n:05}`, n in 0..writes.
pub async fn run<B: Backend>(
    client: Arc<LeaderClient<B>>,
    writes: u64,
    clients: usize,
    prefix: &str,
) -> LoadResult {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients.max(1))
        .map(|_| {
            let (client, next, prefix) = (client.clone(), next.clone(), prefix.to_string());
            tokio::spawn(async move {
                let mut tally = WriterTally::default();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= writes {
                        return tally;
                    }
                    let write = Write::new(format!("{prefix}{n:05}"));
                    let t = Instant::now();
                    match client.write(&write).await {
                        Ok(w) => {
                            tally.latencies.push(t.elapsed());
                            tally.retries += u64::from(w.attempts.saturating_sub(1));
                        }
                        Err(f) => {
                            tally.failed += 1;
                            tally.retries += u64::from(f.attempts.saturating_sub(1));
                            if tally.errors.len() < 3 {
                                tally.errors.push(format!("{}: {}", write.name, f.error));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let mut all = WriterTally::default();
    for task in tasks {
        match task.await {
            Ok(t) => {
                all.latencies.extend(t.latencies);
                all.failed += t.failed;
                all.retries += t.retries;
                all.errors.extend(t.errors);
            }
            Err(e) => all
                .errors
                .push(format!("a writer task ended abnormally: {e}")),
        }
    }
    let elapsed = started.elapsed();
    all.errors.truncate(5);
    LoadResult {
        clients,
        writes,
        elapsed,
        latencies: Latencies::new(all.latencies),
        failed: all.failed,
        retries: all.retries,
        errors: all.errors,
    }
}
