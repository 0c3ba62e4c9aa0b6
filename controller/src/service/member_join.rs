//! The server side of a controller joining with the join token (`Cluster.JoinCluster`): the
//! token check (bounded sizes, constant-time compare, a cap on failed attempts), and what a
//! new member is handed — the CA certificate and key (it signs its own certificate and
//! nodelets' at join) and the cluster secret (it talks to the other members). Not the admin
//! token: users' tokens live in the replicated store, which the new member receives by Raft.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tb_api::proto::{JoinClusterRequest, JoinClusterResponse};
use tonic::Status;

use crate::member_token::{MAX_TOKEN_LEN, MemberToken};
use crate::raft::RaftNode;

/// The longest address a joiner may give.
const MAX_ADDRESS_LEN: usize = 256;
/// Failed join attempts a member answers per window; later ones are refused unread.
const MAX_FAILURES: usize = 20;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Recent failed join attempts on this member.
#[derive(Default)]
pub struct FailureWindow {
    failures: Mutex<VecDeque<Instant>>,
}

impl FailureWindow {
    fn prune(failures: &mut VecDeque<Instant>, now: Instant) {
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > FAILURE_WINDOW)
        {
            failures.pop_front();
        }
    }

    /// Refuse while too many attempts failed lately (guessing gets nowhere, and costs little).
    fn check(&self) -> Result<(), Status> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        Self::prune(&mut failures, Instant::now());
        if failures.len() >= MAX_FAILURES {
            return Err(Status::resource_exhausted(format!(
                "too many failed controller join attempts on this controller; try again in {} s",
                FAILURE_WINDOW.as_secs()
            )));
        }
        Ok(())
    }

    fn failed(&self) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        Self::prune(&mut failures, now);
        failures.push_back(now);
    }
}

/// This cluster's join token with `salt`; None: the store's current one.
pub fn cluster_token(node: &RaftNode, salt: Option<&str>) -> Result<MemberToken, Status> {
    let current = node.store().read().member_join_salt.clone();
    node.credentials()
        .member_token(salt.unwrap_or(&current))
        .map_err(|e| Status::internal(format!("making the join token: {e:#}")))?
        .ok_or_else(|| {
            Status::failed_precondition(
                "this cluster runs without TLS (--insecure): controllers join it with \
                 --tls-ca-cert/--tls-ca-key and --cluster-secret-file, not a join token (the \
                 token pins the cluster CA)",
            )
        })
}

/// Whether `req` carries this cluster's join token; every refusal is UNAUTHENTICATED and says
/// nothing about the expected token.
pub fn check_token(
    node: &RaftNode,
    failures: &FailureWindow,
    req: &JoinClusterRequest,
) -> Result<(), Status> {
    if req.token.len() > MAX_TOKEN_LEN || req.address.len() > MAX_ADDRESS_LEN {
        return Err(Status::invalid_argument(format!(
            "the token may be at most {MAX_TOKEN_LEN} bytes and the address {MAX_ADDRESS_LEN}"
        )));
    }
    failures.check()?;
    let expected = cluster_token(node, None)?;
    let refuse = |why: &str| {
        failures.failed();
        tracing::warn!(
            id = req.id,
            address = %tb_api::bounds::Quoted(&req.address),
            why,
            "refused a controller join"
        );
        Status::unauthenticated(format!(
            "the join token is not this cluster's ({why}); an admin prints the right one with \
             `tbctl cluster join-token`"
        ))
    };
    let presented = MemberToken::parse(&req.token).map_err(|e| refuse(&e.to_string()))?;
    if !expected.matches(&presented) {
        return Err(refuse("wrong token"));
    }
    Ok(())
}

/// On the leader, after the token check: refuse an id or address another member holds, else
/// hand over what a member needs.
pub fn answer(node: &RaftNode, req: &JoinClusterRequest) -> Result<JoinClusterResponse, Status> {
    let members = node.members();
    for (id, address, voter) in &members {
        if *id == req.id && *address != req.address {
            return Err(Status::already_exists(format!(
                "controller id {id} is already a member at {address}; start this controller \
                 with another --id, or remove member {id} first (tbctl cluster remove-member {id})"
            )));
        }
        if *id == req.id && *voter {
            return Err(Status::already_exists(format!(
                "controller {id} at {address} is already a voter. If it is this controller and \
                 its data dir was lost, remove it first (tbctl cluster remove-member {id}) and \
                 join again; a member with its data dir just restarts"
            )));
        }
        if *id != req.id && *address == req.address {
            return Err(Status::already_exists(format!(
                "{address} is already the address of member {id}; give this controller its own \
                 --listen/--advertise address"
            )));
        }
    }
    let Some(tls) = node.credentials().tls() else {
        return Err(Status::failed_precondition(
            "this controller runs without TLS",
        ));
    };
    tracing::info!(
        id = req.id,
        address = %req.address,
        "handing a controller joining with the join token the cluster's credentials"
    );
    Ok(JoinClusterResponse {
        ca_cert_pem: tls.ca.cert_pem().to_string(),
        ca_key_pem: tls.ca.key_pem().to_string(),
        cluster_secret: node.credentials().cluster_secret().to_string(),
        members: members
            .iter()
            .map(|(id, address, _)| format!("{id}={address}"))
            .collect(),
    })
}
