//! The API key rank 0 of a built-in InferenceService checks on its OpenAI endpoint. The
//! controllers derive it from their cluster secret and give it only to the node that runs that
//! rank 0 (their services forwarder sends the same key); the nodelet writes it where the rank
//! reads it (`--api-key-file`), 0600 for the rank's account, so no key is on a command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tb_api::Kind;
use tb_api::proto::ServiceKeyRequest;
use tb_api::specs::{AllocationSpec, Executor};
use tonic::Code;

use crate::agent::accounts::Account;
use crate::agent::controllers::Controllers;
use crate::agent::dirs;

/// The key's file in the allocation's directory (0711: the rank passes through, lists nothing).
const KEY_FILE: &str = "service.key";
/// How long a controller whose replica has not seen the allocation yet is asked again.
const NOT_SEEN_BOUND: Duration = Duration::from_secs(15);

/// Whether `spec` is rank 0 of a built-in InferenceService, which serves the OpenAI API.
pub(super) fn serves_openai(spec: &AllocationSpec) -> bool {
    spec.rank == 0
        && spec.executor == Executor::Builtin
        && spec.job.kind == Kind::InferenceService.as_str()
}

/// The key of the service whose rank 0 is allocation `namespace/name`. `Ok(None)`: the
/// controllers hold no secret (an in-process cluster) or predate keys, so rank 0 takes none.
pub(super) async fn fetch(
    controllers: &Controllers,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, String> {
    let request = ServiceKeyRequest {
        namespace: namespace.into(),
        allocation: name.into(),
    };
    let deadline = tokio::time::Instant::now() + NOT_SEEN_BOUND;
    loop {
        match controllers.client().service_key(request.clone()).await {
            Ok(r) if r.key.is_empty() => return Ok(None),
            Ok(r) => return Ok(Some(r.key)),
            Err(e) if e.code == Code::Unimplemented => {
                tracing::warn!(
                    alloc = %format!("{namespace}/{name}"),
                    "the controllers give no service keys (an older version): rank 0 takes none"
                );
                return Ok(None);
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

/// Writes `key` into the allocation's directory `dir` for `account`; returns its path.
pub(super) fn write(dir: &Path, key: &str, account: Option<&Account>) -> anyhow::Result<PathBuf> {
    let path = dir.join(KEY_FILE);
    dirs::write_private(&path, format!("{key}\n").as_bytes())?;
    dirs::give_file(&path, account)?;
    Ok(path)
}
