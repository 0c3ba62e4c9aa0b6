//! `/ui/api/changes`: one Server-Sent Events stream per page saying which kinds of objects
//! changed, so the page fetches only those again — no polling.
//!
//! It is fed by the store's watch hub (the same feed as the gRPC Watch). A burst of changes (a
//! gang starting, every Mac heartbeating) is coalesced: after the first change the stream
//! waits [`COALESCE`] and sends one `changed` event naming every kind seen, so a page gets at
//! most one event per [`COALESCE`] whatever the write rate. Changes in namespaces the viewer
//! does not see are left out. When the feed falls behind or the member installs a snapshot, the
//! event says `resync` (fetch everything). Before each event the token is checked again: once
//! it is revoked or expired the stream ends with `signed-out`. At most
//! [`super::MAX_CHANGE_STREAMS`] streams are open at once.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio_stream::wrappers::ReceiverStream;

use super::rights::{Viewer, sign_in};
use super::{Dashboard, error};
use crate::store::Change;

/// How long changes are gathered into one event.
pub const COALESCE: Duration = Duration::from_millis(500);
/// A comment this often keeps proxies and the browser from closing an idle stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What one event tells the page.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub kinds: BTreeSet<String>,
    /// The feed missed changes: every kind may have changed.
    pub resync: bool,
    pub revision: u64,
}

impl Batch {
    /// Adds a change the viewer may see.
    pub fn add(&mut self, viewer: &Viewer, change: &Change) {
        self.revision = self.revision.max(change.resource_version);
        if viewer.sees(&change.object.metadata.namespace) {
            self.kinds.insert(change.object.kind.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty() && !self.resync
    }
}

pub async fn stream(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    let viewer = match sign_in(&d, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let Ok(permit) = d.change_streams.clone().try_acquire_owned() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many dashboards are open on this controller; try again later",
        );
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(4);
    let mut live = d.node.store().hub.subscribe();
    let revision = d.node.store().read().revision;
    tokio::spawn(async move {
        let _permit = permit;
        let hello = Event::default()
            .event("ready")
            .data(json!({"revision": revision}).to_string());
        if tx.send(Ok(hello)).await.is_err() {
            return;
        }
        loop {
            let mut batch = Batch::default();
            // Wait for a first change, then gather for COALESCE.
            tokio::select! {
                c = live.recv() => take(&d, &viewer, c, &mut live, &mut batch),
                _ = tx.closed() => return,
            }
            let gather = tokio::time::sleep(COALESCE);
            tokio::pin!(gather);
            loop {
                tokio::select! {
                    c = live.recv() => take(&d, &viewer, c, &mut live, &mut batch),
                    _ = &mut gather => break,
                    _ = tx.closed() => return,
                }
            }
            if sign_in(&d, &headers).is_err() {
                let _ = tx
                    .send(Ok(Event::default().event("signed-out").data("{}")))
                    .await;
                return;
            }
            if batch.is_empty() {
                continue;
            }
            let data = json!({
                "kinds": batch.kinds,
                "resync": batch.resync,
                "revision": batch.revision,
            });
            let event = Event::default().event("changed").data(data.to_string());
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// Adds what the feed gave to `batch`; a feed that fell behind or closed (a snapshot was
/// installed) makes the batch a resync, and a closed one is subscribed again.
fn take(
    d: &Dashboard,
    viewer: &Viewer,
    received: Result<Arc<Change>, RecvError>,
    live: &mut tokio::sync::broadcast::Receiver<Arc<Change>>,
    batch: &mut Batch,
) {
    match received {
        Ok(change) => batch.add(viewer, &change),
        Err(RecvError::Lagged(_)) => batch.resync = true,
        Err(RecvError::Closed) => {
            batch.resync = true;
            *live = d.node.store().hub.subscribe();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Caller;
    use crate::store::{ChangeKind, Role};

    fn change(kind: &str, namespace: &str, rv: u64) -> Change {
        let mut object = tb_api::Object {
            api_version: tb_api::API_VERSION.into(),
            kind: kind.into(),
            metadata: tb_api::ObjectMeta::default(),
            spec: serde_json::Value::Null,
            status: serde_json::Value::Null,
        };
        object.metadata.namespace = namespace.into();
        Change {
            kind: ChangeKind::Modified,
            object: Arc::new(object),
            resource_version: rv,
        }
    }

    #[test]
    fn a_batch_names_each_kind_once_and_leaves_out_unseen_namespaces() {
        let member = Viewer {
            caller: Caller::User {
                name: "m".into(),
                role: Role::Member,
                namespaces: vec!["team-a".into()],
            },
        };
        let mut batch = Batch::default();
        for c in [
            change("Node", "", 3),
            change("Node", "", 4),
            change("TrainingJob", "team-a", 5),
            change("TrainingJob", "team-b", 6),
            change("InferenceService", "team-b", 7),
        ] {
            batch.add(&member, &c);
        }
        let kinds: Vec<&str> = batch.kinds.iter().map(String::as_str).collect();
        assert_eq!(kinds, ["Node", "TrainingJob"]);
        assert_eq!(batch.revision, 7);
        let mut unseen = Batch::default();
        unseen.add(&member, &change("TrainingJob", "team-b", 8));
        assert!(unseen.is_empty(), "nothing the member sees changed");
    }
}
