//! The `Cluster` gRPC service: membership and health of the controller cluster.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;

use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::cluster_server::Cluster;
use tb_api::proto::{
    AddMemberRequest, AddMemberResponse, ClusterCaRequest, ClusterCaResponse, ClusterStatusRequest,
    ClusterStatusResponse, JoinClusterRequest, JoinClusterResponse, MemberJoinTokenRequest,
    MemberJoinTokenResponse, RemoveMemberRequest, RemoveMemberResponse, SaveSnapshotRequest,
    SnapshotChunk,
};
use tonic::{Request, Response, Status};

use super::{caller, check, unavailable};
use crate::auth::authorize::{CLUSTER_MEMBER, CLUSTER_SNAPSHOT, MEMBER_JOIN_TOKEN};
use crate::auth::{Access, Verb};
use crate::raft::RaftNode;
use crate::store::Op;

pub struct ClusterService {
    node: Arc<RaftNode>,
    join_failures: super::member_join::FailureWindow,
}

impl ClusterService {
    pub fn new(node: Arc<RaftNode>) -> Self {
        ClusterService {
            node,
            join_failures: Default::default(),
        }
    }

    /// Membership changes run on the leader; a follower passes the request on.
    async fn leader_client(
        &self,
    ) -> Result<Option<ClusterClient<crate::raft::PeerChannel>>, Status> {
        let (leader, addr) = self.node.leader().ok_or_else(|| {
            Status::unavailable("no leader is elected (is a majority of controllers up?)")
        })?;
        if leader == self.node.id {
            return Ok(None);
        }
        let credentials = self.node.credentials();
        let channel = credentials
            .endpoint(&addr)
            .map_err(|e| Status::internal(e.to_string()))?
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
            .map_err(|e| Status::unavailable(format!("leader {leader} at {addr}: {e}")))?;
        Ok(Some(ClusterClient::with_interceptor(
            channel,
            credentials.peer_auth(),
        )))
    }
}

/// The size of the pieces a snapshot file is streamed in (well under gRPC's message limit).
const SNAPSHOT_CHUNK: usize = 1024 * 1024;

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotChunk, Status>> + Send>>;

/// The snapshot file of this member's store, once it reflects every acknowledged write.
async fn snapshot_file(node: &RaftNode) -> Result<Vec<u8>, Status> {
    // The barrier: every write acknowledged before the request is applied here.
    node.linearize().await.map_err(unavailable)?;
    let state = node.store().read().clone();
    tokio::task::spawn_blocking(move || {
        let body = serde_json::to_vec(&state)
            .map_err(|e| Status::internal(format!("encoding the store: {e}")))?;
        let header = tb_api::snapshot_file::SnapshotHeader::for_body(
            &state.cluster_id,
            state.revision,
            &super::now(),
            &body,
        );
        Ok(tb_api::snapshot_file::encode(&header, &body))
    })
    .await
    .map_err(|e| Status::internal(format!("encoding the store: {e}")))?
}

fn check_address(addr: &str) -> Result<(), Status> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "address: expected HOST:PORT, got {}",
            tb_api::bounds::Quoted(addr)
        )))
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        check(
            &self.node,
            &caller(&req),
            &Access::new(Verb::Get, CLUSTER_MEMBER, "", ""),
        )?;
        Ok(Response::new(self.node.cluster_status().await))
    }

    async fn add_member(
        &self,
        req: Request<AddMemberRequest>,
    ) -> Result<Response<AddMemberResponse>, Status> {
        check(
            &self.node,
            &caller(&req),
            &Access::new(Verb::Create, CLUSTER_MEMBER, "", ""),
        )?;
        let req = req.into_inner();
        if req.id == 0 {
            return Err(Status::invalid_argument("id: controller ids start at 1"));
        }
        check_address(&req.address)?;
        if let Some(mut leader) = self.leader_client().await? {
            return leader.add_member(req).await;
        }
        self.node
            .add_member(req.id, req.address)
            .await
            .map_err(|e| Status::failed_precondition(format!("{e:#}")))?;
        Ok(Response::new(AddMemberResponse {
            status: Some(self.node.cluster_status().await),
        }))
    }

    type SaveSnapshotStream = SnapshotStream;

    async fn save_snapshot(
        &self,
        req: Request<SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        let who = caller(&req);
        check(
            &self.node,
            &who,
            &Access::new(Verb::Get, CLUSTER_SNAPSHOT, "", ""),
        )?;
        if let Some(mut leader) = self.leader_client().await? {
            // The leader sees a controller ask: the caller is named here.
            tracing::info!(caller = %who.audit_name(), "snapshot file asked for; taken on the leader");
            let stream = leader.save_snapshot(req.into_inner()).await?.into_inner();
            return Ok(Response::new(Box::pin(stream)));
        }
        let started = std::time::Instant::now();
        let file = snapshot_file(&self.node).await?;
        // Who took a copy of every credential's hash is worth knowing.
        tracing::info!(
            caller = %who.audit_name(),
            bytes = file.len(),
            ms = started.elapsed().as_millis() as u64,
            "snapshot file taken"
        );
        let chunks: Vec<Result<SnapshotChunk, Status>> = file
            .chunks(SNAPSHOT_CHUNK)
            .map(|c| Ok(SnapshotChunk { data: c.to_vec() }))
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn cluster_ca(
        &self,
        _req: Request<ClusterCaRequest>,
    ) -> Result<Response<ClusterCaResponse>, Status> {
        let tls = self.node.credentials().tls().ok_or_else(|| {
            Status::failed_precondition("this controller runs without TLS (--insecure): no CA")
        })?;
        Ok(Response::new(ClusterCaResponse {
            ca_cert_pem: tls.ca.cert_pem().to_string(),
        }))
    }

    async fn member_join_token(
        &self,
        req: Request<MemberJoinTokenRequest>,
    ) -> Result<Response<MemberJoinTokenResponse>, Status> {
        let who = caller(&req);
        let rotate = req.get_ref().rotate;
        let verb = if rotate { Verb::Create } else { Verb::Get };
        check(
            &self.node,
            &who,
            &Access::new(verb, MEMBER_JOIN_TOKEN, "", ""),
        )?;
        let token = if rotate {
            // Refused before anything is committed on a cluster whose token cannot exist.
            super::member_join::cluster_token(&self.node, None)?;
            let salt = hex::encode(rand::random::<[u8; 16]>());
            super::commit(
                &self.node,
                String::new(),
                who.user(),
                Op::RotateMemberJoinToken { salt: salt.clone() },
            )
            .await?;
            tracing::info!(caller = %who.audit_name(), "controller join token rotated");
            super::member_join::cluster_token(&self.node, Some(&salt))?
        } else {
            super::member_join::cluster_token(&self.node, None)?
        };
        // Who may now hand out the cluster's keys is worth knowing.
        tracing::info!(caller = %who.audit_name(), "controller join token read");
        Ok(Response::new(MemberJoinTokenResponse {
            token: token.to_string(),
        }))
    }

    async fn join_cluster(
        &self,
        req: Request<JoinClusterRequest>,
    ) -> Result<Response<JoinClusterResponse>, Status> {
        let req = req.into_inner();
        super::member_join::check_token(&self.node, &self.join_failures, &req)?;
        if req.id == 0 {
            return Err(Status::invalid_argument("id: controller ids start at 1"));
        }
        check_address(&req.address)?;
        // Membership is the leader's to say: a follower's view may be behind.
        if let Some(mut leader) = self.leader_client().await? {
            return leader.join_cluster(req).await;
        }
        super::member_join::answer(&self.node, &req).map(Response::new)
    }

    async fn remove_member(
        &self,
        req: Request<RemoveMemberRequest>,
    ) -> Result<Response<RemoveMemberResponse>, Status> {
        check(
            &self.node,
            &caller(&req),
            &Access::new(Verb::Delete, CLUSTER_MEMBER, "", ""),
        )?;
        let req = req.into_inner();
        if let Some(mut leader) = self.leader_client().await? {
            return leader.remove_member(req).await;
        }
        self.node
            .remove_member(req.id)
            .await
            .map_err(|e| Status::failed_precondition(format!("{e:#}")))?;
        Ok(Response::new(RemoveMemberResponse {
            status: Some(self.node.cluster_status().await),
        }))
    }
}
