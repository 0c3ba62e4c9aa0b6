//! Usage accounting kept in the replicated state: how much memory and how many Macs each
//! (queue, namespace, user) held, in hourly buckets kept for 90 days, and each queue's decayed
//! usage for fair-share ordering.
//!
//! The leader's scheduler computes every figure (it reads the time; see
//! `scheduler::usage`) and commits a [`UsageTick`] with its plans; applying one only adds
//! integers and replaces values, so every member ends in the same ledger. A tick names the
//! ledger revision it was computed from and is refused if another tick landed first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::StoreError;

/// The width of a usage bucket.
pub const BUCKET_SECONDS: i64 = 3600;
/// How long buckets are kept.
pub const RETENTION_SECONDS: i64 = 90 * 86_400;
/// The annotation the store stamps on objects a user creates: who created it.
pub const ANNOTATION_CREATED_BY: &str = "tb/created-by";

/// Who used capacity: the queue ("" when unqueued), the namespace and the creating user
/// ("unknown" when the store did not record one).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UsageKey {
    pub queue: String,
    pub namespace: String,
    pub user: String,
}

/// What a key holds at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub memory_bytes: u64,
    pub macs: u32,
}

/// Usage over time: memory·seconds (bytes) and Mac·milliseconds. Integers, so that adding them
/// is exact on every member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub memory_byte_seconds: u64,
    pub mac_milliseconds: u64,
}

impl Amount {
    pub fn add(&mut self, other: Amount) {
        self.memory_byte_seconds = self
            .memory_byte_seconds
            .saturating_add(other.memory_byte_seconds);
        self.mac_milliseconds = self.mac_milliseconds.saturating_add(other.mac_milliseconds);
    }

    pub fn memory_gib_hours(&self) -> f64 {
        self.memory_byte_seconds as f64 / (1u64 << 30) as f64 / 3600.0
    }

    pub fn mac_hours(&self) -> f64 {
        self.mac_milliseconds as f64 / 3_600_000.0
    }
}

/// A queue's decayed memory usage (byte·seconds) as of the ledger's `until`.
pub type Shares = BTreeMap<String, u64>;

/// The accounting part of the state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// Bumped by every tick applied; a tick must name the one it was computed from.
    pub revision: u64,
    /// Accounted up to this time (RFC 3339 stamp); empty before the first tick.
    pub until: String,
    /// What each key held at `until`: the rate charged until the next tick.
    #[serde(with = "pairs")]
    pub rates: BTreeMap<UsageKey, Rate>,
    /// (bucket start, unix seconds; key) → usage in that hour.
    #[serde(with = "pairs")]
    pub buckets: BTreeMap<(i64, UsageKey), Amount>,
    /// Queue → decayed memory usage at `until`.
    pub shares: Shares,
}

/// One accounting step, computed by the leader.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageTick {
    /// The ledger revision it was computed from.
    pub revision: u64,
    /// The new `until`.
    pub until: String,
    /// Usage to add, by bucket.
    pub deltas: Vec<((i64, UsageKey), Amount)>,
    /// What each key holds from `until` on.
    pub rates: Vec<(UsageKey, Rate)>,
    /// Every queue's decayed usage at `until` (queues left out are dropped).
    pub shares: Vec<(String, u64)>,
    /// Buckets starting before this are dropped.
    pub keep_from: i64,
}

impl Ledger {
    /// Refuse a tick computed from another revision.
    pub fn check(&self, tick: &UsageTick) -> Result<(), StoreError> {
        if tick.revision == self.revision {
            Ok(())
        } else {
            Err(StoreError::Conflict {
                key: "usage ledger".into(),
                expected: tick.revision,
                current: self.revision,
            })
        }
    }

    /// Apply a tick already checked.
    pub fn apply(&mut self, tick: &UsageTick) {
        self.revision += 1;
        self.until = tick.until.clone();
        for (bucket, amount) in &tick.deltas {
            self.buckets.entry(bucket.clone()).or_default().add(*amount);
        }
        self.buckets
            .retain(|(start, _), _| *start >= tick.keep_from);
        self.rates = tick
            .rates
            .iter()
            .filter(|(_, r)| r.memory_bytes > 0 || r.macs > 0)
            .cloned()
            .collect();
        self.shares = tick.shares.iter().cloned().collect();
    }

    /// Usage since `since` (unix seconds; a bucket counts whole if it ends after it), summed
    /// by key.
    pub fn totals_since(&self, since: i64) -> BTreeMap<UsageKey, Amount> {
        let mut out: BTreeMap<UsageKey, Amount> = BTreeMap::new();
        for ((start, key), amount) in &self.buckets {
            if start + BUCKET_SECONDS > since {
                out.entry(key.clone()).or_default().add(*amount);
            }
        }
        out
    }
}

/// Maps with structured keys, serialised as lists of pairs (JSON keys must be strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S, K, V>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        S: Serializer,
        K: Serialize,
        V: Serialize,
    {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(q: &str) -> UsageKey {
        UsageKey {
            queue: q.into(),
            namespace: "default".into(),
            user: "ana".into(),
        }
    }

    #[test]
    fn ticks_add_up_prune_and_refuse_stale_revisions() {
        let mut ledger = Ledger::default();
        let amount = Amount {
            memory_byte_seconds: 10,
            mac_milliseconds: 1000,
        };
        let tick = UsageTick {
            revision: 0,
            until: "2026-06-01T01:00:00.000Z".into(),
            deltas: vec![((0, key("a")), amount), ((3600, key("a")), amount)],
            rates: vec![(key("a"), Rate::default())],
            shares: vec![("a".into(), 7)],
            keep_from: 0,
        };
        ledger.check(&tick).unwrap();
        ledger.apply(&tick);
        assert!(
            ledger.check(&tick).is_err(),
            "computed from an old revision"
        );
        assert!(ledger.rates.is_empty(), "zero rates are not kept");
        let next = UsageTick {
            revision: 1,
            deltas: vec![((3600, key("a")), amount)],
            keep_from: 3600,
            ..tick
        };
        ledger.apply(&next);
        assert_eq!(ledger.buckets.len(), 1, "the first hour was pruned");
        assert_eq!(ledger.totals_since(0)[&key("a")].memory_byte_seconds, 20);
        let json = serde_json::to_string(&ledger).unwrap();
        assert_eq!(serde_json::from_str::<Ledger>(&json).unwrap(), ledger);
    }
}
