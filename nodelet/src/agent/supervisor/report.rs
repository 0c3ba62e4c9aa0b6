//! Writing an allocation's status to the controllers, retried across them until it lands,
//! the allocation is gone, or the time runs out.

use std::time::Duration;

use tb_api::Kind;
use tb_api::proto::UpdateStatusRequest;
use tb_api::specs::AllocationStatus;

use super::Supervisor;
use crate::agent::controllers::Controllers;

/// Write an allocation's status, retrying across controllers until it lands, the allocation
/// is gone, or [`REPORT_TIMEOUT`] passes.
pub(super) async fn report(
    controllers: &Controllers,
    namespace: &str,
    name: &str,
    status: &AllocationStatus,
) {
    let mut client = controllers.client_for(REPORT_TIMEOUT);
    let result = client
        .update_status(UpdateStatusRequest {
            kind: Kind::Allocation.as_str().into(),
            namespace: namespace.into(),
            name: name.into(),
            status_json: status.to_value().to_string(),
            resource_version: 0,
            // Filled once by the client, so retries across controllers apply at most once.
            request_id: String::new(),
        })
        .await;
    match result {
        Ok(_) => controllers.remember(&client),
        Err(e) if e.code == tonic::Code::NotFound => {}
        Err(e) if e.is_unanswered() => {
            tracing::warn!(alloc = %format!("{namespace}/{name}"), "gave up reporting status: {e}")
        }
        Err(e) => {
            tracing::warn!(alloc = %format!("{namespace}/{name}"), "status not accepted: {e}")
        }
    }
}

/// How long a status report keeps trying: long enough to ride out a leader election or a
/// controller restart.
pub(super) const REPORT_TIMEOUT: Duration = Duration::from_secs(120);

impl Supervisor {
    /// Write an allocation's status, retrying across controllers until it lands or the
    /// allocation is gone.
    pub(super) async fn report(&self, namespace: &str, name: &str, status: &AllocationStatus) {
        report(&self.controllers, namespace, name, status).await
    }
}
