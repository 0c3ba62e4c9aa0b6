//! What a controller presents to, and checks of, others: its TLS (the cluster CA and its own
//! certificate; none with `--insecure`) and the secret controllers share. Its `RaftNode` holds
//! them and every part that calls out or identifies callers asks it — nothing is kept in
//! process-wide state, so several controllers can run in one process (tests).

use std::time::Duration;

use tonic::transport::Endpoint;

use std::sync::{Arc, OnceLock};

use tokio_rustls::rustls::ClientConfig;

use crate::raft::PeerAuth;
use crate::tls::{CertifiedKey, ControllerTls};

/// What a service key is derived for (no other use of the secret yields the same bytes).
const SERVICE_KEY_CONTEXT: &str = "tb InferenceService API key\0";
/// Service keys start with this, so a log or a leak says what it is.
pub const SERVICE_KEY_PREFIX: &str = "tbsvc-";

#[derive(Default)]
pub struct Credentials {
    tls: Option<ControllerTls>,
    cluster_secret: String,
    /// The client configuration for rank 0 endpoints, made once: its session cache spares
    /// the forwarder a full handshake per request.
    services_client: OnceLock<Result<Arc<ClientConfig>, String>>,
}

impl Credentials {
    pub fn new(tls: Option<ControllerTls>, cluster_secret: String) -> Self {
        Credentials {
            tls,
            cluster_secret,
            services_client: OnceLock::new(),
        }
    }

    /// Neither TLS nor a secret: for members of an in-process cluster, which call each other
    /// directly. No caller is ever identified as a controller by these.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn tls(&self) -> Option<&ControllerTls> {
        self.tls.as_ref()
    }

    /// An endpoint for `addr` (`HOST:PORT`): `https` with the cluster CA when TLS is on, else
    /// `http`. Every call a controller makes to another controller or to a nodelet starts here.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        match &self.tls {
            Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?
                .tls_config(tls.client_config().timeout(Duration::from_secs(5))),
            None => Endpoint::from_shared(format!("http://{addr}")),
        }
    }

    /// The certificate to hand a joining nodelet at `address`, with the CA (PEM); None when
    /// TLS is off.
    pub fn issue_node_cert(
        &self,
        node: &str,
        address: &str,
    ) -> anyhow::Result<Option<(CertifiedKey, String)>> {
        match &self.tls {
            None => Ok(None),
            Some(tls) => Ok(Some((
                tls.ca.issue_node(node, address)?,
                tls.ca.cert_pem().to_string(),
            ))),
        }
    }

    /// Whether `presented` is this cluster's secret (in constant time; with no secret, nothing
    /// is).
    pub fn is_cluster_secret(&self, presented: &str) -> bool {
        !self.cluster_secret.is_empty()
            && tb_api::secret::constant_time_eq(
                presented.as_bytes(),
                self.cluster_secret.as_bytes(),
            )
    }

    /// The API key of InferenceService `namespace/name` whose object has uid `uid`: what the
    /// services forwarder sends to its rank 0 and what rank 0 checks. Derived from the cluster
    /// secret, so every controller computes the same one and none is stored (members can read
    /// every object); a service made again under the same name gets another. None without a
    /// secret (an in-process cluster): rank 0 then takes no key.
    pub fn service_key(&self, namespace: &str, name: &str, uid: &str) -> Option<String> {
        if self.cluster_secret.is_empty() {
            return None;
        }
        let message = [SERVICE_KEY_CONTEXT, namespace, "\0", name, "\0", uid].concat();
        let mac = crate::auth::hmac_sha256(self.cluster_secret.as_bytes(), message.as_bytes());
        Some(format!("{SERVICE_KEY_PREFIX}{}", hex::encode(mac)))
    }

    /// The certificate rank 0 of InferenceService `namespace/name` serves with, signed by the
    /// cluster CA; None without TLS (`--insecure`), where rank 0 serves plain HTTP.
    pub fn service_certificate(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Option<CertifiedKey>> {
        self.tls
            .as_ref()
            .map(|t| t.ca.issue_service(namespace, name))
            .transpose()
    }

    /// The TLS client configuration for rank 0 endpoints: the cluster CA alone; None without
    /// TLS.
    pub fn services_client(&self) -> Result<Option<Arc<ClientConfig>>, String> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        self.services_client
            .get_or_init(|| {
                tb_api::https::client_config(tls.ca.cert_pem()).map_err(|e| e.to_string())
            })
            .clone()
            .map(Some)
    }

    /// The cluster's controller join token (`crate::member_token`) with `salt` (the store's
    /// `member_join_salt`); None without TLS, whose CA the token pins.
    pub fn member_token(
        &self,
        salt: &str,
    ) -> anyhow::Result<Option<crate::member_token::MemberToken>> {
        match &self.tls {
            None => Ok(None),
            Some(tls) => Ok(Some(crate::member_token::MemberToken::for_cluster(
                tls.ca.cert_pem(),
                &self.cluster_secret,
                salt,
            )?)),
        }
    }

    /// The cluster secret itself, for a controller that joined with the join token.
    pub(crate) fn cluster_secret(&self) -> &str {
        &self.cluster_secret
    }

    /// What calls to other controllers present.
    pub fn peer_auth(&self) -> PeerAuth {
        PeerAuth::new(&self.cluster_secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_secret(secret: &str) -> Credentials {
        Credentials::new(None, secret.into())
    }

    #[test]
    fn service_keys_differ_by_service_and_secret_and_none_without_one() {
        let c = with_secret("tbcluster-0123456789abcdef0123456789abcdef");
        let key = c.service_key("default", "chat", "u1").expect("a key");
        assert!(
            key.starts_with(SERVICE_KEY_PREFIX) && key.len() == 6 + 64,
            "{key}"
        );
        assert_eq!(c.service_key("default", "chat", "u1"), Some(key.clone()));
        for other in [
            c.service_key("default", "chat", "u2"),
            c.service_key("team", "chat", "u1"),
            c.service_key("default", "chat2", "u1"),
            // Names cannot run into each other across the separator.
            c.service_key("default", "cha", "tu1"),
            with_secret("tbcluster-ffffffffffffffffffffffffffffffff")
                .service_key("default", "chat", "u1"),
        ] {
            assert_ne!(other, Some(key.clone()));
        }
        assert_eq!(
            Credentials::none().service_key("default", "chat", "u1"),
            None
        );
    }
}
