//! List-then-watch of one kind, for the verbs that wait on the cluster (`wait`, `drain`,
//! `events -w`): keep an up-to-date copy of the matching objects and hand every change to a
//! step function until it says it is done.
//!
//! The watch starts at the list's resourceVersion. A dropped connection fails over and resumes
//! where it was (see [`Position`]: replayed events are skipped); OUT_OF_RANGE (the version is
//! too old for the server's backlog) lists again and reports the difference as changes, so a
//! step sees every object's latest state and nothing twice. With a deadline, an unreachable cluster
//! is retried until the deadline; without one, it ends the loop with the client's error.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::time::Duration;

use anyhow::Result;
use tb_api::proto::{ListRequest, WatchEvent, WatchRequest};
use tb_api::{Kind, Object};
use tokio::time::Instant;
use tonic::Code;

use super::{Ctx, parse_object};
use crate::client::{RpcError, is_failover};

/// Pause before listing or watching again after the server ended a watch or was unreachable.
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// Which objects to follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub kind: Kind,
    /// Empty: every namespace (and always for cluster-scoped kinds).
    pub namespace: String,
    pub selector: String,
}

/// `(namespace, name)`.
pub type Key = (String, String);

pub fn key(o: &Object) -> Key {
    (o.metadata.namespace.clone(), o.metadata.name.clone())
}

/// How far a watch has read, so that a resumed watch misses nothing and repeats nothing.
///
/// Several objects can change at one resourceVersion (one Raft entry may carry a whole plan),
/// and a connection can drop between them. So a watch resumes from just before the last
/// version it saw, unless it knows it has every change at that version (it listed there), and
/// skips the changes at that version it already had.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    version: u64,
    /// Objects seen changing at `version`.
    seen: HashSet<Key>,
    /// Whether every change at `version` is known (a list was read there).
    complete: bool,
}

impl Position {
    /// After a list read at `version`: everything up to it is known.
    pub fn listed(version: u64) -> Position {
        Position {
            version,
            seen: HashSet::new(),
            complete: true,
        }
    }

    #[cfg(test)]
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The resourceVersion to ask a watch for (it sends changes strictly after it).
    pub fn watch_from(&self) -> u64 {
        if self.complete {
            self.version
        } else {
            self.version.saturating_sub(1)
        }
    }

    /// Whether a change of `key` at `version` is new; if so it is recorded as seen.
    pub fn admit(&mut self, version: u64, key: Key) -> bool {
        if version == 0 {
            // Unversioned: nothing to compare with.
            return true;
        }
        match version.cmp(&self.version) {
            Ordering::Less => false,
            Ordering::Equal => !self.complete && self.seen.insert(key),
            Ordering::Greater => {
                self.version = version;
                self.seen.clear();
                self.seen.insert(key);
                self.complete = false;
                true
            }
        }
    }
}

/// One change: `ADDED`, `MODIFIED` or `DELETED`, and the object as it is now (as it was last,
/// for DELETED).
#[derive(Debug, Clone)]
pub struct Change {
    pub type_: String,
    pub object: Object,
}

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
    let mut objects: BTreeMap<Key, Object> = BTreeMap::new();
    // None until the first list succeeds.
    let mut position: Option<Position> = None;
    let mut relist = true;
    loop {
        if relist {
            let req = ListRequest {
                kind: scope.kind.as_str().to_string(),
                namespace: scope.namespace.clone(),
                label_selector: scope.selector.clone(),
                stale: false,
            };
            let resp = match bounded(deadline, ctx.client().list(req)).await {
                None => return Ok(None),
                Some(Ok(r)) => r,
                Some(Err(e)) if deadline.is_some() && retryable(&e) => {
                    tracing::info!(error = %e, "listing failed; retrying");
                    pause(deadline).await;
                    continue;
                }
                Some(Err(e)) => return Err(e.into()),
            };
            let fresh = resp
                .objects_json
                .iter()
                .map(|j| parse_object(j))
                .collect::<Result<Vec<_>>>()?;
            let initial = position.is_none();
            let changes = catch_up(&mut objects, fresh);
            position = Some(Position::listed(resp.resource_version));
            relist = false;
            let view = View {
                objects: &objects,
                changes: &changes,
                initial,
            };
            if let Some(t) = step(view)? {
                return Ok(Some(t));
            }
        }
        let Some(pos) = position.as_mut() else {
            relist = true;
            continue;
        };
        let from = pos.watch_from();
        let req = WatchRequest {
            kind: scope.kind.as_str().to_string(),
            namespace: scope.namespace.clone(),
            label_selector: scope.selector.clone(),
            resource_version: from,
        };
        let mut stream = match bounded(deadline, ctx.client().watch(req)).await {
            None => return Ok(None),
            Some(Ok(s)) => s,
            Some(Err(e)) if e.code == Code::OutOfRange => {
                tracing::info!(message = %e.message, "watch too old; listing again");
                relist = true;
                continue;
            }
            Some(Err(e)) if deadline.is_some() && retryable(&e) => {
                tracing::info!(error = %e, "watch failed to open; retrying");
                pause(deadline).await;
                continue;
            }
            Some(Err(e)) => return Err(e.into()),
        };
        loop {
            let message = match bounded(deadline, stream.message()).await {
                None => return Ok(None),
                Some(m) => m,
            };
            match message {
                Ok(Some(ev)) => {
                    let Some(change) = apply_event(&ev, &mut objects, pos)? else {
                        continue;
                    };
                    let view = View {
                        objects: &objects,
                        changes: std::slice::from_ref(&change),
                        initial: false,
                    };
                    if let Some(t) = step(view)? {
                        return Ok(Some(t));
                    }
                }
                Ok(None) => {
                    tracing::info!("the server ended the watch; resuming elsewhere");
                    ctx.client().fail_over();
                    pause(deadline).await;
                    break;
                }
                Err(s) if s.code() == Code::OutOfRange => {
                    tracing::info!(message = s.message(), "watch fell behind; listing again");
                    relist = true;
                    break;
                }
                Err(s) if is_failover(&s) => {
                    tracing::info!(code = ?s.code(), message = s.message(), "watch lost; resuming elsewhere");
                    ctx.client().fail_over();
                    pause(deadline).await;
                    break;
                }
                Err(s) => {
                    return Err(RpcError {
                        code: s.code(),
                        message: s.message().to_string(),
                    }
                    .into());
                }
            }
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

/// Record one watch event; the change it makes, or `None` for a replay of something seen.
fn apply_event(
    ev: &WatchEvent,
    objects: &mut BTreeMap<Key, Object>,
    position: &mut Position,
) -> Result<Option<Change>> {
    let o = parse_object(&ev.object_json)?;
    let version = if ev.resource_version != 0 {
        ev.resource_version
    } else {
        o.metadata.resource_version
    };
    if !position.admit(version, key(&o)) {
        return Ok(None);
    }
    if ev.r#type == "DELETED" {
        objects.remove(&key(&o));
    } else {
        objects.insert(key(&o), o.clone());
    }
    Ok(Some(Change {
        type_: ev.r#type.clone(),
        object: o,
    }))
}

/// Replace `objects` with a fresh list; the changes that turn one into the other.
fn catch_up(objects: &mut BTreeMap<Key, Object>, fresh: Vec<Object>) -> Vec<Change> {
    let fresh: BTreeMap<Key, Object> = fresh.into_iter().map(|o| (key(&o), o)).collect();
    let mut changes = Vec::new();
    for (k, o) in &fresh {
        let type_ = match objects.get(k) {
            None => "ADDED",
            Some(old) if old.metadata.resource_version != o.metadata.resource_version => "MODIFIED",
            Some(_) => continue,
        };
        changes.push(Change {
            type_: type_.into(),
            object: o.clone(),
        });
    }
    for (k, old) in objects.iter() {
        if !fresh.contains_key(k) {
            changes.push(Change {
                type_: "DELETED".into(),
                object: old.clone(),
            });
        }
    }
    *objects = fresh;
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str, rv: u64) -> Object {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": name, "resourceVersion": rv}
        }))
        .expect("object")
    }

    fn event(type_: &str, o: &Object, rv: u64) -> WatchEvent {
        WatchEvent {
            r#type: type_.into(),
            object_json: o.to_json(),
            resource_version: rv,
        }
    }

    #[test]
    fn events_update_the_copy_and_replays_are_skipped() {
        let mut objects = BTreeMap::new();
        let mut pos = Position::listed(5);
        assert_eq!(pos.watch_from(), 5);
        assert!(
            apply_event(&event("ADDED", &obj("old", 4), 4), &mut objects, &mut pos)
                .expect("ok")
                .is_none()
        );
        assert!(
            apply_event(
                &event("ADDED", &obj("listed", 5), 5),
                &mut objects,
                &mut pos
            )
            .expect("ok")
            .is_none()
        );
        let c = apply_event(&event("ADDED", &obj("a", 6), 6), &mut objects, &mut pos)
            .expect("ok")
            .expect("new");
        assert_eq!((c.type_.as_str(), pos.version()), ("ADDED", 6));
        assert!(objects.contains_key(&(String::new(), "a".into())));
        apply_event(&event("DELETED", &obj("a", 6), 7), &mut objects, &mut pos).expect("ok");
        assert!(objects.is_empty());
        assert_eq!(pos.version(), 7);
    }

    #[test]
    fn changes_sharing_a_version_all_count_and_a_resume_repeats_none() {
        let mut objects = BTreeMap::new();
        let mut pos = Position::listed(70);
        // One Raft entry (79) changed two objects; the connection dropped after the first.
        assert!(
            apply_event(
                &event("ADDED", &obj("evicted", 79), 79),
                &mut objects,
                &mut pos
            )
            .expect("ok")
            .is_some()
        );
        // The resumed watch asks from just before 79 and gets both again.
        assert_eq!(pos.watch_from(), 78);
        assert!(
            apply_event(
                &event("ADDED", &obj("evicted", 79), 79),
                &mut objects,
                &mut pos
            )
            .expect("ok")
            .is_none()
        );
        assert!(
            apply_event(
                &event("ADDED", &obj("scheduled", 79), 79),
                &mut objects,
                &mut pos
            )
            .expect("ok")
            .is_some()
        );
        assert!(
            apply_event(
                &event("MODIFIED", &obj("started", 84), 84),
                &mut objects,
                &mut pos
            )
            .expect("ok")
            .is_some()
        );
        assert_eq!(objects.len(), 3);
        // A resume after a list at a version repeats nothing from it.
        let listed = Position::listed(84);
        assert_eq!(listed.watch_from(), 84);
    }

    #[test]
    fn relisting_reports_differences() {
        let mut objects: BTreeMap<Key, Object> =
            [obj("same", 1), obj("changed", 2), obj("gone", 3)]
                .into_iter()
                .map(|o| (key(&o), o))
                .collect();
        let changes = catch_up(
            &mut objects,
            vec![obj("same", 1), obj("changed", 5), obj("new", 6)],
        );
        let got: Vec<(String, String)> = changes
            .iter()
            .map(|c| (c.type_.clone(), c.object.metadata.name.clone()))
            .collect();
        let want = [
            ("MODIFIED", "changed"),
            ("ADDED", "new"),
            ("DELETED", "gone"),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (t, n) in want {
            assert!(got.contains(&(t.to_string(), n.to_string())), "{got:?}");
        }
        assert_eq!(objects.len(), 3);
    }
}
