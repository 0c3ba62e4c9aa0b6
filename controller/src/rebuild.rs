//! `--rebuild-from-peers`: a member whose database is damaged gets its state back from the
//! cluster instead of refusing to start.
//!
//! A member that forgot its log and vote must not count towards a majority until it holds the
//! log again: it may have been one of the majority that acknowledged a write, and a blank
//! voter could elect a leader that lacks it. So the member first asks the cluster to remove it
//! (a majority of the others must agree, so the cluster is healthy), only then starts on a new,
//! empty database, and asks to be added back: the leader catches it up as a learner — with a
//! snapshot when the log it needs was purged — and promotes it to voter once it has caught up.
//! The damaged file is kept beside the new one, renamed, for whoever looks into the failure.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::{AddMemberRequest, RemoveMemberRequest};

use crate::credentials::Credentials;
use crate::raft::NodeId;

/// How long the cluster gets to remove or add this member.
const MEMBERSHIP_BUDGET: Duration = Duration::from_secs(120);

/// Rename the damaged database to `tb.redb.damaged-UNIXTIME` in the same directory; returns
/// the new name.
pub fn move_aside(db: &Path) -> anyhow::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = db
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| crate::raft::DB_FILE.into());
    let aside = db.with_file_name(format!("{name}.damaged-{secs}"));
    std::fs::rename(db, &aside)
        .with_context(|| format!("moving {} aside to {}", db.display(), aside.display()))?;
    Ok(aside)
}

/// Ask the cluster (through any of `peers`) to remove member `id`; a member that is not in the
/// cluster any more is fine.
pub async fn leave(credentials: &Credentials, peers: &[String], id: NodeId) -> anyhow::Result<()> {
    let result = each_peer(peers, "removing this member", |addr| async move {
        let mut client = client(credentials, &addr).await?;
        let mut req = tonic::Request::new(RemoveMemberRequest { id });
        req.set_timeout(Duration::from_secs(30));
        client.remove_member(req).await.map(|_| ())
    })
    .await;
    match result {
        Err(e) if e.to_string().contains("is not a member") => Ok(()),
        other => other,
    }
}

/// Ask the cluster (through any of `peers`) to add member `id` at `addr` back: it returns once
/// the leader has caught this member up and made it a voter again.
pub async fn rejoin(
    credentials: &Credentials,
    peers: &[String],
    id: NodeId,
    addr: &str,
) -> anyhow::Result<()> {
    ask_to_add(credentials, peers, id, addr, "adding this member back").await
}

/// Ask the cluster (through any of `peers`, as a controller) to add member `id` at `addr`: it
/// returns once the leader has caught it up as a learner and made it a voter. `what` names the
/// step in errors.
pub async fn ask_to_add(
    credentials: &Credentials,
    peers: &[String],
    id: NodeId,
    addr: &str,
    what: &str,
) -> anyhow::Result<()> {
    each_peer(peers, what, |peer| async move {
        let mut client = client(credentials, &peer).await?;
        let mut req = tonic::Request::new(AddMemberRequest {
            id,
            address: addr.to_string(),
        });
        req.set_timeout(MEMBERSHIP_BUDGET);
        client.add_member(req).await.map(|_| ())
    })
    .await
}

async fn client(
    credentials: &Credentials,
    addr: &str,
) -> Result<ClusterClient<crate::raft::PeerChannel>, tonic::Status> {
    let channel = credentials
        .endpoint(addr)
        .map_err(|e| tonic::Status::internal(e.to_string()))?
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{addr}: {e}")))?;
    Ok(ClusterClient::with_interceptor(
        channel,
        credentials.peer_auth(),
    ))
}

/// Try `call` on each peer in turn, round after round, until one succeeds or the budget is
/// spent; a refusal that retrying cannot change (not `UNAVAILABLE`, nor a membership change
/// in progress) ends it at once.
async fn each_peer<F, Fut>(peers: &[String], what: &str, mut call: F) -> anyhow::Result<()>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let deadline = tokio::time::Instant::now() + MEMBERSHIP_BUDGET;
    let mut last = String::from("no peer to ask");
    while tokio::time::Instant::now() < deadline {
        for peer in peers {
            match call(peer.clone()).await {
                Ok(()) => return Ok(()),
                // Unreachable, or another member being added or removed at the same time
                // (openraft takes one membership change at a time): try again.
                Err(e)
                    if e.code() == tonic::Code::Unavailable
                        || e.message().contains("undergoing a configuration change") =>
                {
                    last = format!("{peer}: {}", e.message());
                }
                Err(e) => anyhow::bail!("{what}: {peer} refused: {}", e.message()),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!(
        "{what}: no majority of the cluster agreed within {}s (last: {last}); is a majority of \
         the other controllers up?",
        MEMBERSHIP_BUDGET.as_secs()
    )
}
