//! The TCP ports `tbctl up` gives its processes on 127.0.0.1, so that two local clusters on one
//! machine need not collide.
//!
//! Without `--port-range`, the plan is the historical one: the controller on `--port` (7400)
//! and its services listener (the InferenceServices' stable address) on the next port, each
//! nodelet's endpoint on a port the OS picks, and node-i's rank ports (which the scheduler also
//! hands to the services' OpenAI endpoints) at 32323+100·(i-1) ..= +99.
//!
//! With `--port-range START-END` every port comes from the range: the controller takes START
//! (its gRPC API and Raft share it), its services listener END, node-i's endpoint START+i, and
//! the rest is split evenly among the nodelets for their ranks and endpoints (at most
//! [`RANK_PORTS`] each). The link
//! probes listen on ports the OS picks on the lab's own loopback addresses, so they never
//! collide either.

use std::fmt;

use anyhow::{Result, bail};

/// The first port of node-1's rank range by default (MLX's default starting port).
pub const FIRST_RANK_PORT: u16 = 32323;
/// Rank ports per nodelet: the default, and the most a `--port-range` gives one.
pub const RANK_PORTS: u16 = 100;
/// The fewest rank ports a nodelet may get from a `--port-range`.
pub const MIN_RANK_PORTS: u16 = 8;

/// An inclusive range of ports, `START-END`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub start: u16,
    pub end: u16,
}

impl PortRange {
    pub fn len(self) -> u32 {
        u32::from(self.end) - u32::from(self.start) + 1
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// `START-END` with 1 <= START <= END <= 65535, for clap.
pub fn parse_port_range(s: &str) -> Result<PortRange, String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected START-END, e.g. 41000-41999"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))
    };
    let (start, end) = (port(a)?, port(b)?);
    if end < start {
        return Err(format!("{s:?}: END is below START"));
    }
    Ok(PortRange { start, end })
}

/// One nodelet's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeletPorts {
    /// Its endpoint (logs, staging, exec); None: one the OS picks at start.
    pub listen: Option<u16>,
    /// Ports for its ranks and the services' endpoints (`tb-nodelet --port-range`).
    pub ranks: PortRange,
}

/// Every port of a local cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortPlan {
    pub controller: u16,
    /// The controller's services listener (`tb-controller --services-listen`).
    pub services: u16,
    /// node-1 first.
    pub nodelets: Vec<NodeletPorts>,
}

impl PortPlan {
    /// The default plan: the controller on `controller_port`, fixed rank ranges from 32323.
    pub fn default_for(controller_port: u16, nodelets: u32) -> Result<PortPlan> {
        let nodelets = (1..=nodelets)
            .map(|i| {
                let start = u32::from(FIRST_RANK_PORT) + u32::from(RANK_PORTS) * (i - 1);
                let end = start + u32::from(RANK_PORTS) - 1;
                match (u16::try_from(start), u16::try_from(end)) {
                    (Ok(start), Ok(end)) => Ok(NodeletPorts {
                        listen: None,
                        ranks: PortRange { start, end },
                    }),
                    _ => bail!("too many nodelets: node-{i}'s ports would pass 65535"),
                }
            })
            .collect::<Result<_>>()?;
        let Some(services) = controller_port.checked_add(1) else {
            bail!("--port {controller_port}: the services listener needs the port after it");
        };
        Ok(PortPlan {
            controller: controller_port,
            services,
            nodelets,
        })
    }

    /// Every port from `range`: the controller, the nodelets' endpoints, then equal rank blocks.
    pub fn within(range: PortRange, nodelets: u32) -> Result<PortPlan> {
        let n = nodelets.max(1);
        let fixed = 2 + n;
        let need = fixed + n * u32::from(MIN_RANK_PORTS);
        if range.len() < need {
            bail!(
                "--port-range {range} has {} ports; {nodelets} nodelets need at least {need} \
                 (2 for the controller, 1 per nodelet, {MIN_RANK_PORTS} per nodelet for ranks \
                 and endpoints)",
                range.len()
            );
        }
        let per = ((range.len() - fixed) / n).min(u32::from(RANK_PORTS));
        let start = u32::from(range.start);
        // The controller's two and the nodelets' endpoints come first, but the services
        // listener takes END.
        let first_rank = start + fixed - 1;
        let nodelets = (0..n)
            .map(|i| {
                let lo = first_rank + i * per;
                // In range by the checks above: every value is at most range.end.
                NodeletPorts {
                    listen: u16::try_from(start + 1 + i).ok(),
                    ranks: PortRange {
                        start: u16::try_from(lo).unwrap_or(u16::MAX),
                        end: u16::try_from(lo + per - 1).unwrap_or(u16::MAX),
                    },
                }
            })
            .collect();
        Ok(PortPlan {
            controller: range.start,
            services: range.end,
            nodelets,
        })
    }

    /// The ports the plan fixes for listening sockets (the controller's and the nodelets'
    /// endpoints), to check they are free before anything starts.
    pub fn listen_ports(&self) -> Vec<u16> {
        [self.controller, self.services]
            .into_iter()
            .chain(self.nodelets.iter().filter_map(|n| n.listen))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_port(plan: &PortPlan) -> Vec<u16> {
        let mut ports = plan.listen_ports();
        for n in &plan.nodelets {
            ports.extend(n.ranks.start..=n.ranks.end);
        }
        ports
    }

    #[test]
    fn the_default_plan_is_the_historical_one() {
        let plan = PortPlan::default_for(7400, 2).expect("plan");
        assert_eq!(plan.controller, 7400);
        assert_eq!(plan.services, 7401);
        assert_eq!(plan.nodelets[0].ranks.to_string(), "32323-32422");
        assert_eq!(plan.nodelets[1].ranks.to_string(), "32423-32522");
        assert_eq!(plan.nodelets[1].listen, None);
        let plan = PortPlan::default_for(7400, 64).expect("64");
        assert_eq!(plan.nodelets[63].ranks.to_string(), "38623-38722");
        assert!(PortPlan::default_for(7400, 400).is_err());
    }

    #[test]
    fn a_range_holds_every_port_once() {
        let range = parse_port_range("41000-41999").expect("range");
        let plan = PortPlan::within(range, 3).expect("plan");
        assert_eq!(plan.controller, 41000);
        assert_eq!(plan.listen_ports(), [41000, 41999, 41001, 41002, 41003]);
        assert_eq!(plan.nodelets[0].ranks.to_string(), "41004-41103");
        assert_eq!(plan.nodelets[2].ranks.to_string(), "41204-41303");
        let mut ports = every_port(&plan);
        assert!(ports.iter().all(|p| (41000..=41999).contains(p)));
        let n = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), n, "a port given twice");
    }

    #[test]
    fn two_clusters_in_disjoint_ranges_share_no_port() {
        let a = PortPlan::within(parse_port_range("41000-41099").expect("a"), 4).expect("a");
        let b = PortPlan::within(parse_port_range("41100-41199").expect("b"), 4).expect("b");
        let pa = every_port(&a);
        assert!(every_port(&b).iter().all(|p| !pa.contains(p)));
        // A small range gives each nodelet fewer rank ports, all inside it.
        assert!(a.nodelets.iter().all(|n| n.ranks.len() == 23), "{a:?}");
        assert!(pa.iter().all(|p| (41000..=41099).contains(p)));
        // And the default plan is clear of both.
        let d = every_port(&PortPlan::default_for(7400, 4).expect("default"));
        assert!(d.iter().all(|p| !pa.contains(p)));
    }

    #[test]
    fn small_or_malformed_ranges_are_refused() {
        let e = PortPlan::within(parse_port_range("41000-41010").expect("range"), 2)
            .expect_err("too small")
            .to_string();
        assert!(
            e.contains("has 11 ports") && e.contains("at least 20"),
            "{e}"
        );
        for bad in ["41000", "0-10", "10-5", "1-70000", "a-b"] {
            assert!(parse_port_range(bad).is_err(), "{bad}");
        }
        let top = PortPlan::within(parse_port_range("65500-65535").expect("top"), 2).expect("top");
        assert!(every_port(&top).iter().all(|p| *p >= 65500));
    }
}
