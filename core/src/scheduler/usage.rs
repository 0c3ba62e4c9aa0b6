//! Usage accounting and fair share, computed by the leader from a snapshot and the time.
//!
//! The ledger in the state (`store::usage`) says up to when usage is accounted and what each
//! (queue, namespace, user) held since. On a pass where what is held changed, or every
//! `usage_interval` while something runs, the scheduler charges the held rates for the time
//! since, split into hourly buckets, decays each queue's usage (`2^(-Δt/half-life)`, plus the
//! exact integral of the rate over Δt) and commits the result as one tick: the state machine
//! only adds integers. Between ticks, [`shares_at`] gives the same figures for any time.

use std::collections::{BTreeMap, BTreeSet};
use std::f64::consts::LN_2;

use chrono::{DateTime, Utc};
use tb_api::Object;

use super::queues::Queues;
use super::view::ClusterView;
use super::{Clock, SchedulerConfig, parse_time};
use crate::store::usage::{
    ANNOTATION_CREATED_BY, Amount, BUCKET_SECONDS, Ledger, RETENTION_SECONDS, Rate, UsageKey,
    UsageTick,
};
use crate::store::{Plan, PlanWrite, State};

/// The user a job's usage is charged to.
pub fn user_of(job: &Object) -> String {
    job.metadata
        .annotations
        .get(ANNOTATION_CREATED_BY)
        .filter(|u| !u.is_empty())
        .cloned()
        .unwrap_or_else(|| "unknown".into())
}

/// What each key holds now: memory summed over ranks that hold resources, Macs counted once
/// per job.
pub fn current_rates(view: &ClusterView) -> BTreeMap<UsageKey, Rate> {
    let mut rates: BTreeMap<UsageKey, Rate> = BTreeMap::new();
    let mut macs: BTreeSet<(UsageKey, String, String)> = BTreeSet::new();
    for a in view.allocations.iter().filter(|a| a.holds_resources()) {
        let job_key = (
            a.spec.job.kind.clone(),
            a.object.metadata.namespace.clone(),
            a.spec.job.name.clone(),
        );
        let job = view
            .jobs
            .get(&job_key)
            .filter(|j| j.metadata.uid == a.spec.job.uid);
        let key = UsageKey {
            queue: job
                .and_then(|_| view.facts.get(&job_key)?.queue.clone())
                .unwrap_or_default(),
            namespace: a.object.metadata.namespace.clone(),
            user: job.map_or_else(|| "unknown".into(), |j| user_of(j)),
        };
        let r = rates.entry(key.clone()).or_default();
        r.memory_bytes = r.memory_bytes.saturating_add(a.spec.memory_bytes);
        macs.insert((key, a.spec.job.uid.clone(), a.spec.node.clone()));
    }
    for (key, _, _) in macs {
        if let Some(r) = rates.get_mut(&key) {
            r.macs += 1;
        }
    }
    rates
}

/// A queue's fair-share half-life in seconds: its own, else the scheduler's.
pub fn half_life_seconds(queues: &Queues, queue: &str, cfg: &SchedulerConfig) -> f64 {
    queues
        .specs
        .get(queue)
        .and_then(|q| q.fair_share_half_life_seconds())
        .filter(|s| *s > 0)
        .map_or(cfg.fair_share_half_life.num_seconds().max(1) as f64, |s| {
            s as f64
        })
}

/// `share` decayed over `dt` seconds, plus a constant `rate` (bytes) held over them.
fn decay(share: f64, rate: f64, dt: f64, half_life: f64) -> f64 {
    let d = (-dt / half_life * LN_2).exp();
    share * d + rate * half_life / LN_2 * (1.0 - d)
}

/// Each queue's decayed memory usage (byte·seconds) at `now`: the ledger's, decayed since it
/// was accounted, plus what its rates charged since. Queues that no longer exist are left out.
pub fn shares_at(
    ledger: &Ledger,
    queues: &Queues,
    now: DateTime<Utc>,
    cfg: &SchedulerConfig,
) -> BTreeMap<String, f64> {
    let dt = parse_time(&ledger.until)
        .map_or(0.0, |u| (now - u).num_milliseconds().max(0) as f64 / 1000.0);
    let mut rate: BTreeMap<&str, f64> = BTreeMap::new();
    for (k, r) in &ledger.rates {
        *rate.entry(k.queue.as_str()).or_default() += r.memory_bytes as f64;
    }
    queues
        .specs
        .keys()
        .map(|q| {
            let share = ledger.shares.get(q).copied().unwrap_or(0) as f64;
            let r = rate.get(q.as_str()).copied().unwrap_or(0.0);
            let h = half_life_seconds(queues, q, cfg);
            (q.clone(), decay(share, r, dt, h))
        })
        .collect()
}

/// Each queue's decayed usage at `now` and its half-life, for ordering.
pub fn fair_shares(
    ledger: &Ledger,
    queues: &Queues,
    now: DateTime<Utc>,
    cfg: &SchedulerConfig,
) -> super::order::FairShares {
    super::order::FairShares {
        decayed: shares_at(ledger, queues, now, cfg),
        half_life_seconds: queues
            .specs
            .keys()
            .map(|q| (q.clone(), half_life_seconds(queues, q, cfg)))
            .collect(),
    }
}

/// The start of the bucket holding unix second `t`.
fn bucket_of(t: i64) -> i64 {
    t.div_euclid(BUCKET_SECONDS) * BUCKET_SECONDS
}

/// The rates held since the ledger's `until`, charged up to `now`, by hourly bucket.
fn deltas(ledger: &Ledger, from_ms: i64, to_ms: i64) -> Vec<((i64, UsageKey), Amount)> {
    let mut out = Vec::new();
    let mut start = from_ms;
    while start < to_ms {
        let bucket = bucket_of(start.div_euclid(1000));
        let end = to_ms.min((bucket + BUCKET_SECONDS) * 1000);
        let ms = (end - start) as u128;
        for (key, r) in &ledger.rates {
            let bytes = u128::from(r.memory_bytes) * ms / 1000;
            out.push((
                (bucket, key.clone()),
                Amount {
                    memory_byte_seconds: u64::try_from(bytes).unwrap_or(u64::MAX),
                    mac_milliseconds: u64::try_from(u128::from(r.macs) * ms).unwrap_or(u64::MAX),
                },
            ));
        }
        start = end;
    }
    out
}

/// The accounting plan for this pass, if one is due: when what is held changed, or every
/// `usage_interval` while anything is held.
pub fn tick(
    state: &State,
    view: &ClusterView,
    clock: &Clock,
    cfg: &SchedulerConfig,
) -> Option<Plan> {
    let ledger = &state.usage;
    let rates = current_rates(view);
    let tick = match parse_time(&ledger.until) {
        None if rates.is_empty() => return None,
        None => UsageTick {
            revision: ledger.revision,
            until: clock.stamp.to_string(),
            rates: rates.into_iter().collect(),
            ..Default::default()
        },
        Some(until) => {
            let elapsed = clock.now - until;
            let changed = rates != ledger.rates;
            if elapsed <= chrono::TimeDelta::zero() {
                // No time to charge (or a clock behind the ledger's): only the rates move.
                return changed.then(|| Plan {
                    guards: Vec::new(),
                    writes: vec![PlanWrite::Usage(UsageTick {
                        revision: ledger.revision,
                        until: ledger.until.clone(),
                        rates: rates.into_iter().collect(),
                        shares: ledger.shares.clone().into_iter().collect(),
                        keep_from: i64::MIN,
                        ..Default::default()
                    })],
                    events: Vec::new(),
                    ..Default::default()
                });
            }
            let due = elapsed >= cfg.usage_interval && !ledger.rates.is_empty();
            if !changed && !due {
                return None;
            }
            let shares = shares_at(ledger, &view.queues, clock.now, cfg)
                .into_iter()
                .map(|(q, s)| (q, s.round() as u64))
                .filter(|(_, s)| *s > 0)
                .collect();
            UsageTick {
                revision: ledger.revision,
                until: clock.stamp.to_string(),
                deltas: deltas(
                    ledger,
                    until.timestamp_millis(),
                    clock.now.timestamp_millis(),
                ),
                rates: rates.into_iter().collect(),
                shares,
                keep_from: bucket_of(clock.now.timestamp() - RETENTION_SECONDS),
            }
        }
    };
    Some(Plan {
        guards: Vec::new(),
        writes: vec![PlanWrite::Usage(tick)],
        events: Vec::new(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_halves_per_half_life_and_integrates_the_rate() {
        assert!((decay(100.0, 0.0, 3600.0, 3600.0) - 50.0).abs() < 1e-9);
        // A small step charges about rate × dt.
        assert!((decay(0.0, 10.0, 1.0, 3600.0) - 10.0).abs() < 0.01);
    }

    #[test]
    fn deltas_split_at_the_hour() {
        let key = UsageKey {
            queue: "q".into(),
            namespace: "default".into(),
            user: "ana".into(),
        };
        let ledger = Ledger {
            rates: BTreeMap::from([(
                key.clone(),
                Rate {
                    memory_bytes: 2,
                    macs: 1,
                },
            )]),
            ..Default::default()
        };
        let d = deltas(&ledger, 3_000_000, 4_200_000);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].0.0, 0);
        assert_eq!(d[0].1.memory_byte_seconds, 2 * 600);
        assert_eq!(d[1].0.0, 3600);
        assert_eq!(d[1].1.mac_milliseconds, 600_000);
    }
}
