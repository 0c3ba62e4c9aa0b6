//! Admission of requests to a built-in service: at most `batch` sequences run at once and at
//! most `queue` more wait for a place; a request beyond that is refused at once (the endpoint
//! answers 429 with Retry-After) instead of waiting without bound. A request holds its
//! [`Permit`] until the driver is done with it (finished, failed, or its client gone).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the requests a service holds (running and waiting).
#[derive(Debug)]
pub struct Admission {
    limit: usize,
    outstanding: AtomicUsize,
}

/// One admitted request's place; dropping it frees the place.
#[derive(Debug)]
pub struct Permit(Arc<Admission>);

impl Admission {
    /// Room for `batch` running sequences and `queue` waiting ones.
    pub fn new(batch: usize, queue: usize) -> Arc<Admission> {
        Arc::new(Admission {
            limit: batch.max(1) + queue,
            outstanding: AtomicUsize::new(0),
        })
    }

    /// A place, or `None` when every place is taken.
    pub fn try_admit(self: &Arc<Self>) -> Option<Permit> {
        self.outstanding
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit(self.clone()))
    }

    /// Requests running or waiting now.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_come_back() {
        let a = Admission::new(2, 1);
        let p: Vec<Permit> = (0..3).map(|_| a.try_admit().expect("room")).collect();
        assert!(a.try_admit().is_none());
        assert_eq!(a.outstanding(), 3);
        drop(p);
        assert_eq!(a.outstanding(), 0);
        assert!(a.try_admit().is_some());
    }
}
