//! Fencing: a nodelet cut off from every controller stops its ranks before the controllers can
//! place them again elsewhere, so two ranks of one job rank (of different epochs) never run at
//! once.
//!
//! The rule. The controllers mark a Node NotReady, and its allocations Lost, once one node grace
//! period has passed since the last heartbeat they accepted (stamped when accepted); a Lost
//! gang is placed again at once. Every heartbeat reply states that grace. The nodelet keeps a
//! lease: the time it *sent* the last heartbeat a controller accepted (never later than the
//! stamp). When [`FENCE_AT`] of the grace has passed since then with no heartbeat accepted,
//! it stops every rank it runs — SIGTERM, and SIGKILL after [`KILL_AFTER`] of the grace at the
//! latest (not the job's own stop grace: the rank must be gone before the grace ends) — and
//! reports them Lost (reason `Fenced`) once a controller answers again. The ranks are gone by
//! 7/8 of the grace; the last 1/8 covers clock rate differences and the controllers' pass.
//!
//! A nodelet that has never had a heartbeat accepted, or talks to controllers that do not
//! state their grace, has no lease and fences nothing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Fraction of the grace after which the ranks are stopped (numerator over 4).
const FENCE_AT: (u32, u32) = (3, 4);
/// Fraction of the grace a fenced rank gets between SIGTERM and SIGKILL (over 8).
const KILL_AFTER: (u32, u32) = (1, 8);

/// How a rank is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Its allocation is gone, superseded or told to stop: the job's own stop grace.
    Asked,
    /// Fenced: no controller accepted a heartbeat for `silent`; SIGKILL after `kill_after`.
    Fenced {
        silent: Duration,
        kill_after: Duration,
    },
}

/// The heartbeat lease (see the module documentation).
#[derive(Debug, Default)]
pub struct Lease {
    state: Mutex<Option<Held>>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// When the last accepted heartbeat was sent.
    sent_at: Instant,
    grace: Duration,
}

impl Lease {
    /// A heartbeat sent at `sent_at` was accepted by a controller stating `grace_ms` (0: none
    /// stated, which drops the lease).
    pub fn renewed(&self, sent_at: Instant, grace_ms: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *state = (grace_ms > 0).then(|| Held {
            sent_at: state.map_or(sent_at, |h| h.sent_at.max(sent_at)),
            grace: Duration::from_millis(grace_ms),
        });
    }

    /// At `now`, the stop to send every rank if the lease ran out, else `None`.
    pub fn expired(&self, now: Instant) -> Option<Stop> {
        let held = (*self.state.lock().unwrap_or_else(|e| e.into_inner()))?;
        let silent = now.saturating_duration_since(held.sent_at);
        (silent > held.grace * FENCE_AT.0 / FENCE_AT.1).then(|| Stop::Fenced {
            silent,
            kill_after: held.grace * KILL_AFTER.0 / KILL_AFTER.1,
        })
    }

    /// How often [`Lease::expired`] is worth asking: an eighth of the grace (at least 50 ms),
    /// or a second when there is no lease.
    pub fn check_every(&self) -> Duration {
        match *self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(h) => (h.grace / 8).max(Duration::from_millis(50)),
            None => Duration::from_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_out_three_quarters_into_the_grace_after_the_last_accepted_send() {
        let lease = Lease::default();
        let t0 = Instant::now();
        assert_eq!(
            lease.expired(t0 + Duration::from_secs(3600)),
            None,
            "no lease yet"
        );
        lease.renewed(t0, 4000);
        assert_eq!(lease.expired(t0 + Duration::from_millis(2999)), None);
        let Some(Stop::Fenced { silent, kill_after }) =
            lease.expired(t0 + Duration::from_millis(3001))
        else {
            panic!("expired three quarters into the grace");
        };
        assert_eq!(silent, Duration::from_millis(3001));
        assert_eq!(kill_after, Duration::from_millis(500));
        // An older send accepted late does not move the lease back.
        lease.renewed(t0 + Duration::from_secs(2), 4000);
        lease.renewed(t0 + Duration::from_secs(1), 4000);
        assert_eq!(lease.expired(t0 + Duration::from_millis(4999)), None);
        assert!(lease.expired(t0 + Duration::from_millis(5001)).is_some());
        // A controller that states no grace: no fencing.
        lease.renewed(t0 + Duration::from_secs(3), 0);
        assert_eq!(lease.expired(t0 + Duration::from_secs(3600)), None);
    }
}
