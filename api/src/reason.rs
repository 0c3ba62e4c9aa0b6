//! Why an object is in the state it is: the `reason` of job, allocation, node and queue
//! statuses, of their conditions and of events. Each reason has a stable string — the one
//! stored and shown to users, never renamed — and code matches on the enum, not on text.
//! Reasons that arrive from outside (a nodelet's, a process's) stay strings until parsed with
//! [`Reason::of`]; an unknown one is kept and shown as it came.

use std::fmt;

macro_rules! reasons {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// A reason tb itself gives (see the module docs).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $( $(#[$doc])* $name, )*
        }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Reason] = &[$(Reason::$name),*];

            /// The stable string stored in statuses and events.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Reason::$name => stringify!($name), )*
                }
            }
        }
    };
}

reasons! {
    // Jobs: placement and admission.
    /// Placed: the gang's allocations exist.
    Scheduled,
    /// No set of Macs can take the gang now.
    Unschedulable,
    /// The job waits for work it preempted to stop.
    WaitingForPreemption,
    /// Stopped for higher-priority work of a queue allowed to preempt it.
    Preempted,
    /// Stopped because its queue was borrowing capacity its owner took back.
    Reclaimed,
    /// The job's queue does not exist.
    QueueNotFound,
    /// The job's queue does not take its namespace.
    QueueForbidden,
    /// The queue's quota would be exceeded.
    QuotaExceeded,
    /// A queue's quota is below what it already uses.
    QuotaBelowUsage,
    /// A queue's use is within its quota.
    WithinQuota,
    /// The service's Model object does not exist.
    ModelNotFound,
    /// The Model's file is not complete on any Mac.
    ModelIncomplete,
    /// The service's adapter is not there yet: its TrainingJob is missing, unfinished or wrote
    /// none, or the Node holding it is not Ready.
    AdapterNotReady,
    /// A built-in fine-tune's `datasetNode` is not Ready to serve the dataset.
    DatasetNotReady,
    /// Placement failed (event).
    FailedScheduling,
    // Jobs: running and ending.
    /// Every rank runs.
    Running,
    /// The gang started (event).
    Started,
    /// Every rank ended well.
    Succeeded,
    /// The job ended well (event).
    Completed,
    /// A rank ended; the gang is stopped.
    RankEnded,
    /// Waiting out the restart backoff.
    BackOff,
    /// Out of restarts.
    BackoffLimitExceeded,
    /// Ran past activeDeadlineSeconds.
    DeadlineExceeded,
    /// A new generation replaces the running ranks.
    SpecChanged,
    /// Moved off a draining Mac.
    Evicted,
    /// Deleted after its ttl (event).
    Deleted,
    /// The stored spec no longer passes validation.
    InvalidSpec,
    /// The service answers on its endpoint.
    EndpointReady,
    /// The service does not answer on its endpoint yet.
    EndpointNotReady,
    // Ranks, as nodelets report them.
    /// The program does not exist.
    ExecNotFound,
    /// The program may not be run.
    ExecPermissionDenied,
    /// A built-in stage failed.
    StageFailed,
    /// A built-in fine-tune's dataset cannot be read or has a bad line (the message names the
    /// file and line).
    DatasetInvalid,
    /// A built-in stage stopped because another stage (its process or its Mac) went away.
    PeerLost,
    /// The process ended with an error.
    Error,
    /// The process was stopped as asked.
    Stopped,
    /// The nodelet restarted and could not prove the rank was still its own.
    NodeletRestarted,
    /// The nodelet stopped the rank because no controller had accepted its heartbeats for most
    /// of the node grace period: the rank is about to be placed again elsewhere.
    Fenced,
    // Nodes.
    /// The node's heartbeats stopped; its work is placed again.
    NodeLost,
    /// The node is not ready (event).
    NodeNotReady,
    /// No heartbeat within the grace period.
    NodeStatusUnknown,
    // Schedules.
    /// The Schedule's time zone is not in the IANA database.
    UnknownTimeZone,
    /// A slot passed without a run.
    MissedSchedule,
    /// A run was skipped (concurrencyPolicy: Forbid).
    JobSkipped,
    /// A running job was replaced (concurrencyPolicy: Replace).
    JobReplaced,
    /// A run was created (event).
    SuccessfulCreate,
}

impl Reason {
    /// The reason `s` names, if tb knows it.
    pub fn of(s: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == s)
    }

    /// A rank that ends with this reason would end the same way again: no retry.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            Reason::ExecNotFound
                | Reason::ExecPermissionDenied
                | Reason::InvalidSpec
                | Reason::DatasetInvalid
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> String {
        r.as_str().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_parses_back_from_its_string() {
        for r in Reason::ALL {
            assert_eq!(Reason::of(r.as_str()), Some(*r));
            assert_eq!(r.to_string(), r.as_str());
        }
        assert_eq!(Reason::of("SomethingANodeletSaid"), None);
    }

    #[test]
    fn stored_strings_never_change() {
        // These strings are in stored statuses and in users' scripts.
        assert_eq!(
            Reason::BackoffLimitExceeded.as_str(),
            "BackoffLimitExceeded"
        );
        assert_eq!(Reason::Unschedulable.as_str(), "Unschedulable");
        assert_eq!(Reason::QuotaBelowUsage.as_str(), "QuotaBelowUsage");
        assert!(Reason::ExecNotFound.is_permanent());
        assert!(!Reason::Error.is_permanent());
    }
}
