//! Node: one per Mac. Its nodelet writes the status (capacity, ports, links); users set the
//! spec to cordon a Mac or keep work off it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{self, CheckResult};
use crate::validate::ValidationError;

/// One Mac, registered by its nodelet, which reports capacity and links in status. Cluster-scoped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct NodeSpec {
    /// Cordoned: running work stays, nothing new is placed (tbctl cordon).
    #[serde(default)]
    pub unschedulable: bool,
    /// Where the nodelet can be reached: host or host:port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Marks (key=value:Effect) that keep work off this Mac.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

impl NodeSpec {
    pub(crate) fn check(&self) -> CheckResult {
        common::not_blank("address", self.address.as_deref())?;
        if let Some(addr) = &self.address
            && addr.chars().any(char::is_whitespace)
        {
            return Err(ValidationError::new(
                "address",
                format!("{addr:?} is not an address; expected host or host:port"),
            ));
        }
        for (i, taint) in self.taints.iter().enumerate() {
            if taint.trim().is_empty() || taint.chars().any(char::is_whitespace) {
                return Err(ValidationError::new(
                    format!("taints[{i}]"),
                    format!("{taint:?} is not a taint; expected key=value:Effect without spaces"),
                ));
            }
        }
        Ok(())
    }
}
