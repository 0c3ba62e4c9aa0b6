//! What rank 0 of a built-in InferenceService serves its OpenAI endpoint with: the service's
//! API key, and with TLS on, a certificate for the service's name signed by the cluster CA.
//! The controllers derive the key from their cluster secret, issue the certificate, and give
//! both only to the node that runs that rank 0 (their services forwarder sends the same key and
//! checks that certificate); the nodelet writes them where the rank reads them
//! (`--api-key-file`, `--tls-cert-file`, `--tls-key-file`), 0600 for the rank's account, so no
//! secret is on a command line.

use std::path::Path;
use std::time::Duration;

use tb_api::Kind;
use tb_api::proto::ServiceKeyRequest;
use tb_api::specs::{AllocationSpec, Executor};
use tonic::Code;

use crate::agent::accounts::Account;
use crate::agent::controllers::Controllers;
use crate::agent::dirs;

/// The files in the allocation's directory (0711: the rank passes through, lists nothing).
const KEY_FILE: &str = "service.key";
const CERT_FILE: &str = "service.crt";
const TLS_KEY_FILE: &str = "service-tls.key";
/// How long a controller whose replica has not seen the allocation yet is asked again.
const NOT_SEEN_BOUND: Duration = Duration::from_secs(15);

/// The service's credentials, as the controllers gave them.
#[derive(Debug, Clone, Default)]
pub(in crate::agent) struct ServiceCredentials {
    /// None: the controllers hold no secret (an in-process cluster) or predate keys.
    pub key: Option<String>,
    /// Certificate and key (PEM); None without TLS.
    pub tls: Option<(String, String)>,
}

/// Whether `spec` is rank 0 of a built-in InferenceService, which serves the OpenAI API.
pub(super) fn serves_openai(spec: &AllocationSpec) -> bool {
    spec.rank == 0
        && spec.executor == Executor::Builtin
        && spec.job.kind == Kind::InferenceService.as_str()
}

/// The credentials of the service whose rank 0 is allocation `namespace/name`.
pub(super) async fn fetch(
    controllers: &Controllers,
    namespace: &str,
    name: &str,
) -> Result<ServiceCredentials, String> {
    let request = ServiceKeyRequest {
        namespace: namespace.into(),
        allocation: name.into(),
    };
    let deadline = tokio::time::Instant::now() + NOT_SEEN_BOUND;
    loop {
        match controllers.client().service_key(request.clone()).await {
            Ok(r) => {
                let tls = (!r.cert_pem.is_empty() && !r.key_pem.is_empty())
                    .then_some((r.cert_pem, r.key_pem));
                let key = (!r.key.is_empty()).then_some(r.key);
                return Ok(ServiceCredentials { key, tls });
            }
            Err(e) if e.code == Code::Unimplemented => {
                tracing::warn!(
                    alloc = %format!("{namespace}/{name}"),
                    "the controllers give no service keys (an older version): rank 0 takes none"
                );
                return Ok(ServiceCredentials::default());
            }
            // The controller that answered may not have applied the allocation yet.
            Err(e) if e.code == Code::NotFound && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e.message, "asking for the service key again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(format!(
                    "asking the controllers for the service's API key: {}",
                    e.message
                ));
            }
        }
    }
}

/// Writes the credentials into the allocation's directory `dir` for `account`; returns the
/// arguments that point tb-shard at them.
pub(super) fn write(
    dir: &Path,
    credentials: &ServiceCredentials,
    account: Option<&Account>,
) -> anyhow::Result<Vec<String>> {
    let mut args = Vec::new();
    let mut put = |file: &str, text: &str, flag: &str| -> anyhow::Result<()> {
        let path = dir.join(file);
        dirs::write_private(&path, text.as_bytes())?;
        dirs::give_file(&path, account)?;
        args.extend([flag.to_string(), path.display().to_string()]);
        Ok(())
    };
    if let Some(key) = &credentials.key {
        put(KEY_FILE, &format!("{key}\n"), "--api-key-file")?;
    }
    if let Some((cert, key)) = &credentials.tls {
        put(CERT_FILE, cert, "--tls-cert-file")?;
        put(TLS_KEY_FILE, key, "--tls-key-file")?;
    }
    Ok(args)
}
