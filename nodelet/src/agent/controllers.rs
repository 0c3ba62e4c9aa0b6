//! The controllers a nodelet talks to, as [`tb_client::Client`]s: the addresses it was given,
//! the cluster CA when it has one (`super::tls`), the node's credential once it has one
//! (`authorization: Bearer tbnode-…`; the controllers let a node read objects and write only its
//! own statuses), and which controller answered last, so a new client starts there.
//! Dialling, failing over, the retry rule and request ids are tb-client's.

use std::sync::Mutex;
use std::time::Duration;

use tb_client::Bearer;
use tb_client::connect::Dial;

/// How long one call from here may take, retries and fail-over included, unless the caller
/// asks for another budget ([`Controllers::client_for`]).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The controllers, and which one answered last.
pub struct Controllers {
    addresses: Vec<String>,
    preferred: Mutex<usize>,
    /// The node's credential once it has one; shared by every client made here.
    bearer: Bearer,
    /// The CA to verify controllers with; None: plain TCP.
    trust: Option<super::tls::Trust>,
    dial: Dial,
}

impl Controllers {
    pub fn new(addresses: Vec<String>, trust: Option<super::tls::Trust>) -> Controllers {
        Controllers {
            addresses,
            preferred: Mutex::new(0),
            bearer: Bearer::default(),
            trust,
            // A nodelet notices a vanished controller sooner than tbctl: its watches must move
            // on for the node to keep running what it was assigned.
            dial: Dial {
                connect_timeout: Duration::from_millis(800),
                keep_alive_interval: Duration::from_secs(5),
                ..Dial::default()
            },
        }
    }

    /// The credential later calls carry.
    pub fn set_credential(&self, credential: &str) {
        self.bearer.set(Some(credential));
    }

    /// The cluster CA, when the controllers are called over TLS.
    pub fn trust(&self) -> Option<&super::tls::Trust> {
        self.trust.as_ref()
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// A client whose calls may take [`CALL_TIMEOUT`].
    pub fn client(&self) -> tb_client::Client {
        self.client_for(CALL_TIMEOUT)
    }

    /// A client of the controllers with the node's credential, starting with the one that
    /// answered last, whose calls may take `timeout` in all. Whether a token may go in clear
    /// text was settled when the nodelet started (`super::run`), so the client is not asked
    /// again.
    pub fn client_for(&self, timeout: Duration) -> tb_client::Client {
        let start = *self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.addresses.len();
        let servers = (0..n)
            .map(|i| &self.addresses[(start + i) % n])
            .filter_map(|a| match tb_client::parse_server(a) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(address = %a, "skipping a controller address: {e}");
                    None
                }
            })
            .collect();
        // The nodelet outlives controller restarts: a refused connection is waited out.
        tb_client::Client::new(servers, timeout)
            .with_refused(tb_client::retry::Refused::Retry)
            .with_trust(self.trust.clone())
            .with_bearer(self.bearer.clone())
            .with_insecure(true)
            .with_dial(self.dial.clone())
    }

    /// Remember the controller `client` talks to now (after it answered), so the next client
    /// made here starts with it.
    pub fn remember(&self, client: &tb_client::Client) {
        let Some(current) = client.current_server() else {
            return;
        };
        if let Some(i) = self
            .addresses
            .iter()
            .position(|a| tb_client::parse_server(a).is_ok_and(|s| &s == current))
        {
            *self.preferred.lock().unwrap_or_else(|e| e.into_inner()) = i;
        }
    }
}
