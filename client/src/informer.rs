//! An informer: a local copy of the objects of one kind (in one namespace, matching a label
//! selector), kept current by listing and then watching from the list's resourceVersion, with
//! every change handed to the caller.
//!
//! A dropped connection or a watch the server ended fails over to the next member and resumes
//! where it was (see [`Position`]: replayed events are skipped); OUT_OF_RANGE (the version is
//! too old for the server's backlog) lists again and reports the difference as changes. So the
//! caller sees every object's latest state, and nothing twice.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tb_api::proto::{ListRequest, WatchEvent, WatchRequest};
use tb_api::{Kind, Object};
use tonic::{Code, Streaming};

use crate::client::{Client, RpcError};
use crate::retry::is_retryable;

/// Pause before watching again after the server ended a watch or the connection broke.
pub const RETRY_DELAY: Duration = Duration::from_millis(200);

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

/// Why an informer could not go on: the controllers' answer (after the client's retries), or an
/// object it cannot read.
#[derive(Debug, thiserror::Error)]
pub enum InformerError {
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error("the server sent an object that cannot be read: {0}")]
    Malformed(#[source] serde_json::Error),
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

    /// The last version read.
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

/// What one step of an informer brought: a list (the first, whose changes are all ADDED, or a
/// list again after the watch fell behind), or one watch event.
#[derive(Debug, Clone)]
pub struct Batch {
    pub changes: Vec<Change>,
    /// This is the first list.
    pub initial: bool,
    /// This is a list (first or again), so the copy now equals the server's at one version.
    pub listed: bool,
}

/// List + watch + list again, with a local copy of the objects by `(namespace, name)`.
pub struct Informer {
    scope: Scope,
    objects: BTreeMap<Key, Object>,
    /// None until the first list succeeds.
    position: Option<Position>,
    relist: bool,
    stream: Option<Streaming<WatchEvent>>,
    /// Lists may be served from a follower's copy without asking the leader.
    stale_list: bool,
}

impl Informer {
    pub fn new(scope: Scope) -> Informer {
        Informer {
            scope,
            objects: BTreeMap::new(),
            position: None,
            relist: true,
            stream: None,
            stale_list: false,
        }
    }

    /// Let lists be served by any member from its own copy (`--stale`), which may lag.
    pub fn with_stale_list(mut self, stale: bool) -> Informer {
        self.stale_list = stale;
        self
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Every matching object, as of the last change returned.
    pub fn objects(&self) -> &BTreeMap<Key, Object> {
        &self.objects
    }

    /// Wait for the next changes. A broken watch is resumed here (on the next member); an error
    /// is returned when the client gave up listing or opening a watch, or the server refused the
    /// watch for good: calling again tries again, from where the informer was.
    pub async fn next(&mut self, client: &mut Client) -> Result<Batch, InformerError> {
        loop {
            if self.relist {
                return self.list(client).await;
            }
            let stream = match self.stream.as_mut() {
                Some(s) => s,
                None => {
                    let from = self.position.as_ref().map_or(0, Position::watch_from);
                    let req = WatchRequest {
                        kind: self.scope.kind.as_str().to_string(),
                        namespace: self.scope.namespace.clone(),
                        label_selector: self.scope.selector.clone(),
                        resource_version: from,
                    };
                    match client.watch(req).await {
                        Ok(s) => self.stream.insert(s),
                        Err(e) if e.code == Code::OutOfRange => {
                            tracing::info!(message = %e.message, "watch too old; listing again");
                            self.relist = true;
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            match stream.message().await {
                Ok(Some(ev)) => {
                    let Some(position) = self.position.as_mut() else {
                        self.relist = true;
                        continue;
                    };
                    if let Some(change) = apply_event(&ev, &mut self.objects, position)? {
                        return Ok(Batch {
                            changes: vec![change],
                            initial: false,
                            listed: false,
                        });
                    }
                }
                Ok(None) => {
                    tracing::info!("the server ended the watch; resuming elsewhere");
                    self.resume_elsewhere(client).await;
                }
                Err(s) if s.code() == Code::OutOfRange => {
                    tracing::info!(message = s.message(), "watch fell behind; listing again");
                    self.stream = None;
                    self.relist = true;
                }
                Err(s) if is_retryable(&s) => {
                    tracing::info!(code = ?s.code(), message = s.message(), "watch lost; resuming elsewhere");
                    self.resume_elsewhere(client).await;
                }
                Err(s) => {
                    self.stream = None;
                    return Err(RpcError {
                        code: s.code(),
                        message: s.message().to_string(),
                    }
                    .into());
                }
            }
        }
    }

    async fn resume_elsewhere(&mut self, client: &mut Client) {
        self.stream = None;
        client.fail_over();
        tokio::time::sleep(RETRY_DELAY).await;
    }

    async fn list(&mut self, client: &mut Client) -> Result<Batch, InformerError> {
        let req = ListRequest {
            kind: self.scope.kind.as_str().to_string(),
            namespace: self.scope.namespace.clone(),
            label_selector: self.scope.selector.clone(),
            stale: self.stale_list,
        };
        let resp = client.list(req).await?;
        let fresh = resp
            .objects_json
            .iter()
            .map(|j| Object::from_json(j))
            .collect::<Result<Vec<_>, _>>()
            .map_err(InformerError::Malformed)?;
        let initial = self.position.is_none();
        let changes = catch_up(&mut self.objects, fresh);
        self.position = Some(Position::listed(resp.resource_version));
        self.relist = false;
        self.stream = None;
        Ok(Batch {
            changes,
            initial,
            listed: true,
        })
    }
}

/// Record one watch event; the change it makes, or `None` for a replay of something seen.
pub fn apply_event(
    ev: &WatchEvent,
    objects: &mut BTreeMap<Key, Object>,
    position: &mut Position,
) -> Result<Option<Change>, InformerError> {
    let o = Object::from_json(&ev.object_json).map_err(InformerError::Malformed)?;
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
pub fn catch_up(objects: &mut BTreeMap<Key, Object>, fresh: Vec<Object>) -> Vec<Change> {
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
