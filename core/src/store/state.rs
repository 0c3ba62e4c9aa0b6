//! The replicated object store: a deterministic function from (state, log index, command) to
//! (new state, response, changes).
//!
//! No I/O, no clocks, no randomness: every controller applies the same log and ends in the same
//! state. Times come from the command; uids are derived from the log index.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tb_api::{Kind, Object, ObjectKey, Timestamp};

use super::command::{ApplyResult, Command, Op, Outcome, Plan, PlanWrite, Response, StoreError};
use super::join_tokens::JoinToken;
use super::usage::{ANNOTATION_CREATED_BY, Ledger};
use super::users::{AuditRecord, TokenRecord, User, result_code};

/// How many Event objects the store keeps; older ones are dropped.
pub const MAX_EVENTS: usize = 1000;
/// How many of the latest events a new one is compared with for aggregation.
pub const EVENT_AGGREGATION_WINDOW: usize = 50;
/// An identical event repeated sooner than this after the last one changes nothing; later, its
/// count is bumped (so a count grows at most once a minute).
pub const EVENT_REPEAT_INTERVAL_SECS: i64 = 60;

/// Whether `now` is less than [`EVENT_REPEAT_INTERVAL_SECS`] after `last` (both RFC 3339; an
/// unreadable time is never recent). Deterministic: both times come from commands.
fn within_repeat_interval(last: &str, now: &str) -> bool {
    let parse = |s: &str| chrono::DateTime::parse_from_rfc3339(s).ok();
    match (parse(last), parse(now)) {
        (Some(last), Some(now)) => {
            let elapsed = now.signed_duration_since(last);
            elapsed >= chrono::TimeDelta::zero()
                && elapsed < chrono::TimeDelta::seconds(EVENT_REPEAT_INTERVAL_SECS)
        }
        _ => false,
    }
}
/// The creationTimestamp of an object created by a command stamped `now`. The proposing
/// controller stamps commands as `Timestamp` writes them, so this reads; a command with an
/// unreadable time (none has one) creates an object without a creationTimestamp rather than
/// one that cannot be read back.
fn creation_stamp(now: &str) -> Option<Timestamp> {
    Timestamp::parse(now).ok()
}

/// How many idempotency keys (and their answers) the store remembers.
pub const MAX_DEDUP: usize = 20_000;

/// A change to one object, as a watch reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub kind: ChangeKind,
    pub object: Arc<Object>,
    pub resource_version: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// Everything the store holds. Serialised whole into snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Storage key (`Kind/namespace/name`) → object. Events are kept apart, in `events`.
    pub objects: BTreeMap<String, Arc<Object>>,
    /// The most recent Event objects, oldest first.
    pub events: VecDeque<Arc<Object>>,
    /// Sequence for Event names.
    pub event_seq: u64,
    /// Idempotency key → the answer it got, oldest first in `dedup_order`.
    pub dedup: HashMap<String, Response>,
    pub dedup_order: VecDeque<String>,
    /// The log index of the last applied entry: the store's resourceVersion.
    pub revision: u64,
    /// Join tokens by hash (see `super::join_tokens`). Never listed, never sent back.
    #[serde(default, deserialize_with = "super::join_tokens::deserialize_tokens")]
    pub join_tokens: BTreeMap<String, JoinToken>,
    /// Node name → hash of the credential it was given at join.
    #[serde(default)]
    pub node_credentials: BTreeMap<String, String>,
    /// Users by name.
    #[serde(default)]
    pub users: BTreeMap<String, User>,
    /// Users' bearer tokens by hash. Never listed with their hashes, never sent back.
    #[serde(default)]
    pub user_tokens: BTreeMap<String, TokenRecord>,
    /// Whether the first admin was made (once per cluster).
    #[serde(default)]
    pub bootstrapped: bool,
    /// The cluster's id, chosen when it was formed (or restored from a snapshot file); empty
    /// for a cluster formed before clusters had ids.
    #[serde(default)]
    pub cluster_id: String,
    /// The last `MAX_AUDIT` mutations by users, oldest first.
    #[serde(default)]
    pub audit: VecDeque<AuditRecord>,
    /// Usage accounting: hourly buckets per (queue, namespace, user), decayed usage per queue.
    #[serde(default)]
    pub usage: Ledger,
    /// What the controller join token is derived with, besides the cluster secret; empty until
    /// the token is first rotated.
    #[serde(default)]
    pub member_join_salt: String,
}

impl State {
    /// Apply one command at log `index`. Returns the answer for the client and the changes.
    pub fn apply(&mut self, index: u64, cmd: &Command) -> (Response, Vec<Change>) {
        self.revision = index;
        if !cmd.request_id.is_empty()
            && let Some(previous) = self.dedup.get(&cmd.request_id)
        {
            return (previous.clone(), Vec::new());
        }
        let (response, changes) = match &cmd.op {
            Op::Apply { objects } => match self.plan_apply(objects) {
                Ok(plan) => self.commit_apply(index, &cmd.now, &cmd.user, plan),
                Err(e) => (Response::Rejected(e), Vec::new()),
            },
            Op::Delete {
                key,
                resource_version,
            } => self.delete(index, key, *resource_version),
            Op::UpdateStatus {
                key,
                status,
                resource_version,
            } => self.update_status(index, key, status, *resource_version),
            Op::RecordEvent { event } => self.record_event(index, &cmd.now, event),
            Op::Plan(plan) => self.apply_plan(index, &cmd.now, plan),
            Op::CreateToken {
                token_hash,
                expires_at,
                uses,
                node,
                ..
            } => match self.create_join_token(&cmd.now, token_hash, expires_at, *uses, node) {
                Ok(()) => (Response::TokenCreated, Vec::new()),
                Err(e) => (Response::Rejected(e), Vec::new()),
            },
            Op::Join {
                token_hash,
                node,
                credential_hash,
            } => self.join(index, &cmd.now, token_hash, node, credential_hash),
            Op::Heartbeat {
                node,
                credential_hash,
                status,
            } => self.heartbeat(index, &cmd.now, node, credential_hash, status),
            Op::CreateUser {
                name,
                role,
                namespaces,
            } => (
                self.create_user(&cmd.now, name, *role, namespaces),
                Vec::new(),
            ),
            Op::DeleteUser { name } => (self.delete_user(name), Vec::new()),
            Op::IssueToken { token_hash, token } => {
                (self.issue_token(&cmd.now, token_hash, token), Vec::new())
            }
            Op::RevokeToken { id } => (self.revoke_token(id), Vec::new()),
            Op::BootstrapAdmin {
                token_hash,
                token,
                cluster_id,
            } => (
                self.bootstrap_admin(&cmd.now, token_hash, token, cluster_id),
                Vec::new(),
            ),
            Op::RecordAudit { record } => {
                self.audit(record.clone());
                (Response::Done, Vec::new())
            }
            Op::RotateMemberJoinToken { salt } => {
                self.member_join_salt = salt.clone();
                (Response::Done, Vec::new())
            }
        };
        if !cmd.user.is_empty() {
            self.audit_command(cmd, &response);
        }
        if !cmd.request_id.is_empty() {
            self.remember(cmd.request_id.clone(), response.clone());
        }
        (response, changes)
    }

    /// Append what a user's command did to the audit log: one record per object it named.
    fn audit_command(&mut self, cmd: &Command, response: &Response) {
        let result = match response {
            Response::Rejected(e) => result_code(e).to_string(),
            _ => "ok".to_string(),
        };
        let key = |k: &ObjectKey| (k.kind.clone(), k.namespace.clone(), k.name.clone());
        let targets: Vec<(&str, (String, String, String))> = match &cmd.op {
            Op::Apply { objects } => objects.iter().map(|o| ("apply", key(&o.key()))).collect(),
            Op::Delete { key: k, .. } => vec![("delete", key(k))],
            Op::UpdateStatus { key: k, .. } => vec![("update-status", key(k))],
            Op::RecordEvent { event } => vec![(
                "record-event",
                (
                    "Event".into(),
                    event.metadata.namespace.clone(),
                    String::new(),
                ),
            )],
            Op::CreateToken { node, .. } => {
                vec![("create", ("JoinToken".into(), String::new(), node.clone()))]
            }
            Op::CreateUser { name, .. } => {
                vec![("create", ("User".into(), String::new(), name.clone()))]
            }
            Op::DeleteUser { name } => {
                vec![("delete", ("User".into(), String::new(), name.clone()))]
            }
            Op::IssueToken { token, .. } => vec![(
                "create",
                (
                    "Token".into(),
                    String::new(),
                    format!("{} ({})", token.id, token.user),
                ),
            )],
            Op::RevokeToken { id } => vec![("delete", ("Token".into(), String::new(), id.clone()))],
            Op::RotateMemberJoinToken { .. } => vec![(
                "create",
                ("MemberJoinToken".into(), String::new(), String::new()),
            )],
            Op::Join { .. }
            | Op::Heartbeat { .. }
            | Op::Plan(_)
            | Op::BootstrapAdmin { .. }
            | Op::RecordAudit { .. } => Vec::new(),
        };
        for (verb, (kind, namespace, name)) in targets {
            self.audit(AuditRecord {
                time: cmd.now.clone(),
                user: cmd.user.clone(),
                verb: verb.into(),
                kind,
                namespace,
                name,
                result: result.clone(),
            });
        }
    }

    /// Advance the revision for a log entry that carries no command (blank, membership).
    pub fn skip(&mut self, index: u64) {
        self.revision = index;
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<Object>> {
        if key.kind == Kind::Event.as_str() {
            return self
                .events
                .iter()
                .find(|e| e.metadata.namespace == key.namespace && e.metadata.name == key.name);
        }
        self.objects.get(&key.storage_key())
    }

    /// Objects of one kind (and namespace, unless empty), in key order.
    pub fn list(&self, kind: &str, namespace: &str) -> Vec<Arc<Object>> {
        if kind == Kind::Event.as_str() {
            return self
                .events
                .iter()
                .filter(|e| namespace.is_empty() || e.metadata.namespace == namespace)
                .cloned()
                .collect();
        }
        let prefix = if namespace.is_empty() {
            format!("{kind}/")
        } else {
            format!("{kind}/{namespace}/")
        };
        self.objects
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Every object of every kind, for a watch that starts from nothing.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Object>> {
        self.objects.values().chain(self.events.iter())
    }

    /// What applying these objects would do, without doing it: the dry run and the first half
    /// of a real apply share this, so they cannot disagree.
    pub fn plan_apply(&self, objects: &[Object]) -> Result<Vec<PlannedApply>, StoreError> {
        let mut seen = std::collections::HashSet::new();
        let mut plan = Vec::with_capacity(objects.len());
        for obj in objects {
            let key = obj.key();
            if obj.kind == Kind::Event.as_str() {
                return Err(StoreError::Invalid(format!(
                    "{key}: Events are recorded by tb, not applied"
                )));
            }
            if !seen.insert(key.storage_key()) {
                return Err(StoreError::Invalid(format!(
                    "{key} appears twice in one apply"
                )));
            }
            let current = self.objects.get(&key.storage_key());
            let expected = obj.metadata.resource_version;
            let outcome = match current {
                None if expected != 0 => return Err(StoreError::NotFound(key.to_string())),
                None => Outcome::Created,
                Some(cur) => {
                    if expected != 0 && expected != cur.metadata.resource_version {
                        return Err(StoreError::Conflict {
                            key: key.to_string(),
                            expected,
                            current: cur.metadata.resource_version,
                        });
                    }
                    if same_desired_state(cur, obj) {
                        Outcome::Unchanged
                    } else {
                        Outcome::Configured
                    }
                }
            };
            plan.push(PlannedApply {
                outcome,
                object: obj.clone(),
                current: current.cloned(),
            });
        }
        Ok(plan)
    }

    fn commit_apply(
        &mut self,
        index: u64,
        now: &str,
        user: &str,
        plan: Vec<PlannedApply>,
    ) -> (Response, Vec<Change>) {
        let mut results = Vec::with_capacity(plan.len());
        let mut changes = Vec::new();
        for (i, step) in plan.into_iter().enumerate() {
            let stored = match (&step.outcome, step.current) {
                (Outcome::Unchanged, Some(cur)) => cur,
                (Outcome::Created, _) => {
                    let mut obj = step.object;
                    obj.metadata.uid = derive_uid(&self.cluster_id, index, i);
                    obj.metadata.resource_version = index;
                    obj.metadata.generation = 1;
                    obj.metadata.creation_timestamp = creation_stamp(now);
                    obj.status = Value::Null;
                    // Who created it, for usage accounting (set by the store, never the user).
                    if !user.is_empty() {
                        obj.metadata
                            .annotations
                            .insert(ANNOTATION_CREATED_BY.into(), user.into());
                    }
                    self.insert(obj, ChangeKind::Added, &mut changes)
                }
                (_, Some(cur)) => {
                    let mut obj = step.object;
                    obj.metadata.uid = cur.metadata.uid.clone();
                    obj.metadata.creation_timestamp = cur.metadata.creation_timestamp.clone();
                    match cur.metadata.annotations.get(ANNOTATION_CREATED_BY) {
                        Some(u) => obj
                            .metadata
                            .annotations
                            .insert(ANNOTATION_CREATED_BY.into(), u.clone()),
                        None => obj.metadata.annotations.remove(ANNOTATION_CREATED_BY),
                    };
                    obj.metadata.resource_version = index;
                    obj.metadata.generation = if obj.spec == cur.spec {
                        cur.metadata.generation
                    } else {
                        cur.metadata.generation + 1
                    };
                    // Status is written through its own call; apply never changes it.
                    obj.status = cur.status.clone();
                    self.insert(obj, ChangeKind::Modified, &mut changes)
                }
                (_, None) => {
                    unreachable!("plan_apply pairs Configured/Unchanged with a current object")
                }
            };
            results.push(ApplyResult {
                outcome: step.outcome,
                object: stored,
            });
        }
        (
            Response::Applied {
                results,
                resource_version: index,
            },
            changes,
        )
    }

    fn insert(&mut self, obj: Object, kind: ChangeKind, changes: &mut Vec<Change>) -> Arc<Object> {
        let rv = obj.metadata.resource_version;
        let obj = Arc::new(obj);
        self.objects.insert(obj.key().storage_key(), obj.clone());
        changes.push(Change {
            kind,
            object: obj.clone(),
            resource_version: rv,
        });
        obj
    }

    /// The stored object, if it exists and is at the `expected` version (0: any version).
    fn current(&self, key: &ObjectKey, expected: u64) -> Result<Arc<Object>, StoreError> {
        let cur = self
            .objects
            .get(&key.storage_key())
            .ok_or_else(|| StoreError::NotFound(key.to_string()))?;
        if expected != 0 && expected != cur.metadata.resource_version {
            return Err(StoreError::Conflict {
                key: key.to_string(),
                expected,
                current: cur.metadata.resource_version,
            });
        }
        Ok(cur.clone())
    }

    fn delete(&mut self, index: u64, key: &ObjectKey, expected: u64) -> (Response, Vec<Change>) {
        let storage_key = key.storage_key();
        let cur = match self.current(key, expected) {
            Ok(cur) => cur,
            Err(e) => return (Response::Rejected(e), Vec::new()),
        };
        let mut gone = (*cur).clone();
        self.objects.remove(&storage_key);
        gone.metadata.resource_version = index;
        let gone = Arc::new(gone);
        let change = Change {
            kind: ChangeKind::Deleted,
            object: gone.clone(),
            resource_version: index,
        };
        (
            Response::Deleted {
                object: gone,
                resource_version: index,
            },
            vec![change],
        )
    }

    fn update_status(
        &mut self,
        index: u64,
        key: &ObjectKey,
        status: &Value,
        expected: u64,
    ) -> (Response, Vec<Change>) {
        let cur = match self.current(key, expected) {
            Ok(cur) => cur,
            Err(e) => return (Response::Rejected(e), Vec::new()),
        };
        if &cur.status == status {
            return (
                Response::Status {
                    object: cur.clone(),
                },
                Vec::new(),
            );
        }
        let mut obj = (*cur).clone();
        obj.status = status.clone();
        obj.metadata.resource_version = index;
        let mut changes = Vec::new();
        let stored = self.insert(obj, ChangeKind::Modified, &mut changes);
        (Response::Status { object: stored }, changes)
    }

    /// Where in `events` the recent event identical to `event` (same object, type, reason and
    /// message) is, among the last [`EVENT_AGGREGATION_WINDOW`] recorded.
    fn identical_event(&self, event: &Object) -> Option<usize> {
        let same = |e: &Object| {
            e.metadata.namespace == event.metadata.namespace
                && e.spec.get("involvedObject") == event.spec.get("involvedObject")
                && e.spec.get("reason") == event.spec.get("reason")
                && e.spec.get("message") == event.spec.get("message")
                && e.spec.get("type") == event.spec.get("type")
        };
        let back = self
            .events
            .iter()
            .rev()
            .take(EVENT_AGGREGATION_WINDOW)
            .position(|e| same(e))?;
        Some(self.events.len() - 1 - back)
    }

    /// Whether recording `event` at `now` would change nothing: an identical event was
    /// recorded (or bumped) less than [`EVENT_REPEAT_INTERVAL_SECS`] before. The scheduler asks
    /// this so as not to propose such writes at all.
    pub fn event_is_fresh(&self, event: &Object, now: &str) -> bool {
        self.identical_event(event).is_some_and(|pos| {
            let last = self.events[pos]
                .spec
                .get("lastTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("");
            within_repeat_interval(last, now)
        })
    }

    fn record_event(&mut self, index: u64, now: &str, event: &Object) -> (Response, Vec<Change>) {
        // A repeat of a recent identical event (same object, reason, message) bumps its count
        // instead of growing the list, as Kubernetes aggregates events; and at most once per
        // EVENT_REPEAT_INTERVAL_SECS, so that something retried in a loop (by a nodelet, or a
        // scheduler that cannot act on an object) changes nothing and wakes no watcher.
        let recent = self.identical_event(event);
        let mut changes = Vec::new();
        if let Some(pos) = recent
            && self.event_is_fresh(event, now)
        {
            return (
                Response::Event {
                    object: self.events[pos].clone(),
                },
                changes,
            );
        }
        let stored = if let Some(pos) = recent {
            let mut obj = (*self.events[pos]).clone();
            let count = obj.spec.get("count").and_then(Value::as_u64).unwrap_or(1) + 1;
            if let Value::Object(spec) = &mut obj.spec {
                spec.insert("count".into(), count.into());
                spec.insert("lastTimestamp".into(), now.into());
            }
            obj.metadata.resource_version = index;
            let obj = Arc::new(obj);
            self.events[pos] = obj.clone();
            changes.push(Change {
                kind: ChangeKind::Modified,
                object: obj.clone(),
                resource_version: index,
            });
            obj
        } else {
            self.event_seq += 1;
            let mut obj = event.clone();
            let involved = event
                .spec
                .get("involvedObject")
                .and_then(|o| o.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("cluster");
            obj.metadata.name = format!("{involved}.{:x}", self.event_seq);
            obj.metadata.uid = derive_uid(&self.cluster_id, index, 0);
            obj.metadata.resource_version = index;
            obj.metadata.generation = 1;
            obj.metadata.creation_timestamp = creation_stamp(now);
            if let Value::Object(spec) = &mut obj.spec {
                spec.insert("count".into(), 1.into());
                spec.insert("firstTimestamp".into(), now.into());
                spec.insert("lastTimestamp".into(), now.into());
            }
            let obj = Arc::new(obj);
            self.events.push_back(obj.clone());
            changes.push(Change {
                kind: ChangeKind::Added,
                object: obj.clone(),
                resource_version: index,
            });
            while self.events.len() > MAX_EVENTS {
                if let Some(old) = self.events.pop_front() {
                    let mut gone = (*old).clone();
                    gone.metadata.resource_version = index;
                    changes.push(Change {
                        kind: ChangeKind::Deleted,
                        object: Arc::new(gone),
                        resource_version: index,
                    });
                }
            }
            obj
        };
        (Response::Event { object: stored }, changes)
    }

    fn apply_plan(&mut self, index: u64, now: &str, plan: &Plan) -> (Response, Vec<Change>) {
        for (key, expected) in &plan.guards {
            let current = self
                .get(key)
                .map(|o| o.metadata.resource_version)
                .unwrap_or(0);
            if current != *expected {
                let err = StoreError::Conflict {
                    key: key.to_string(),
                    expected: *expected,
                    current,
                };
                return (Response::Rejected(err), Vec::new());
            }
        }
        for write in &plan.writes {
            if let PlanWrite::Usage(tick) = write
                && let Err(e) = self.usage.check(tick)
            {
                return (Response::Rejected(e), Vec::new());
            }
        }
        let mut changes = Vec::new();
        for (i, write) in plan.writes.iter().enumerate() {
            match write {
                PlanWrite::Put(obj) => {
                    let mut obj = obj.clone();
                    let current = self.objects.get(&obj.key().storage_key()).cloned();
                    obj.metadata.resource_version = index;
                    let kind = match current {
                        Some(cur) => {
                            obj.metadata.uid = cur.metadata.uid.clone();
                            obj.metadata.creation_timestamp =
                                cur.metadata.creation_timestamp.clone();
                            obj.metadata.generation =
                                cur.metadata.generation + u64::from(cur.spec != obj.spec);
                            ChangeKind::Modified
                        }
                        None => {
                            obj.metadata.uid = derive_uid(&self.cluster_id, index, i);
                            obj.metadata.creation_timestamp = creation_stamp(now);
                            obj.metadata.generation = 1;
                            ChangeKind::Added
                        }
                    };
                    self.insert(obj, kind, &mut changes);
                }
                PlanWrite::Status { key, status } => {
                    if let Some(cur) = self.objects.get(&key.storage_key())
                        && &cur.status != status
                    {
                        let mut obj = (**cur).clone();
                        obj.status = status.clone();
                        obj.metadata.resource_version = index;
                        self.insert(obj, ChangeKind::Modified, &mut changes);
                    }
                }
                PlanWrite::Usage(tick) => self.usage.apply(tick),
                PlanWrite::Delete { key } => {
                    if let Some(cur) = self.objects.remove(&key.storage_key()) {
                        let mut gone = (*cur).clone();
                        gone.metadata.resource_version = index;
                        changes.push(Change {
                            kind: ChangeKind::Deleted,
                            object: Arc::new(gone),
                            resource_version: index,
                        });
                    }
                }
            }
        }
        for event in &plan.events {
            let (_, more) = self.record_event(index, now, event);
            changes.extend(more);
        }
        (
            Response::Planned {
                resource_version: index,
            },
            changes,
        )
    }

    fn join(
        &mut self,
        index: u64,
        now: &str,
        token_hash: &str,
        node: &Object,
        credential_hash: &str,
    ) -> (Response, Vec<Change>) {
        let key = node.key();
        // The check and the spending of a use are one step of one command: two joins racing
        // with a single-use token cannot both pass.
        if let Err(e) = self.check_join(now, token_hash, &key.name) {
            return (Response::Rejected(e), Vec::new());
        }
        self.spend_join_token(token_hash);
        let mut obj = node.clone();
        let mut changes = Vec::new();
        obj.metadata.resource_version = index;
        match self.objects.get(&key.storage_key()) {
            Some(cur) => {
                // Rejoining keeps what users set on the Node (cordon) and its identity.
                obj.metadata.uid = cur.metadata.uid.clone();
                obj.metadata.creation_timestamp = cur.metadata.creation_timestamp.clone();
                obj.metadata.generation = cur.metadata.generation;
                obj.spec = cur.spec.clone();
            }
            None => {
                obj.metadata.uid = derive_uid(&self.cluster_id, index, 0);
                obj.metadata.creation_timestamp = creation_stamp(now);
                obj.metadata.generation = 1;
            }
        }
        stamp_heartbeat(&mut obj.status, now);
        let kind = if self.objects.contains_key(&key.storage_key()) {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        let stored = self.insert(obj, kind, &mut changes);
        self.node_credentials
            .insert(key.name.clone(), credential_hash.to_string());
        (Response::Status { object: stored }, changes)
    }

    fn heartbeat(
        &mut self,
        index: u64,
        now: &str,
        node: &str,
        credential_hash: &str,
        status: &Value,
    ) -> (Response, Vec<Change>) {
        if self.node_credentials.get(node).map(String::as_str) != Some(credential_hash) {
            let err = StoreError::Unauthenticated(format!(
                "node {node}: unknown node or wrong credential"
            ));
            return (Response::Rejected(err), Vec::new());
        }
        let key = ObjectKey {
            kind: Kind::Node.as_str().into(),
            namespace: String::new(),
            name: node.to_string(),
        };
        let Some(cur) = self.objects.get(&key.storage_key()) else {
            return (
                Response::Rejected(StoreError::NotFound(key.to_string())),
                Vec::new(),
            );
        };
        let mut obj = (**cur).clone();
        obj.status = status.clone();
        stamp_heartbeat(&mut obj.status, now);
        obj.metadata.resource_version = index;
        let mut changes = Vec::new();
        let stored = self.insert(obj, ChangeKind::Modified, &mut changes);
        (Response::Status { object: stored }, changes)
    }

    fn remember(&mut self, request_id: String, response: Response) {
        if self.dedup.insert(request_id.clone(), response).is_none() {
            self.dedup_order.push_back(request_id);
        }
        while self.dedup_order.len() > MAX_DEDUP {
            if let Some(old) = self.dedup_order.pop_front() {
                self.dedup.remove(&old);
            }
        }
    }
}

/// The store, not the nodelet, says when a heartbeat arrived: one clock for every node.
fn stamp_heartbeat(status: &mut Value, now: &str) {
    if !status.is_object() {
        *status = Value::Object(Default::default());
    }
    if let Value::Object(map) = status {
        map.insert("lastHeartbeatTime".into(), now.into());
    }
}

/// One object's part of an apply, computed before anything changes.
#[derive(Debug, Clone)]
pub struct PlannedApply {
    pub outcome: Outcome,
    pub object: Object,
    pub current: Option<Arc<Object>>,
}

/// Apply compares what the user controls: spec, labels and annotations.
fn same_desired_state(current: &Object, desired: &Object) -> bool {
    let ours = |o: &Object| {
        let mut a = o.metadata.annotations.clone();
        a.remove(ANNOTATION_CREATED_BY);
        a
    };
    current.spec == desired.spec
        && current.metadata.labels == desired.metadata.labels
        && ours(current) == ours(desired)
}

/// A uid unique per object and identical on every member: log index and position in the
/// entry, salted with the cluster's id. Without the salt two clusters that took the same
/// writes (two local clusters on one machine, a cluster formed again) gave their objects the
/// same uids, and a nodelet names its allocations' cgroups by uid: one cluster's nodelet then
/// killed the other's ranks when its own allocation ended. Clusters formed before they had ids
/// (an empty id) keep the unsalted uids.
fn derive_uid(cluster_id: &str, index: u64, position: usize) -> String {
    // FNV-1a of the id; then mix so uids of neighbouring writes do not look alike (splitmix64
    // is enough for that).
    let salt = if cluster_id.is_empty() {
        0
    } else {
        cluster_id.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
        })
    };
    let mut z = (index ^ salt)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(position as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        (z >> 32) as u32,
        (z >> 16) as u16,
        z as u16,
        position as u16,
        index & 0xFFFF_FFFF_FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tb_api::ObjectMeta;

    fn obj(kind: &str, name: &str, spec: Value) -> Object {
        Object {
            api_version: "tb/v1".into(),
            kind: kind.into(),
            metadata: ObjectMeta {
                name: name.into(),
                namespace: "default".into(),
                ..Default::default()
            },
            spec,
            status: Value::Null,
        }
    }

    fn cmd(id: &str, op: Op) -> Command {
        Command {
            request_id: id.into(),
            now: "2026-01-01T00:00:00Z".into(),
            op,
            user: String::new(),
        }
    }

    fn apply(objects: Vec<Object>) -> Op {
        Op::Apply { objects }
    }

    #[test]
    fn create_configure_unchanged_and_generation() {
        let mut s = State::default();
        let (r, ch) = s.apply(
            5,
            &cmd("a", apply(vec![obj("Model", "m", json!({"layers": 1}))])),
        );
        let Response::Applied { results, .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!(results[0].outcome, Outcome::Created);
        assert_eq!(results[0].object.metadata.generation, 1);
        assert_eq!(results[0].object.metadata.resource_version, 5);
        assert_eq!(ch.len(), 1);

        let (r, ch) = s.apply(
            6,
            &cmd("b", apply(vec![obj("Model", "m", json!({"layers": 1}))])),
        );
        let Response::Applied { results, .. } = r else {
            panic!()
        };
        assert_eq!(results[0].outcome, Outcome::Unchanged);
        assert_eq!(results[0].object.metadata.resource_version, 5);
        assert!(ch.is_empty());

        let mut labelled = obj("Model", "m", json!({"layers": 1}));
        labelled.metadata.labels.insert("a".into(), "b".into());
        let (r, _) = s.apply(7, &cmd("c", apply(vec![labelled])));
        let Response::Applied { results, .. } = r else {
            panic!()
        };
        assert_eq!(results[0].outcome, Outcome::Configured);
        assert_eq!(
            results[0].object.metadata.generation, 1,
            "labels are not spec"
        );

        let (r, _) = s.apply(
            8,
            &cmd("d", apply(vec![obj("Model", "m", json!({"layers": 2}))])),
        );
        let Response::Applied { results, .. } = r else {
            panic!()
        };
        assert_eq!(results[0].object.metadata.generation, 2);
        assert_eq!(results[0].object.metadata.resource_version, 8);
    }

    /// Two clusters that take the same writes give their objects different uids (a nodelet
    /// names its allocations' cgroups by uid, so equal uids on one machine let one cluster's
    /// nodelet kill the other's ranks); within a cluster they stay unique and identical on
    /// every member; a cluster without an id keeps the unsalted uids it always had.
    #[test]
    fn uids_differ_between_clusters_that_took_the_same_writes() {
        let uid_in = |cluster_id: &str, index: u64| {
            let mut s = State {
                cluster_id: cluster_id.into(),
                ..State::default()
            };
            let objects = vec![
                obj("Model", "m", json!({"layers": 1})),
                obj("Model", "n", json!({"layers": 1})),
            ];
            let (r, _) = s.apply(index, &cmd("a", apply(objects)));
            let Response::Applied { results, .. } = r else {
                panic!("{r:?}")
            };
            (
                results[0].object.metadata.uid.clone(),
                results[1].object.metadata.uid.clone(),
            )
        };
        let (a, a2) = uid_in("5f0c1d9e-cluster-a", 9);
        let (b, _) = uid_in("0b7e44aa-cluster-b", 9);
        assert_ne!(a, b, "two clusters, the same write");
        assert_ne!(a, a2, "two objects of one entry");
        assert_eq!(
            uid_in("5f0c1d9e-cluster-a", 9).0,
            a,
            "every member derives the same"
        );
        assert_eq!(uid_in("", 9).0, derive_uid("", 9, 0));
        assert!(
            a.ends_with("-000000000009"),
            "{a}: the index stays readable"
        );
    }

    #[test]
    fn stale_resource_version_conflicts_and_changes_nothing() {
        let mut s = State::default();
        s.apply(
            3,
            &cmd("", apply(vec![obj("Model", "m", json!({"layers": 1}))])),
        );
        let mut stale = obj("Model", "m", json!({"layers": 9}));
        stale.metadata.resource_version = 2;
        let before = s.objects.clone();
        let (r, ch) = s.apply(
            4,
            &cmd("", apply(vec![obj("Model", "n", json!({})), stale])),
        );
        assert!(matches!(
            r,
            Response::Rejected(StoreError::Conflict {
                current: 3,
                expected: 2,
                ..
            })
        ));
        assert!(ch.is_empty());
        assert_eq!(s.objects, before, "all or none");
    }

    #[test]
    fn duplicate_request_id_applies_once() {
        let mut s = State::default();
        let c = cmd("same", apply(vec![obj("Model", "m", json!({"layers": 1}))]));
        let (first, _) = s.apply(1, &c);
        let (second, ch) = s.apply(2, &c);
        assert_eq!(first, second);
        assert!(ch.is_empty());
        assert_eq!(
            s.get(&obj("Model", "m", json!(null)).key())
                .map(|o| o.metadata.resource_version),
            Some(1)
        );
    }

    #[test]
    fn status_is_separate_from_spec() {
        let mut s = State::default();
        s.apply(
            1,
            &cmd("", apply(vec![obj("Model", "m", json!({"layers": 1}))])),
        );
        let key = obj("Model", "m", json!(null)).key();
        let (r, _) = s.apply(
            2,
            &cmd(
                "",
                Op::UpdateStatus {
                    key: key.clone(),
                    status: json!({"phase": "Ready"}),
                    resource_version: 0,
                },
            ),
        );
        let Response::Status { object } = r else {
            panic!()
        };
        assert_eq!(object.metadata.generation, 1);
        assert_eq!(object.status, json!({"phase": "Ready"}));
        // A later apply keeps the status.
        let (r, _) = s.apply(
            3,
            &cmd("", apply(vec![obj("Model", "m", json!({"layers": 2}))])),
        );
        let Response::Applied { results, .. } = r else {
            panic!()
        };
        assert_eq!(results[0].object.status, json!({"phase": "Ready"}));
    }

    #[test]
    fn delete_and_not_found() {
        let mut s = State::default();
        s.apply(1, &cmd("", apply(vec![obj("Model", "m", json!({}))])));
        let key = obj("Model", "m", json!(null)).key();
        let (r, ch) = s.apply(
            2,
            &cmd(
                "",
                Op::Delete {
                    key: key.clone(),
                    resource_version: 0,
                },
            ),
        );
        assert!(matches!(
            r,
            Response::Deleted {
                resource_version: 2,
                ..
            }
        ));
        assert_eq!(ch[0].kind, ChangeKind::Deleted);
        let (r, _) = s.apply(
            3,
            &cmd(
                "",
                Op::Delete {
                    key,
                    resource_version: 0,
                },
            ),
        );
        assert!(matches!(r, Response::Rejected(StoreError::NotFound(_))));
    }

    #[test]
    fn events_aggregate_and_stay_bounded() {
        let mut s = State::default();
        let ev = |msg: &str| {
            let mut e = obj(
                "Event",
                "x",
                json!({"type": "Normal", "reason": "R", "message": msg, "involvedObject": {"kind": "Model", "name": "m"}}),
            );
            e.metadata.name = String::new();
            e
        };
        let at = |now: &str, op: Op| Command {
            now: now.into(),
            ..cmd("", op)
        };
        s.apply(1, &cmd("", Op::RecordEvent { event: ev("hello") }));
        // Again within the minute: nothing changes, no watcher is woken.
        let (r, changes) = s.apply(
            2,
            &at(
                "2026-01-01T00:00:59.999Z",
                Op::RecordEvent { event: ev("hello") },
            ),
        );
        let Response::Event { object } = r else {
            panic!()
        };
        assert_eq!(object.spec["count"], 1);
        assert!(changes.is_empty());
        assert!(s.event_is_fresh(&ev("hello"), "2026-01-01T00:00:30Z"));
        assert!(!s.event_is_fresh(&ev("hello"), "2026-01-01T00:01:00Z"));
        // A minute later the count is bumped.
        let (r, changes) = s.apply(
            3,
            &at(
                "2026-01-01T00:01:00Z",
                Op::RecordEvent { event: ev("hello") },
            ),
        );
        let Response::Event { object } = r else {
            panic!()
        };
        assert_eq!(object.spec["count"], 2);
        assert_eq!(changes.len(), 1);
        assert_eq!(s.events.len(), 1);
        for i in 0..(MAX_EVENTS + 10) {
            s.apply(
                10 + i as u64,
                &cmd(
                    "",
                    Op::RecordEvent {
                        event: ev(&format!("m{i}")),
                    },
                ),
            );
        }
        assert_eq!(s.events.len(), MAX_EVENTS);
    }

    #[test]
    fn plan_applies_whole_or_not_at_all() {
        let mut s = State::default();
        s.apply(
            1,
            &cmd(
                "",
                apply(vec![obj("TrainingJob", "j", json!({"ranks": 1}))]),
            ),
        );
        let job = obj("TrainingJob", "j", json!(null)).key();
        let alloc = obj("Allocation", "j-0", json!({"rank": 0}));
        let plan = Plan {
            guards: vec![(job.clone(), 1), (alloc.key(), 0)],
            writes: vec![
                PlanWrite::Put(alloc.clone()),
                PlanWrite::Status {
                    key: job.clone(),
                    status: json!({"phase": "Scheduled"}),
                },
            ],
            events: vec![],
            ..Default::default()
        };
        let (r, ch) = s.apply(2, &cmd("", Op::Plan(plan.clone())));
        assert_eq!(
            r,
            Response::Planned {
                resource_version: 2
            }
        );
        assert_eq!(ch.len(), 2);
        assert_eq!(
            s.get(&job).map(|o| o.status.clone()),
            Some(json!({"phase": "Scheduled"}))
        );
        // The same plan again: its guards no longer hold, nothing changes.
        let before = s.objects.clone();
        let (r, ch) = s.apply(3, &cmd("", Op::Plan(plan)));
        assert!(
            matches!(r, Response::Rejected(StoreError::Conflict { .. })),
            "{r:?}"
        );
        assert!(ch.is_empty());
        assert_eq!(s.objects, before);
    }

    #[test]
    fn list_is_scoped_by_kind_and_namespace() {
        let mut s = State::default();
        let mut other = obj("Model", "b", json!({}));
        other.metadata.namespace = "team".into();
        s.apply(
            1,
            &cmd(
                "",
                apply(vec![
                    obj("Model", "a", json!({})),
                    other,
                    obj("TrainingJob", "a", json!({})),
                ]),
            ),
        );
        assert_eq!(s.list("Model", "").len(), 2);
        assert_eq!(s.list("Model", "default").len(), 1);
        assert_eq!(s.list("TrainingJob", "").len(), 1);
        assert_eq!(s.list("Queue", "").len(), 0);
    }
}
