//! Queue: a share of the cluster (memory, Macs) with a priority and a fair-share weight.
//! Cluster-scoped; `namespaces` says whose work may use it. Queues are written by admins only,
//! so they also carry the priority policy: the highest priority a job of the queue may ask for
//! (`maxPriority`) and whose running work its jobs may preempt (`preemption`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{self, CheckResult};
use crate::duration::parse_duration;
use crate::meta::Condition;
use crate::name::validate_namespace;
use crate::quantity::Quantity;
use crate::validate::ValidationError;

/// Limits on what a queue's running work may hold at once; absent means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct QueueQuota {
    /// Unified memory, summed over the running ranks (unlimited when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Macs in use (unlimited when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macs: Option<u32>,
}

impl QueueQuota {
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.macs.is_none()
    }
}

/// The highest priority a job that belongs to no queue may ask for.
pub const UNQUEUED_MAX_PRIORITY: i32 = 0;

/// Whether a pending job may stop running work of lower priority to make room.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PreemptionPolicy {
    /// Gangs of strictly lower priority may be stopped.
    #[default]
    LowerPriority,
    /// Nothing is stopped.
    Never,
}

impl PreemptionPolicy {
    pub fn allows(self) -> bool {
        self == PreemptionPolicy::LowerPriority
    }

    fn never() -> PreemptionPolicy {
        PreemptionPolicy::Never
    }
}

/// Whose running work the queue's pending jobs may preempt (reclaiming borrowed capacity is
/// not preemption and is not limited here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct QueuePreemption {
    /// LowerPriority: a pending job may stop running gangs of strictly lower priority in its own
    /// namespace; Never: it may not.
    #[serde(default)]
    pub within_namespace: PreemptionPolicy,
    /// LowerPriority: a pending job may also stop lower-priority gangs of other namespaces; Never:
    /// it may not. Reclaiming borrowed capacity is not limited by this.
    #[serde(default = "PreemptionPolicy::never")]
    pub other_namespaces: PreemptionPolicy,
}

impl Default for QueuePreemption {
    fn default() -> Self {
        QueuePreemption {
            within_namespace: PreemptionPolicy::LowerPriority,
            other_namespaces: PreemptionPolicy::Never,
        }
    }
}

impl QueuePreemption {
    pub fn is_default(&self) -> bool {
        *self == QueuePreemption::default()
    }

    /// The policy for preempting work of `victim_namespace` for a job of `namespace`.
    pub fn towards(&self, namespace: &str, victim_namespace: &str) -> PreemptionPolicy {
        if namespace == victim_namespace {
            self.within_namespace
        } else {
            self.other_namespaces
        }
    }
}

/// A share of the cluster with a quota, a priority, a fair-share weight and the priority policy of
/// its jobs (maxPriority, preemption). Cluster-scoped; written by admins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct QueueSpec {
    /// What the queue's running work may hold at once.
    #[serde(default, skip_serializing_if = "QueueQuota::is_empty")]
    pub quota: QueueQuota,
    /// Queues with higher priority are served first and may preempt lower ones; the priority of the
    /// queue's jobs that name none.
    #[serde(default)]
    pub priority: i32,
    /// The highest spec.priority a job of this queue may ask for; a higher one is refused at apply,
    /// and a job stored before the ceiling was lowered is scheduled at the ceiling. Must be at
    /// least priority. A job in no queue may ask for at most 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-explain-note" = "default: priority"))]
    pub max_priority: Option<i32>,
    /// Whose running work the queue's pending jobs may preempt.
    #[serde(default, skip_serializing_if = "QueuePreemption::is_default")]
    pub preemption: QueuePreemption,
    /// Share of idle capacity relative to other queues.
    #[serde(default = "common::one")]
    pub weight: u32,
    /// Namespaces whose work may use this queue (any, when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// How far beyond quota the queue may borrow idle capacity (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<QueueQuota>,
    /// How quickly past usage is forgotten in fair sharing, e.g. 1h or 7d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "duration"))]
    pub fair_share_half_life: Option<String>,
}

/// What the scheduler last saw of a queue: the generation of its spec it checked, and whether
/// that spec's quota was below what the queue's running work held then (`QuotaBelowUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    #[serde(default)]
    pub observed_generation: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl QueueStatus {
    pub fn from_value(v: &serde_json::Value) -> QueueStatus {
        Self::deserialize(v).unwrap_or_default()
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            quota: QueueQuota::default(),
            priority: 0,
            max_priority: None,
            preemption: QueuePreemption::default(),
            weight: 1,
            namespaces: Vec::new(),
            borrowing_limit: None,
            fair_share_half_life: None,
        }
    }
}

impl QueueSpec {
    /// `fairShareHalfLife` in seconds (always valid in a stored object).
    pub fn fair_share_half_life_seconds(&self) -> Option<u64> {
        self.fair_share_half_life
            .as_deref()
            .and_then(|d| parse_duration(d).ok())
    }

    /// The highest priority a job of this queue may ask for (and is ordered by).
    pub fn ceiling(&self) -> i32 {
        self.max_priority.unwrap_or(self.priority)
    }

    pub(crate) fn check(&self) -> CheckResult {
        if let Some(max) = self.max_priority
            && max < self.priority
        {
            return Err(ValidationError::new(
                "maxPriority",
                format!(
                    "{max} is below the queue's priority {}: jobs that name no priority get the \
                     queue's, so the ceiling must be at least that",
                    self.priority
                ),
            ));
        }
        if self.weight == 0 {
            return Err(ValidationError::new("weight", "must be at least 1"));
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            validate_namespace(ns)
                .map_err(|m| ValidationError::new(format!("namespaces[{i}]"), m))?;
        }
        if let Some(d) = &self.fair_share_half_life {
            match parse_duration(d) {
                Ok(0) => {
                    return Err(ValidationError::new(
                        "fairShareHalfLife",
                        "must be longer than zero",
                    ));
                }
                Ok(_) => {}
                Err(m) => return Err(ValidationError::new("fairShareHalfLife", m)),
            }
        }
        Ok(())
    }
}
