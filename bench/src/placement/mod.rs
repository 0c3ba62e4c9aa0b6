//! `placement-bench`: tb's placement (`tb_core::placement::plan`) beside exo's algorithm
//! and a brute-force optimum, on a constant suite of Mac clusters, all priced by the one cost
//! function, `tb_core::placement::evaluate` (which counts the KV cache, the hops and the
//! return hop); and how long `plan` takes at 4 to 64 Macs.
//!
//! - [`suite`]: the clusters and workloads (chips, cables, models).
//! - [`exo`]: exo's placement, re-implemented from its source.
//! - [`brute`]: the optimum by enumeration of orders and an exact DP over layer splits.
//! - [`compare`]: runs the three on one case and prices them.
//! - [`timing`]: `plan`'s solve time on random seeded clusters.
//! - [`report`]: tables, summary, JSON.

pub mod brute;
pub mod compare;
pub mod exo;
pub mod report;
pub mod suite;
pub mod timing;

#[cfg(test)]
mod tests;
