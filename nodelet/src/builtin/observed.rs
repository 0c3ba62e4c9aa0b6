//! The decode speed rank 0 of a built-in service observes: tokens per second of each finished
//! stream (its tokens after the first, over the time from its first to its last), smoothed over
//! recent streams, and the context those streams held while decoding (their prompt plus half
//! their generated tokens: each token reads the KV cache of every token before it, so the rate
//! depends on it). `GET /health` reports both; the nodelet passes them on to the service's
//! status, where the placement's prediction for that context stands beside them.

use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::driver::Event;

/// Weight of the newest stream in the average.
const NEWEST: f64 = 0.3;

#[derive(Debug, Default)]
pub struct DecodeRate {
    observed: Mutex<Option<Observed>>,
}

/// The smoothed figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    pub tokens_per_second: f64,
    /// Tokens in context, on average, while decoding.
    pub context_tokens: f64,
}

impl DecodeRate {
    /// The smoothed figures, once a stream of at least two tokens has finished.
    pub fn get(&self) -> Option<Observed> {
        *self.observed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One finished stream: `prompt` tokens, then `tokens` generated, the first at `first`,
    /// the last at `last`.
    pub fn record(&self, prompt: usize, tokens: usize, first: Instant, last: Instant) {
        let secs = last.duration_since(first).as_secs_f64();
        if tokens < 2 || secs <= 0.0 {
            return;
        }
        let now = Observed {
            tokens_per_second: (tokens - 1) as f64 / secs,
            context_tokens: prompt as f64 + tokens as f64 / 2.0,
        };
        let mut r = self.observed.lock().unwrap_or_else(|e| e.into_inner());
        let smooth = |old: f64, new: f64| old * (1.0 - NEWEST) + new * NEWEST;
        *r = Some(match *r {
            Some(old) => Observed {
                tokens_per_second: smooth(old.tokens_per_second, now.tokens_per_second),
                context_tokens: smooth(old.context_tokens, now.context_tokens),
            },
            None => now,
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
                            rate.record(
                                f.prompt_tokens,
                                f.completion_tokens,
                                first,
                                Instant::now(),
                            );
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
        r.record(5, 1, t0, t0 + Duration::from_secs(1));
        assert_eq!(r.get(), None);
        r.record(100, 11, t0, t0 + Duration::from_secs(1));
        assert_eq!(
            r.get(),
            Some(Observed {
                tokens_per_second: 10.0,
                context_tokens: 105.5
            })
        );
        r.record(20, 21, t0, t0 + Duration::from_secs(1));
        let got = r.get().expect("figures");
        assert!(
            (got.tokens_per_second - (10.0 * 0.7 + 20.0 * 0.3)).abs() < 1e-9,
            "{got:?}"
        );
        assert!(
            (got.context_tokens - (105.5 * 0.7 + 30.5 * 0.3)).abs() < 1e-9,
            "{got:?}"
        );
    }
}
