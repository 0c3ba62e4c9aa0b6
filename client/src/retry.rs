//! The one retry rule of tb's clients: which failures may be retried (on the same controller or
//! another), how long to wait between rounds, and how many attempts at most.
//!
//! A refused connection is the exception to "retry until the deadline": when every member
//! refused in the same round, nothing listens at any address the caller gave (a wrong
//! `--server`, a cluster that is not running), and by default the call fails at once.
//! A long-lived caller that outlives controller restarts (the nodelet) asks for
//! [`Refused::Retry`] instead.
//!
//! A retried write is safe because every write carries a request id that stays the same across
//! its attempts: the store applies a given id once, however many controllers it reached.

use std::time::Duration;

use tonic::{Code, Status};

/// The pause after every member failed once.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between rounds.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// A bound on attempts besides the caller's deadline: a guard against a zero-time error loop.
pub const MAX_ATTEMPTS: usize = 10_000;

/// Whether another controller (or the same one a moment later) might answer differently, so
/// the same request may be sent again. Answers about the request itself (invalid, conflict, not
/// found, too large, too old) are final.
pub fn is_retryable(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded => true,
        // A call cut short (a server-side timeout, a member going down) says nothing of the data.
        Code::Cancelled => true,
        // Statuses made locally from a broken connection carry their cause, or name the
        // transport (a member killed mid-call surfaces as an h2 error); a server's own Unknown
        // or Internal answer does neither, and is final.
        Code::Unknown | Code::Internal => {
            std::error::Error::source(s).is_some() || names_the_transport(s.message())
        }
        // A member whose data disk is full refuses what it would have to write; another
        // member (or this one, once space returns) may take it. Other exhausted resources
        // (a message too large) are final.
        Code::ResourceExhausted => s.message().contains("no space left on the controller's"),
        _ => false,
    }
}

fn names_the_transport(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("h2 protocol error") || m.contains("transport error") || m.contains("connection")
}

/// What a round in which every member refused the connection means to the caller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Refused {
    /// Nothing listens: report it now (tbctl — a user waiting on a wrong address).
    #[default]
    Final,
    /// The controllers may be restarting: keep trying until the deadline (the nodelet).
    Retry,
}

/// Whether `e` or one of its causes is an OS "connection refused": nothing listens there.
pub fn is_connection_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Pauses between rounds of attempts: doubling from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`].
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// The pause to take now; the following one is longer, up to the limit.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_answers_are_final_except_unavailable_deadline_and_cancelled() {
        assert!(is_retryable(&Status::unavailable("no leader")));
        assert!(is_retryable(&Status::deadline_exceeded("slow")));
        assert!(is_retryable(&Status::cancelled("Timeout expired")));
        assert!(is_retryable(&Status::internal(
            "h2 protocol error: error reading a body from connection"
        )));
        for s in [
            Status::invalid_argument("spec.nodes: expected"),
            Status::not_found("x"),
            Status::aborted("conflict"),
            Status::out_of_range("too old"),
            Status::internal("bug"),
            Status::unknown("?"),
        ] {
            assert!(!is_retryable(&s), "{s:?}");
        }
    }

    #[test]
    fn a_refused_connection_is_found_among_the_causes() {
        #[derive(Debug)]
        struct Wrapper(std::io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("tcp connect error")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = Wrapper(std::io::ErrorKind::ConnectionRefused.into());
        assert!(is_connection_refused(&refused));
        let timed_out = Wrapper(std::io::ErrorKind::TimedOut.into());
        assert!(!is_connection_refused(&timed_out));
    }

    #[test]
    fn backoff_doubles_up_to_the_limit() {
        let mut b = Backoff::default();
        let pauses: Vec<u128> = (0..6).map(|_| b.next_pause().as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
    }
}
