//! Link: one cable (or a bundle of cables) between two Macs, found by joining the ports the
//! nodelets report. The controller writes the spec; the nodelet at end `a` probes the link and
//! writes what it measured into the status. Cluster-scoped, like the Nodes it joins.

use crate::timestamp::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{self, CheckResult};
use crate::validate::ValidationError;

/// One end of a link: a port of a Mac.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct LinkEnd {
    /// The Mac at this end.
    pub node: String,
    /// The port's name on that Mac (tb3, or the name a topology file gives it).
    pub port: String,
    /// The port's network interface (en3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The IPv4 address on that interface, where probes and data go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The RDMA device on the port (rdma_en3) when RDMA is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
}

/// A cable between two Macs, joined from the ports their nodelets report; the status holds measured
/// bandwidth and latency. Cluster-scoped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct LinkSpec {
    // `a` is the end whose node name sorts first.
    /// The end whose nodelet probes the link.
    pub a: LinkEnd,
    /// The other end.
    pub b: LinkEnd,
    /// The speed the ports negotiated, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominal_gbps: Option<f64>,
    /// RDMA devices on both ends.
    #[serde(default)]
    pub rdma: bool,
    // The nodelet probes again when its last measurement answered a lower number.
    /// Raised by tbctl topology probe to have the link measured again.
    #[serde(default)]
    pub probe_request: u64,
}

impl LinkSpec {
    pub(crate) fn check(&self) -> CheckResult {
        self.a.check().map_err(|e| e.under("a"))?;
        self.b.check().map_err(|e| e.under("b"))?;
        if self.a.node == self.b.node {
            return Err(ValidationError::new(
                "b.node",
                format!(
                    "a link joins two different Macs; both ends are on {:?}",
                    self.a.node
                ),
            ));
        }
        if let Some(gbps) = self.nominal_gbps
            && !(gbps.is_finite() && gbps > 0.0)
        {
            return Err(ValidationError::new(
                "nominalGbps",
                format!("must be a positive number of Gb/s, got {gbps}"),
            ));
        }
        Ok(())
    }

    /// The end on `node`, and the other end.
    pub fn ends_from(&self, node: &str) -> Option<(&LinkEnd, &LinkEnd)> {
        if self.a.node == node {
            Some((&self.a, &self.b))
        } else if self.b.node == node {
            Some((&self.b, &self.a))
        } else {
            None
        }
    }
}

impl LinkEnd {
    fn check(&self) -> CheckResult {
        common::object_name("node", &self.node)?;
        if self.port.trim().is_empty() {
            return Err(ValidationError::new("port", "must name the port"));
        }
        common::not_blank("interface", self.interface.as_deref())?;
        common::not_blank("address", self.address.as_deref())?;
        common::not_blank("rdmaDevice", self.rdma_device.as_deref())
    }
}

/// What the probing nodelet measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkStatus {
    /// Bulk-transfer throughput, Gb/s, over all streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbps: Option<f64>,
    /// Round-trip time of a small message, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_p99: Option<f64>,
    #[serde(default)]
    pub round_trips: u32,
    #[serde(default)]
    pub streams: u32,
    /// The transport the probe used (`tcp`, `rdma`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transport: String,
    /// When the figures were measured (RFC 3339).
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub measured_at: Option<Timestamp>,
    /// The node that measured them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub measured_by: String,
    /// The `spec.probeRequest` this measurement answers.
    #[serde(default)]
    pub probe_request: u64,
    /// Why the last probe failed, if it did (the figures above are then from an earlier one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl LinkStatus {
    pub fn from_value(v: &serde_json::Value) -> LinkStatus {
        Self::deserialize(v).unwrap_or_default()
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn measured(&self) -> bool {
        self.bandwidth_gbps.is_some() && self.latency_us_p50.is_some()
    }
}

/// The Link object name for two ends: `<nodeA>.<portA>.<nodeB>.<portB>`, ends sorted, port
/// names lower-cased with anything outside `[a-z0-9-]` turned into `-`.
pub fn link_name(a_node: &str, a_port: &str, b_node: &str, b_port: &str) -> String {
    let (first, second) = if (a_node, a_port) <= (b_node, b_port) {
        ((a_node, a_port), (b_node, b_port))
    } else {
        ((b_node, b_port), (a_node, a_port))
    };
    format!(
        "{}.{}.{}.{}",
        first.0,
        port_token(first.1),
        second.0,
        port_token(second.1)
    )
}

fn port_token(port: &str) -> String {
    let token: String = port
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let token = token.trim_matches('-');
    if token.is_empty() {
        "port".into()
    } else {
        token.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::validate_name;

    #[test]
    fn names_are_stable_and_valid() {
        let n = link_name("mac2", "Thunderbolt 3", "mac1", "en5");
        assert_eq!(n, "mac1.en5.mac2.thunderbolt-3");
        assert_eq!(n, link_name("mac1", "en5", "mac2", "Thunderbolt 3"));
        assert!(validate_name(&n).is_ok());
    }

    #[test]
    fn a_link_to_itself_is_refused() {
        let end = |node: &str| LinkEnd {
            node: node.into(),
            port: "tb1".into(),
            ..Default::default()
        };
        let spec = LinkSpec {
            a: end("mac1"),
            b: end("mac1"),
            ..Default::default()
        };
        let err = spec.check().unwrap_err();
        assert_eq!(err.path, "b.node");
        let spec = LinkSpec {
            a: end("mac1"),
            b: end("mac2"),
            nominal_gbps: Some(-1.0),
            ..Default::default()
        };
        assert_eq!(spec.check().unwrap_err().path, "nominalGbps");
    }
}
