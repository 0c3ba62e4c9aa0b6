//! Polling with a deadline: tests wait for a condition, never for a guessed amount of time.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often conditions are re-checked.
pub const POLL: Duration = Duration::from_millis(50);

/// Call `check` every `POLL` until it returns `Ok`, or fail after `timeout` with the last
/// error, described by `what`. The loop is bounded by the deadline; each check is too.
pub async fn until<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, String>
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last = match tokio::time::timeout_at(deadline, check()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => format!("{e:?}"),
            Err(_) => "the last check did not finish before the deadline".to_string(),
        };
        if Instant::now() + POLL >= deadline {
            return Err(format!(
                "timed out after {timeout:?} ({attempts} checks) waiting for {what}; last: {last}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Like [`until`], panicking on timeout.
pub async fn expect<T, E, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    match until(what, timeout, check).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}
