//! The decode speed rank 0 of a built-in service observes: tokens per second of each finished
//! stream (its tokens after the first, over the time from its first to its last), smoothed over
//! recent streams. `GET /health` reports it; the nodelet passes it on to the service's status,
//! beside the placement's prediction.

use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::driver::Event;

/// Weight of the newest stream in the average.
const NEWEST: f64 = 0.3;

#[derive(Debug, Default)]
pub struct DecodeRate {
    tokens_per_second: Mutex<Option<f64>>,
}

impl DecodeRate {
    /// The smoothed rate, once a stream of at least two tokens has finished.
    pub fn get(&self) -> Option<f64> {
        *self
            .tokens_per_second
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// One finished stream: `tokens` generated, the first at `first`, the last at `last`.
    pub fn record(&self, tokens: usize, first: Instant, last: Instant) {
        let secs = last.duration_since(first).as_secs_f64();
        if tokens < 2 || secs <= 0.0 {
            return;
        }
        let rate = (tokens - 1) as f64 / secs;
        let mut r = self
            .tokens_per_second
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *r = Some(match *r {
            Some(old) => old * (1.0 - NEWEST) + rate * NEWEST,
            None => rate,
        });
    }

    /// Passes a request's events through, timing them.
    pub fn watch(
        self: &std::sync::Arc<Self>,
        mut events: UnboundedReceiver<Event>,
    ) -> UnboundedReceiver<Event> {
        let (tx, rx) = unbounded_channel();
        let rate = self.clone();
        tokio::spawn(async move {
            let mut first = None;
            while let Some(e) = events.recv().await {
                match &e {
                    Event::Text(_) => {
                        first.get_or_insert_with(Instant::now);
                    }
                    Event::Done(f) => {
                        if let Some(first) = first {
                            rate.record(f.completion_tokens, first, Instant::now());
                        }
                    }
                    Event::Failed(_) => {}
                }
                if tx.send(e).is_err() {
                    // The client went away: dropping `events` tells the driver.
                    return;
                }
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn streams_are_averaged_and_one_token_says_nothing() {
        let r = DecodeRate::default();
        let t0 = Instant::now();
        r.record(1, t0, t0 + Duration::from_secs(1));
        assert_eq!(r.get(), None);
        r.record(11, t0, t0 + Duration::from_secs(1));
        assert_eq!(r.get(), Some(10.0));
        r.record(21, t0, t0 + Duration::from_secs(1));
        let got = r.get().expect("a rate");
        assert!((got - (10.0 * 0.7 + 20.0 * 0.3)).abs() < 1e-9, "{got}");
    }
}
