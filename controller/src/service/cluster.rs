//! The `Cluster` gRPC service: membership and health of the controller cluster.

use std::sync::Arc;
use std::time::Duration;

use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::cluster_server::Cluster;
use tb_api::proto::{
    AddMemberRequest, AddMemberResponse, ClusterStatusRequest, ClusterStatusResponse,
    RemoveMemberRequest, RemoveMemberResponse,
};
use tonic::{Request, Response, Status};

use super::{caller, check};
use crate::auth::authorize::CLUSTER_MEMBER;
use crate::auth::{Access, Verb};
use crate::raft::RaftNode;

pub struct ClusterService {
    node: Arc<RaftNode>,
}

impl ClusterService {
    pub fn new(node: Arc<RaftNode>) -> Self {
        ClusterService { node }
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
