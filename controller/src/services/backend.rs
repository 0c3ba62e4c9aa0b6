//! The backend of an InferenceService: its rank 0's endpoint, as this controller's own store
//! replica names it (a follower's may lag a little behind the leader's; the proxy tries again
//! when a backend fails it).

use std::net::SocketAddr;

use tb_api::ObjectKey;
use tb_api::status::JobStatus;

use crate::raft::RaftNode;

/// The store key of InferenceService `namespace/name`.
pub fn service_key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        kind: tb_api::Kind::InferenceService.as_str().into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// What the store says of a service's backend now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The service is gone.
    Gone,
    /// It has no ready rank 0 (being placed, staging, loading, or unschedulable): why.
    NotReady(String),
    /// Rank 0 answers here.
    Ready(Rank0),
}

/// Where and how to reach a service's rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rank0 {
    pub addr: SocketAddr,
    /// Its endpoint is HTTPS, with the certificate the cluster CA signed for the service.
    pub https: bool,
    /// The API key it takes (none from an in-process cluster, whose controllers hold no
    /// secret).
    pub api_key: Option<String>,
}

/// The service's backend as the store names it.
pub fn lookup(node: &RaftNode, key: &ObjectKey) -> Backend {
    let state = node.store().read();
    let Some(obj) = state.get(key) else {
        return Backend::Gone;
    };
    match of_status(&JobStatus::from_value(&obj.status)) {
        Backend::Ready(rank0) => Backend::Ready(Rank0 {
            api_key: node
                .credentials()
                .service_key(&key.namespace, &key.name, &obj.metadata.uid),
            ..rank0
        }),
        other => other,
    }
}

/// The backend a service's status names: its `endpoint` once the Ready condition is True (its
/// key is [`lookup`]'s to add).
pub fn of_status(status: &JobStatus) -> Backend {
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready || status.endpoint.is_empty() {
        let why = if status.message.is_empty() {
            status.reason.clone()
        } else {
            status.message.clone()
        };
        return Backend::NotReady(why);
    }
    match endpoint_addr(&status.endpoint) {
        Some((addr, https)) => Backend::Ready(Rank0 {
            addr,
            https,
            api_key: None,
        }),
        None => Backend::NotReady(format!(
            "its endpoint {:?} is not http(s)://IP:PORT/v1",
            status.endpoint
        )),
    }
}

/// `https://IP:PORT/v1` → (`IP:PORT`, true); `http://…` → (…, false). Only a literal address
/// is accepted: the proxy never resolves names, so no lookup steers where a request goes.
pub fn endpoint_addr(endpoint: &str) -> Option<(SocketAddr, bool)> {
    let (rest, https) = match endpoint.strip_prefix("https://") {
        Some(rest) => (rest, true),
        None => (endpoint.strip_prefix("http://")?, false),
    };
    let authority = rest.split('/').next()?;
    Some((authority.parse().ok()?, https))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(v: serde_json::Value) -> JobStatus {
        JobStatus::from_value(&v)
    }

    #[test]
    fn a_ready_service_names_its_rank_0() {
        let s = status(json!({
            "endpoint": "http://127.0.0.1:32324/v1",
            "conditions": [{"type": "Ready", "status": "True"}]
        }));
        let ready = |https| {
            Backend::Ready(Rank0 {
                addr: "127.0.0.1:32324".parse().unwrap(),
                https,
                api_key: None,
            })
        };
        assert_eq!(of_status(&s), ready(false));
        let s = status(json!({
            "endpoint": "https://127.0.0.1:32324/v1",
            "conditions": [{"type": "Ready", "status": "True"}]
        }));
        assert_eq!(of_status(&s), ready(true));
    }

    #[test]
    fn a_service_not_ready_or_without_a_usable_endpoint_has_no_backend() {
        let s = status(json!({
            "endpoint": "http://127.0.0.1:32324/v1",
            "message": "staging",
            "conditions": [{"type": "Ready", "status": "False"}]
        }));
        assert_eq!(of_status(&s), Backend::NotReady("staging".into()));
        let s = status(json!({
            "endpoint": "http://example.com:80/v1",
            "conditions": [{"type": "Ready", "status": "True"}]
        }));
        assert!(matches!(of_status(&s), Backend::NotReady(_)));
        assert_eq!(endpoint_addr("ftp://10.0.0.1:1/v1"), None);
        assert_eq!(endpoint_addr("https://rank0.example:1/v1"), None);
        assert_eq!(
            endpoint_addr("http://[::1]:8080/v1"),
            Some(("[::1]:8080".parse().unwrap(), false))
        );
        assert_eq!(
            endpoint_addr("https://10.0.0.1:1/v1"),
            Some(("10.0.0.1:1".parse().unwrap(), true))
        );
    }
}
