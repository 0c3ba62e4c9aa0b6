//! Three members of one system and a client for them: start, wait until healthy (one leader
//! every member agrees on, everyone caught up), kill and restart a member, read memory.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::backend::{Backend, Probe};
use crate::member::Member;

/// How long one health probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

pub struct Cluster<B: Backend> {
    pub members: Vec<Member>,
    pub backend: Arc<B>,
    /// Each member's `/metrics` address, for systems that serve one the benchmark reads (tb).
    pub metrics: Vec<String>,
}

impl<B: Backend> Cluster<B> {
    pub fn new(members: Vec<Member>, backend: Arc<B>) -> Self {
        Cluster {
            members,
            backend,
            metrics: Vec::new(),
        }
    }

    pub fn spawn_all(&mut self) -> anyhow::Result<()> {
        self.members.iter_mut().try_for_each(Member::spawn)
    }

    /// Fail with the log's tail if a member that should run has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if let Some(why) = m.exited() {
                anyhow::bail!("{why}\n--- last log lines ---\n{}", m.log_tail(20));
            }
        }
        Ok(())
    }

    /// Probe every running member at once.
    pub async fn probe_all(&self) -> Vec<Option<Result<Probe, crate::backend::RpcError>>> {
        let backend = &self.backend;
        let asks = self.members.iter().enumerate().map(|(i, m)| async move {
            if m.is_running() {
                Some(backend.probe(i, PROBE_TIMEOUT).await)
            } else {
                None
            }
        });
        futures::future::join_all(asks).await
    }

    /// Wait until every running member answers, exactly one claims leadership in the highest
    /// term, all know a leader, and their applied positions are within `slack` entries, twice in
    /// a row 100 ms apart. Returns the leader's index.
    pub async fn wait_healthy(&mut self, timeout: Duration, slack: u64) -> anyhow::Result<usize> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut streak = 0;
        let mut last = String::from("no probe answered yet");
        loop {
            self.check_alive()?;
            let probes = self.probe_all().await;
            match healthy_leader(&probes, slack) {
                Ok(leader) => {
                    streak += 1;
                    if streak >= 2 {
                        return Ok(leader);
                    }
                }
                Err(why) => {
                    streak = 0;
                    last = why;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "{} cluster not healthy within {timeout:?}: {last}",
                    self.backend.name()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL member `i`.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        self.members
            .get_mut(i)
            .context("no such member")?
            .kill()
            .await
    }

    /// Start member `i` again with its old data dir.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.members.get_mut(i).context("no such member")?.spawn()
    }

    /// Every running member's memory (`None` where it could not be read).
    pub fn memory(&self) -> Vec<Option<crate::member::Memory>> {
        self.members.iter().map(|m| m.memory().ok()).collect()
    }

    /// Every member's data dir size on disk in bytes.
    pub fn disk(&self) -> Vec<Option<u64>> {
        self.members.iter().map(Member::disk_bytes).collect()
    }

    /// Stop every member (SIGKILL: the data is thrown away after the run anyway).
    pub async fn stop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill().await;
        }
    }
}

/// The decision `wait_healthy` makes on one round of probes.
fn healthy_leader(
    probes: &[Option<Result<Probe, crate::backend::RpcError>>],
    slack: u64,
) -> Result<usize, String> {
    let mut answered = Vec::new();
    for (i, p) in probes.iter().enumerate() {
        match p {
            None => {}
            Some(Err(e)) => return Err(format!("member {i}: {e}")),
            Some(Ok(p)) => answered.push((i, *p)),
        }
    }
    let top_term = answered
        .iter()
        .map(|(_, p)| p.term)
        .max()
        .ok_or("no member is running")?;
    let leaders: Vec<usize> = answered
        .iter()
        .filter(|(_, p)| p.is_leader && p.term == top_term)
        .map(|(i, _)| *i)
        .collect();
    let [leader] = leaders[..] else {
        return Err(format!(
            "{} members claim leadership in term {top_term}",
            leaders.len()
        ));
    };
    if let Some((i, _)) = answered.iter().find(|(_, p)| !p.has_leader) {
        return Err(format!("member {i} knows no leader"));
    }
    let lo = answered.iter().map(|(_, p)| p.applied).min().unwrap_or(0);
    let hi = answered.iter().map(|(_, p)| p.applied).max().unwrap_or(0);
    if hi - lo > slack {
        return Err(format!("members' applied positions differ: {lo}..{hi}"));
    }
    Ok(leader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(
        is_leader: bool,
        term: u64,
        applied: u64,
    ) -> Option<Result<Probe, crate::backend::RpcError>> {
        Some(Ok(Probe {
            is_leader,
            has_leader: true,
            term,
            applied,
        }))
    }

    #[test]
    fn one_leader_caught_up() {
        assert_eq!(
            healthy_leader(&[p(false, 2, 10), p(true, 2, 10), p(false, 2, 9)], 2),
            Ok(1)
        );
        assert_eq!(
            healthy_leader(&[p(false, 2, 10), None, p(true, 2, 10)], 2),
            Ok(2)
        );
    }

    #[test]
    fn stale_leader_or_lagging_member_is_unhealthy() {
        assert!(healthy_leader(&[p(true, 1, 10), p(false, 2, 10), p(false, 2, 10)], 2).is_err());
        assert!(healthy_leader(&[p(true, 2, 10), p(false, 2, 10), p(false, 2, 3)], 2).is_err());
    }
}
