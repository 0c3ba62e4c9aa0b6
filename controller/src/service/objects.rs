//! The `Objects` gRPC service: validates requests, turns writes into commands for the Raft
//! store, and serves reads and watches from this member's copy of the store.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use serde_json::Value;
use tb_api::bounds::Quoted;
use tb_api::proto::objects_server::Objects;
use tb_api::proto::{
    ApplyRequest, ApplyResponse, ApplyResult as PbApplyResult, DeleteRequest, DeleteResponse,
    GetRequest, GetResponse, ListRequest, ListResponse, RecordEventRequest, RecordEventResponse,
    UpdateStatusRequest, UpdateStatusResponse, WatchEvent, WatchRequest,
};
use tb_api::selector::LabelSelector;
use tb_api::{Kind, Object, ObjectKey};
use tokio::sync::broadcast::error::RecvError;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response as TonicResponse, Status};

use super::{caller, check, store_error, unavailable};
use crate::auth::{Access, Caller, Verb};
use crate::raft::RaftNode;
use crate::store::{Change, Op, Response};

/// Most objects one apply may carry.
pub const MAX_OBJECTS_PER_APPLY: usize = 1000;
/// The longest label selector a list or watch may carry.
pub const MAX_SELECTOR_BYTES: usize = 16 * 1024;
/// The longest idempotency key a write may carry (the store remembers it with its answer).
pub const MAX_REQUEST_ID_BYTES: usize = 128;

pub struct ObjectsService {
    node: Arc<RaftNode>,
    /// Becomes true when the controller shuts down: open watches end.
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl ObjectsService {
    pub fn new(node: Arc<RaftNode>, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        ObjectsService { node, stopping }
    }

    async fn commit(
        &self,
        request_id: String,
        caller: &Caller,
        op: Op,
    ) -> Result<Response, Status> {
        super::commit(&self.node, request_id, caller.user(), op).await
    }

    fn check(&self, caller: &Caller, access: &Access<'_>) -> Result<(), Status> {
        check(&self.node, caller, access)
    }

    /// The node an Allocation (its `spec.node`) or a Link (its end `a`) belongs to.
    fn owner(&self, key: &ObjectKey) -> Option<String> {
        let state = self.node.store().read();
        let obj = state.get(key)?;
        let node = if key.kind == Kind::Allocation.as_str() {
            obj.spec.get("node")
        } else if key.kind == Kind::Link.as_str() {
            obj.spec.get("a").and_then(|a| a.get("node"))
        } else {
            None
        };
        node.and_then(Value::as_str).map(str::to_string)
    }

    async fn read_barrier(&self, stale: bool) -> Result<(), Status> {
        if stale {
            return Ok(());
        }
        self.node.linearize().await.map_err(unavailable)
    }
}

fn unexpected(r: Response) -> Status {
    Status::internal(format!("unexpected store response {r:?}"))
}

/// Resolve a kind name or alias; `field` names the request field for the error.
fn parse_kind(kind: &str, field: &str) -> Result<Kind, Status> {
    Kind::parse(kind).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{field}: unknown kind {}; expected one of {}",
            Quoted(kind),
            tb_api::kind::KIND_LIST
        ))
    })
}

/// The key for a request naming one object, with namespaces defaulted and checked per kind.
/// A name or namespace no object can have is refused here, before authorization, the audit
/// log or Raft see it: nothing of a bad request is stored, and its echo is bounded.
fn object_key(kind: &str, namespace: &str, name: &str) -> Result<ObjectKey, Status> {
    let kind = parse_kind(kind, "kind")?;
    if name.is_empty() {
        return Err(Status::invalid_argument("name: required"));
    }
    tb_api::name::validate_name(name)
        .map_err(|m| Status::invalid_argument(format!("name: {m}")))?;
    let namespace = scope_namespace(kind, namespace);
    if !namespace.is_empty() {
        check_namespace(&namespace)?;
    }
    Ok(ObjectKey {
        kind: kind.as_str().to_string(),
        namespace,
        name: name.to_string(),
    })
}

/// A namespace a request names (empty: all namespaces, where the call allows it).
fn check_namespace(namespace: &str) -> Result<(), Status> {
    if namespace.is_empty() {
        return Ok(());
    }
    tb_api::name::validate_namespace(namespace)
        .map_err(|m| Status::invalid_argument(format!("namespace: {m}")))
}

fn scope_namespace(kind: Kind, namespace: &str) -> String {
    if !kind.is_namespaced() {
        String::new()
    } else if namespace.is_empty() {
        "default".to_string()
    } else {
        namespace.to_string()
    }
}

fn parse_selector(s: &str) -> Result<LabelSelector, Status> {
    if s.len() > MAX_SELECTOR_BYTES {
        return Err(Status::invalid_argument(format!(
            "labelSelector: {} bytes; a selector may be at most {MAX_SELECTOR_BYTES}",
            s.len()
        )));
    }
    LabelSelector::parse(s).map_err(|e| Status::invalid_argument(format!("labelSelector: {e}")))
}

fn request_id(id: String) -> Result<String, Status> {
    if id.is_empty() {
        Ok(uuid::Uuid::new_v4().to_string())
    } else if id.len() > MAX_REQUEST_ID_BYTES {
        Err(Status::invalid_argument(format!(
            "requestId: {} bytes; an idempotency key may be at most {MAX_REQUEST_ID_BYTES}",
            id.len()
        )))
    } else {
        Ok(id)
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Objects for ObjectsService {
    async fn apply(
        &self,
        req: Request<ApplyRequest>,
    ) -> Result<TonicResponse<ApplyResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        if req.objects_json.is_empty() {
            return Err(Status::invalid_argument(
                "objects: at least one object is required",
            ));
        }
        if req.objects_json.len() > MAX_OBJECTS_PER_APPLY {
            return Err(Status::invalid_argument(format!(
                "objects: {} objects in one apply; the limit is {MAX_OBJECTS_PER_APPLY}",
                req.objects_json.len()
            )));
        }
        // Validate everything before anything is stored: one bad object stores none.
        let mut objects = Vec::with_capacity(req.objects_json.len());
        for (i, text) in req.objects_json.iter().enumerate() {
            let obj = tb_api::load::parse_object_json(text)
                .map_err(|e| Status::invalid_argument(format!("objects[{i}]: {e}")))?;
            if obj.kind == Kind::Event.as_str() || obj.kind == Kind::Allocation.as_str() {
                return Err(Status::invalid_argument(format!(
                    "objects[{i}]: kind: {}s are written by tb itself, not applied",
                    obj.kind
                )));
            }
            objects.push(obj);
        }
        for obj in &objects {
            let access = Access::new(
                Verb::Apply,
                &obj.kind,
                &obj.metadata.namespace,
                &obj.metadata.name,
            );
            self.check(&caller, &access)?;
        }
        super::priority::check_apply(&self.node, &objects).await?;
        if req.dry_run {
            self.read_barrier(false).await?;
            let state = self.node.store().read();
            let plan = state.plan_apply(&objects).map_err(store_error)?;
            let results = plan
                .into_iter()
                .map(|p| {
                    let mut obj = p.object;
                    if let Some(cur) = &p.current {
                        obj.metadata.uid = cur.metadata.uid.clone();
                        obj.metadata.resource_version = cur.metadata.resource_version;
                        obj.metadata.generation = cur.metadata.generation;
                        obj.metadata.creation_timestamp = cur.metadata.creation_timestamp.clone();
                        obj.status = cur.status.clone();
                    }
                    pb_result(p.outcome.as_str(), &obj)
                })
                .collect();
            return Ok(TonicResponse::new(ApplyResponse {
                results,
                resource_version: state.revision,
            }));
        }
        match self
            .commit(request_id(req.request_id)?, &caller, Op::Apply { objects })
            .await?
        {
            Response::Applied {
                results,
                resource_version,
            } => Ok(TonicResponse::new(ApplyResponse {
                results: results
                    .iter()
                    .map(|r| pb_result(r.outcome.as_str(), &r.object))
                    .collect(),
                resource_version,
            })),
            r => Err(unexpected(r)),
        }
    }

    async fn get(&self, req: Request<GetRequest>) -> Result<TonicResponse<GetResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let key = object_key(&req.kind, &req.namespace, &req.name)?;
        self.check(
            &caller,
            &Access::new(Verb::Get, &key.kind, &key.namespace, &key.name),
        )?;
        self.read_barrier(req.stale).await?;
        let state = self.node.store().read();
        let obj = state
            .get(&key)
            .ok_or_else(|| Status::not_found(format!("{key} not found")))?;
        Ok(TonicResponse::new(GetResponse {
            object_json: obj.to_json(),
        }))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<TonicResponse<ListResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let kind = parse_kind(&req.kind, "kind")?;
        let selector = parse_selector(&req.label_selector)?;
        let namespace = if kind.is_namespaced() {
            req.namespace
        } else {
            String::new()
        };
        check_namespace(&namespace)?;
        self.check(
            &caller,
            &Access::new(Verb::List, kind.as_str(), &namespace, ""),
        )?;
        self.read_barrier(req.stale).await?;
        let state = self.node.store().read();
        let objects_json = state
            .list(kind.as_str(), &namespace)
            .iter()
            .filter(|o| selector.matches(&o.metadata.labels))
            .map(|o| o.to_json())
            .collect();
        Ok(TonicResponse::new(ListResponse {
            objects_json,
            resource_version: state.revision,
        }))
    }

    async fn delete(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<TonicResponse<DeleteResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let key = object_key(&req.kind, &req.namespace, &req.name)?;
        self.check(
            &caller,
            &Access::new(Verb::Delete, &key.kind, &key.namespace, &key.name),
        )?;
        if key.kind == Kind::Event.as_str() {
            return Err(Status::invalid_argument(
                "kind: Events expire on their own and cannot be deleted",
            ));
        }
        let op = Op::Delete {
            key,
            resource_version: req.resource_version,
        };
        match self
            .commit(request_id(req.request_id)?, &caller, op)
            .await?
        {
            Response::Deleted {
                object,
                resource_version,
            } => Ok(TonicResponse::new(DeleteResponse {
                object_json: object.to_json(),
                resource_version,
            })),
            r => Err(unexpected(r)),
        }
    }

    async fn update_status(
        &self,
        req: Request<UpdateStatusRequest>,
    ) -> Result<TonicResponse<UpdateStatusResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let key = object_key(&req.kind, &req.namespace, &req.name)?;
        let owner = match caller {
            Caller::Node { .. } => self.owner(&key),
            _ => None,
        };
        self.check(
            &caller,
            &Access::new(Verb::UpdateStatus, &key.kind, &key.namespace, &key.name)
                .owned_by(owner.as_deref()),
        )?;
        let kind = parse_kind(&req.kind, "kind")?;
        let status = tb_api::load::parse_status_json(kind, &req.status_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let op = Op::UpdateStatus {
            key,
            status,
            resource_version: req.resource_version,
        };
        match self
            .commit(request_id(req.request_id)?, &caller, op)
            .await?
        {
            Response::Status { object } => Ok(TonicResponse::new(UpdateStatusResponse {
                object_json: object.to_json(),
            })),
            r => Err(unexpected(r)),
        }
    }

    async fn record_event(
        &self,
        req: Request<RecordEventRequest>,
    ) -> Result<TonicResponse<RecordEventResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let mut raw: Object = tb_api::load::parse_json_strict(&req.event_json)
            .map_err(|e| Status::invalid_argument(format!("event: {e}")))?;
        if raw.metadata.name.is_empty() {
            // The store names events; validation wants a name meanwhile.
            raw.metadata.name = "event".into();
        }
        let event = tb_api::validate::validate_object(&raw)
            .map_err(|e| Status::invalid_argument(format!("event: {e}")))?;
        if event.kind != Kind::Event.as_str() {
            return Err(Status::invalid_argument("event: kind: expected Event"));
        }
        self.check(
            &caller,
            &Access::new(
                Verb::RecordEvent,
                &event.kind,
                &event.metadata.namespace,
                "",
            ),
        )?;
        match self
            .commit(
                request_id(req.request_id)?,
                &caller,
                Op::RecordEvent { event },
            )
            .await?
        {
            Response::Event { object } => Ok(TonicResponse::new(RecordEventResponse {
                event_json: object.to_json(),
            })),
            r => Err(unexpected(r)),
        }
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<TonicResponse<Self::WatchStream>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let kind = if req.kind.is_empty() {
            None
        } else {
            Some(parse_kind(&req.kind, "kind")?)
        };
        let filter = WatchFilter {
            kind: kind.map(|k| k.as_str().to_string()),
            namespace: match kind {
                Some(k) if !k.is_namespaced() => String::new(),
                _ => req.namespace,
            },
            selector: parse_selector(&req.label_selector)?,
        };
        check_namespace(&filter.namespace)?;
        self.check(
            &caller,
            &Access::new(
                Verb::Watch,
                filter.kind.as_deref().unwrap_or(""),
                &filter.namespace,
                "",
            ),
        )?;
        let store = self.node.store().clone();
        let (initial, mut live, from) = if req.resource_version == 0 {
            // Start with everything there is, then what changes: list and subscribe under
            // the state lock, so nothing falls between the two.
            let state = store.read();
            let live = store.hub.subscribe();
            let initial: Vec<WatchEvent> = state
                .all()
                .filter(|o| filter.matches(o))
                .map(|o| WatchEvent {
                    r#type: "ADDED".into(),
                    object_json: o.to_json(),
                    resource_version: o.metadata.resource_version,
                })
                .collect();
            (initial, live, state.revision)
        } else {
            let resume = store
                .hub
                .resume(req.resource_version)
                .map_err(|e| Status::out_of_range(e.to_string()))?;
            let initial = resume
                .backlog
                .iter()
                .filter(|c| filter.matches(&c.object))
                .map(|c| watch_event(c))
                .collect();
            (initial, resume.live, req.resource_version)
        };
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            let mut last = from;
            for ev in initial {
                last = last.max(ev.resource_version);
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            loop {
                tokio::select! {
                    change = live.recv() => match change {
                        Ok(c) => {
                            // A member that was behind may publish changes the client has seen.
                            let seen = req.resource_version != 0 && c.resource_version <= from;
                            if seen || !filter.matches(&c.object) {
                                continue;
                            }
                            last = c.resource_version;
                            if tx.send(Ok(watch_event(&c))).await.is_err() {
                                return;
                            }
                        }
                        Err(RecvError::Lagged(_)) => {
                            let _ = tx
                                .send(Err(Status::out_of_range(format!(
                                    "watch fell behind after resourceVersion {last}; re-list and watch again"
                                ))))
                                .await;
                            return;
                        }
                        // The member installed a snapshot: what it covered was never
                        // published, so the watcher must re-list.
                        Err(RecvError::Closed) => {
                            let _ = tx
                                .send(Err(Status::out_of_range(format!(
                                    "this controller caught up from a snapshot after resourceVersion {last}; re-list and watch again"
                                ))))
                                .await;
                            return;
                        }
                    },
                    _ = tx.closed() => return,
                    // The flag only ever turns true.
                    _ = stopping.changed() => {
                        let _ = tx.send(Err(Status::unavailable("controller shutting down; resume the watch on another controller"))).await;
                        return;
                    }
                }
            }
        });
        Ok(TonicResponse::new(Box::pin(ReceiverStream::new(rx))))
    }
}

struct WatchFilter {
    kind: Option<String>,
    namespace: String,
    selector: LabelSelector,
}

impl WatchFilter {
    fn matches(&self, o: &Object) -> bool {
        self.kind.as_ref().is_none_or(|k| &o.kind == k)
            && (self.namespace.is_empty() || o.metadata.namespace == self.namespace)
            && self.selector.matches(&o.metadata.labels)
    }
}

fn watch_event(c: &Change) -> WatchEvent {
    WatchEvent {
        r#type: c.kind.as_str().into(),
        object_json: c.object.to_json(),
        resource_version: c.resource_version,
    }
}

fn pb_result(outcome: &str, obj: &Object) -> PbApplyResult {
    PbApplyResult {
        kind: obj.kind.clone(),
        namespace: obj.metadata.namespace.clone(),
        name: obj.metadata.name.clone(),
        outcome: outcome.into(),
        object_json: obj.to_json(),
    }
}
