//! The probe loop: follows the Link objects with tb-client's informer (listed first, watched
//! from the list's resourceVersion, resumed elsewhere or listed again after a pause on any
//! error) and probes, one at a time, each
//! Link whose end `a` is this node and whose two ends have addresses, when
//! `!status.measured() || status.probeRequest < spec.probeRequest`.
//!
//! A probe goes from `a.address` to `b.address` at the port `b.node`'s Node status gives as
//! `probePort`. The result is written with UpdateStatus: figures, `measuredAt`, `measuredBy`
//! (this node), `probeRequest` (the spec's, answered), transport `tcp`. A failed probe writes
//! `error` and keeps the earlier figures; the link is tried again after a backoff that doubles
//! from [`FIRST_RETRY`] to [`MAX_RETRY`] (at once when the spec changes).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tb_api::proto::{GetRequest, UpdateStatusRequest};
use tb_api::specs::{LinkSpec, LinkStatus, parse_spec};
use tb_api::status::NodeStatus;
use tb_api::{Kind, Object};
use tb_client::informer::{Change, Informer, Scope};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{ProbeConfig, client};
use crate::agent::controllers::Controllers;
use crate::agent::supervisor::now;

/// The first pause before probing a link again after a failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The longest pause between failed probes of one link.
pub const MAX_RETRY: Duration = Duration::from_secs(300);
/// How long writing one status may take, retries included, before the probe counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a link needs (another) measurement.
pub fn due(spec: &LinkSpec, status: &LinkStatus) -> bool {
    !status.measured() || status.probe_request < spec.probe_request
}

/// Backoff after `failures` failed probes in a row (1 or more).
pub fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(MAX_RETRY)
}

pub struct Prober {
    node: String,
    controllers: Arc<Controllers>,
    config: ProbeConfig,
    /// The Links whose end `a` is this node, by name.
    links: Mutex<BTreeMap<String, Object>>,
    changed: Notify,
}

/// A link's failures, for the spec they happened under.
struct Failing {
    spec: LinkSpec,
    failures: u32,
    next: Instant,
}

impl Prober {
    pub fn new(node: String, controllers: Arc<Controllers>, config: ProbeConfig) -> Arc<Prober> {
        Arc::new(Prober {
            node,
            controllers,
            config,
            links: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
        })
    }

    /// Watch and probe until the process ends.
    pub async fn run(self: Arc<Self>) {
        tokio::spawn(self.clone().work());
        let mut client = self.controllers.client();
        let mut informer = Informer::new(Scope {
            kind: Kind::Link,
            namespace: String::new(),
            selector: String::new(),
        });
        loop {
            match informer.next(&mut client).await {
                Ok(batch) => {
                    {
                        // A list (first or again) comes as one batch, so a listing cut short
                        // leaves the old view whole.
                        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
                        for change in &batch.changes {
                            self.absorb(&mut links, change);
                        }
                    }
                    self.changed.notify_one();
                }
                Err(e) => {
                    tracing::debug!("watching links: {e}; reconnecting");
                    client.fail_over();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Applies one change to `links` (only Links whose end `a` is this node are kept).
    fn absorb(&self, links: &mut BTreeMap<String, Object>, change: &Change) {
        let obj = &change.object;
        let name = obj.metadata.name.clone();
        let mine = change.type_ != "DELETED"
            && parse_spec::<LinkSpec>(&obj.spec).is_ok_and(|s| s.a.node == self.node);
        if mine {
            links.insert(name, obj.clone());
        } else {
            links.remove(&name);
        }
    }

    /// Probe due links one at a time, forever.
    /// `failing` and `answered` hold at most one entry per Link name seen since start.
    async fn work(self: Arc<Self>) {
        let mut failing: HashMap<String, Failing> = HashMap::new();
        // Links answered by this nodelet: (uid, spec) they were measured under, until the
        // watch brings back the status written.
        let mut answered: HashMap<String, (String, LinkSpec)> = HashMap::new();
        loop {
            let now = Instant::now();
            let mut wake: Option<Instant> = None;
            let mut pick: Option<(Object, LinkSpec)> = None;
            {
                let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
                for (name, obj) in links.iter() {
                    let Ok(spec) = parse_spec::<LinkSpec>(&obj.spec) else {
                        continue;
                    };
                    let status = LinkStatus::from_value(&obj.status);
                    if !due(&spec, &status) || spec.a.address.is_none() || spec.b.address.is_none()
                    {
                        continue;
                    }
                    if answered
                        .get(name)
                        .is_some_and(|(uid, s)| *uid == obj.metadata.uid && *s == spec)
                    {
                        continue;
                    }
                    if let Some(f) = failing.get(name)
                        && f.spec == spec
                        && f.next > now
                    {
                        wake = Some(wake.map_or(f.next, |w| w.min(f.next)));
                        continue;
                    }
                    pick = Some((obj.clone(), spec));
                    break;
                }
            }
            let Some((obj, spec)) = pick else {
                match wake {
                    Some(at) => {
                        tokio::select! {
                            _ = self.changed.notified() => {}
                            _ = tokio::time::sleep_until(at) => {}
                        }
                    }
                    None => self.changed.notified().await,
                }
                continue;
            };
            let name = obj.metadata.name.clone();
            match self.probe(&obj, &spec).await {
                Ok(()) => {
                    failing.remove(&name);
                    answered.insert(name, (obj.metadata.uid.clone(), spec));
                }
                Err(e) => {
                    let f = failing.entry(name.clone()).or_insert(Failing {
                        spec: spec.clone(),
                        failures: 0,
                        next: Instant::now(),
                    });
                    if f.spec != spec {
                        f.spec = spec;
                        f.failures = 0;
                    }
                    f.failures += 1;
                    let pause = retry_after(f.failures);
                    f.next = Instant::now() + pause;
                    tracing::warn!(link = %name, failures = f.failures, retry_in = ?pause, "link probe failed: {e}");
                }
            }
        }
    }

    /// Probes one link and writes what came of it; Err when the probe or the write failed.
    async fn probe(&self, obj: &Object, spec: &LinkSpec) -> Result<(), String> {
        let name = &obj.metadata.name;
        let previous = LinkStatus::from_value(&obj.status);
        let outcome = self.measure(spec).await;
        let mut status = previous;
        let result = match outcome {
            Ok(m) => {
                m.fill(&mut status);
                status.measured_at = Some(now());
                status.measured_by = self.node.clone();
                status.probe_request = spec.probe_request;
                tracing::info!(
                    link = %name,
                    gbps = m.bandwidth_gbps,
                    p50_us = m.latency_us_p50,
                    p99_us = m.latency_us_p99,
                    "link measured"
                );
                Ok(())
            }
            Err(e) => {
                status.error = e.clone();
                Err(e)
            }
        };
        self.write(name, &status).await?;
        result
    }

    async fn measure(&self, spec: &LinkSpec) -> Result<crate::probe::Measurement, String> {
        let parse = |what: &str, a: &Option<String>| -> Result<IpAddr, String> {
            let text = a.as_deref().unwrap_or_default();
            text.parse()
                .map_err(|_| format!("{what} {text:?} is not an IP address"))
        };
        let local = parse("a.address", &spec.a.address)?;
        let peer = parse("b.address", &spec.b.address)?;
        let port = self.probe_port(&spec.b.node).await?;
        // RDMA first where both ends report it, as a job's transport would choose.
        let cfg = ProbeConfig {
            rdma: spec.rdma,
            ..self.config
        };
        client::measure(local, SocketAddr::new(peer, port), &cfg)
            .await
            .map_err(|e| e.to_string())
    }

    /// The probe port `node`'s nodelet reports.
    async fn probe_port(&self, node: &str) -> Result<u16, String> {
        let mut client = self.controllers.client();
        let reply = client
            .get(GetRequest {
                kind: Kind::Node.as_str().into(),
                namespace: String::new(),
                name: node.into(),
                stale: true,
            })
            .await
            .map_err(|e| format!("reading Node {node}: {e}"))?;
        self.controllers.remember(&client);
        let obj = Object::from_json(&reply.object_json)
            .map_err(|e| format!("reading Node {node}: {e}"))?;
        match NodeStatus::from_value(&obj.status).probe_port {
            0 => Err(format!(
                "the nodelet on {node} reports no probe server (probePort 0)"
            )),
            port => Ok(port),
        }
    }

    /// Writes a Link's status, trying other controllers when one is unavailable.
    async fn write(&self, name: &str, status: &LinkStatus) -> Result<(), String> {
        let request_id = format!("link-probe/{}/{name}/{}", self.node, now());
        let mut client = self.controllers.client_for(WRITE_TIMEOUT);
        let result = client
            .update_status(UpdateStatusRequest {
                kind: Kind::Link.as_str().into(),
                namespace: String::new(),
                name: name.into(),
                status_json: status.to_value().to_string(),
                resource_version: 0,
                request_id,
            })
            .await;
        match result {
            Ok(_) => {
                self.controllers.remember(&client);
                Ok(())
            }
            Err(e) if e.code == tonic::Code::NotFound => Err(format!("link {name} is gone")),
            Err(e) if e.is_unanswered() => Err(format!("status of link {name} not written: {e}")),
            Err(e) => Err(format!("status of link {name} not accepted: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_when_never_measured_or_asked_again() {
        let mut spec = LinkSpec::default();
        let mut status = LinkStatus::default();
        assert!(due(&spec, &status), "never measured");
        status.bandwidth_gbps = Some(10.0);
        status.latency_us_p50 = Some(50.0);
        assert!(!due(&spec, &status));
        spec.probe_request = 1;
        assert!(due(&spec, &status), "tbctl topology probe");
        status.probe_request = 1;
        assert!(!due(&spec, &status));
        status.error = "timed out".into();
        assert!(!due(&spec, &status), "an error alone does not re-probe");
    }

    #[test]
    fn backoff_doubles_up_to_a_limit() {
        assert_eq!(retry_after(1), Duration::from_secs(5));
        assert_eq!(retry_after(2), Duration::from_secs(10));
        assert_eq!(retry_after(4), Duration::from_secs(40));
        assert_eq!(retry_after(7), Duration::from_secs(300));
        assert_eq!(retry_after(u32::MAX), Duration::from_secs(300));
    }
}
