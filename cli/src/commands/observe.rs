//! List-then-watch of one kind, for the verbs that wait on the cluster (`wait`, `drain`,
//! `events -w`): keep an up-to-date copy of the matching objects and hand every change to a
//! step function until it says it is done.
//!
//! The copy and the watch are a [`tb_client::Informer`] (list, watch from the list's version,
//! resume elsewhere on a broken stream, list again on OUT_OF_RANGE). With a deadline, an
//! unreachable cluster is retried until the deadline; without one, it ends the loop with the
//! client's error.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use anyhow::Result;
use tb_api::Object;
use tb_client::informer::{Change, Informer, InformerError};
use tokio::time::Instant;
use tonic::Code;

use super::Ctx;
use crate::client::RpcError;

pub use tb_client::informer::{Key, Scope};

/// Pause before listing or watching again after the cluster was unreachable.
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// What a step sees: every matching object, the changes that led there, and whether this is
/// the first list (whose changes are all ADDED).
pub struct View<'a> {
    pub objects: &'a BTreeMap<Key, Object>,
    pub changes: &'a [Change],
    pub initial: bool,
}

/// Follow `scope` until `step` returns `Some`, or `deadline` passes (`Ok(None)`).
pub async fn observe<T, F>(
    ctx: &mut Ctx,
    scope: &Scope,
    deadline: Option<Instant>,
    mut step: F,
) -> Result<Option<T>>
where
    F: FnMut(View<'_>) -> Result<Option<T>>,
{
    let mut informer = Informer::new(scope.clone());
    loop {
        let batch = match bounded(deadline, informer.next(ctx.client())).await {
            None => return Ok(None),
            Some(Ok(batch)) => batch,
            Some(Err(InformerError::Rpc(e))) if deadline.is_some() && retryable(&e) => {
                tracing::info!(error = %e, "listing or watching failed; retrying");
                pause(deadline).await;
                continue;
            }
            Some(Err(InformerError::Rpc(e))) => return Err(e.into()),
            Some(Err(InformerError::Malformed(e))) => {
                return Err(
                    anyhow::Error::new(e).context("the server sent an object tbctl cannot read")
                );
            }
        };
        // A watch event that changed nothing new is not returned; a list always is, so the
        // step sees the first state even when it is empty.
        let view = View {
            objects: informer.objects(),
            changes: &batch.changes,
            initial: batch.initial,
        };
        if let Some(t) = step(view)? {
            return Ok(Some(t));
        }
    }
}

/// Whether waiting longer might help: no controller answered, or none had a leader.
fn retryable(e: &RpcError) -> bool {
    matches!(e.code, Code::Unavailable | Code::DeadlineExceeded)
}

/// Run `fut` until the deadline; `None` if the deadline came first.
async fn bounded<T>(deadline: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

async fn pause(deadline: Option<Instant>) {
    let until = Instant::now() + RETRY_DELAY;
    let until = deadline.map_or(until, |d| d.min(until));
    tokio::time::sleep_until(until).await;
}
