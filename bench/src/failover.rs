//! The failover experiment: with the client pointed at the leader, SIGKILL the leader and time
//! until the client's next write succeeds through another member. The killed member is then
//! restarted on its data dir and the cluster is let settle (one leader, everyone caught up)
//! before the next round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::backend::{Backend, Write};
use crate::client::{ClientOptions, LeaderClient};
use crate::cluster::Cluster;

/// How one round went.
#[derive(Debug, Clone)]
pub struct Round {
    pub killed: String,
    /// Kill to first successful write; `Err` with the last error if none succeeded.
    pub outcome: Result<Duration, String>,
    pub attempts: u32,
}

/// Kill the leader `rounds` times, appending each round to `out` as it ends (so rounds done
/// before an error are kept). `settle` bounds each wait for a healthy cluster.
pub async fn run<B: Backend>(
    out: &mut Vec<Round>,
    cluster: &mut Cluster<B>,
    rounds: usize,
    settle: Duration,
) -> anyhow::Result<()> {
    // Short attempts: a write parked on a member that has not yet noticed the leader is gone
    // is abandoned quickly and the client looks for the new leader.
    let opts = ClientOptions {
        attempt_timeout: Duration::from_millis(1000),
        give_up_after: Duration::from_secs(30),
        poll: Duration::from_millis(10),
        probe_timeout: Duration::from_millis(1000),
    };
    let client = Arc::new(LeaderClient::new(cluster.backend.clone(), opts));
    for round in 0..rounds {
        cluster
            .wait_healthy(settle, 5)
            .await
            .with_context(|| format!("before failover round {}", round + 1))?;
        let leader = client
            .refresh()
            .await
            .with_context(|| format!("no leader before failover round {}", round + 1))?;
        // One write first, so the client's connection to the leader is warm, as a working
        // client's would be.
        let warm = Write::new(format!("failover-warm-{round}"));
        client.write(&warm).await.map_err(|f| {
            anyhow::anyhow!("write before failover round {}: {}", round + 1, f.error)
        })?;
        let killed = cluster.members[leader].name.clone();
        let write = Write::new(format!("failover-{round}"));
        eprintln!(
            "[{}]   {} kill -9 {killed} (the leader)",
            cluster.backend.name(),
            chrono::Utc::now().format("%H:%M:%S%.3f")
        );
        let started = Instant::now();
        cluster.kill(leader).await?;
        let result = client.write(&write).await;
        let elapsed = started.elapsed();
        out.push(match result {
            Ok(w) => Round {
                killed,
                outcome: Ok(elapsed),
                attempts: w.attempts,
            },
            Err(f) => Round {
                killed,
                outcome: Err(f.error.to_string()),
                attempts: f.attempts,
            },
        });
        cluster.restart(leader)?;
    }
    cluster
        .wait_healthy(settle, 5)
        .await
        .context("after the last failover round")?;
    Ok(())
}
