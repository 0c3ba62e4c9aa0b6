//! Network partitions in the emulated lab ([`crate::netns`]): cut and heal the network between
//! its namespaces, silently, as a failed switch port or a pulled cable does — packets vanish,
//! nobody is told (no RST, no ICMP), so TCP finds out only by its own timeouts.
//!
//! How: an nftables table `inet tb_partition` in the *sending* namespace whose `output` chain
//! drops what that namespace's processes send to the cut-off peer. Everything tb runs in a
//! namespace is local to it (the hub only bridges, and bridged frames never reach these
//! hooks), so the output hook sees every packet a namespace sends. One rule per direction:
//!
//! - [`EmulatedLab::cut_one_way`]`(a, b)`: a's packets to b's management address are dropped;
//!   b's packets to a are delivered (and a's answers to them dropped) — an asymmetric partition;
//! - [`EmulatedLab::cut`]`(a, b)`: both directions;
//! - [`EmulatedLab::isolate`]`(a, except)`: a cut both ways from every other endpoint of the
//!   management network except those named (e.g. keep the test's client, in the hub);
//! - [`EmulatedLab::cut_cable`]`(x, y)`: everything sent out of the cable's two ends;
//! - [`EmulatedLab::heal`]: every rule removed (the tables deleted).
//!
//! Endpoints are named as the lab names them: a Mac by its name (`mac1`), a controller of
//! [`EmulatedLab::start_controllers`] as `controller-<id>`, and `hub` (tbctl, the test's
//! client). Every rule counts what it dropped; the lab's failure report lists the tables.
//! The kernel needs nf_tables and the host the `nft` tool ([`unavailable`] says when not).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::netns::{EmulatedLab, HUB_ADDRESS};

/// The nftables table every rule lives in (one per namespace).
const TABLE: &str = "tb_partition";

/// Why partitions cannot be made here: the lab's own reasons, or no `nft`.
pub fn unavailable() -> Option<String> {
    if let Some(why) = EmulatedLab::unavailable() {
        return Some(why);
    }
    match Command::new("nft")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`nft --version` exited {}", o.status)),
        Err(e) => Some(format!("`nft` cannot be run ({e}); install nftables")),
    }
}

/// An endpoint of the management network.
struct Endpoint {
    namespace: String,
    address: String,
}

impl EmulatedLab {
    fn endpoint(&self, who: &str) -> Endpoint {
        if who == "hub" {
            return Endpoint {
                namespace: self.hub().to_string(),
                address: HUB_ADDRESS.to_string(),
            };
        }
        if let Some(c) = self.controllers().iter().find(|c| c.name() == who) {
            return Endpoint {
                namespace: c.namespace.clone(),
                address: c.address.clone(),
            };
        }
        match self.macs().iter().find(|m| m.spec.name == who) {
            Some(m) => Endpoint {
                namespace: m.namespace.clone(),
                address: m.address.clone(),
            },
            None => panic!("no endpoint {who} in the lab (a Mac, controller-<id> or hub)"),
        }
    }

    /// Every endpoint's name: the hub, the controllers, the Macs.
    pub fn endpoints(&self) -> Vec<String> {
        let mut all = vec!["hub".to_string()];
        all.extend(self.controllers().iter().map(|c| c.name()));
        all.extend(self.macs().iter().map(|m| m.spec.name.clone()));
        all
    }

    /// Drops every packet `from` sends to `to`'s management address; `to`'s packets still
    /// reach `from`. See the module documentation.
    pub fn cut_one_way(&mut self, from: &str, to: &str) {
        self.cut_pairs(&[(from.to_string(), to.to_string())]);
    }

    /// Cuts `a` and `b` apart, both ways.
    pub fn cut(&mut self, a: &str, b: &str) {
        let (a, b) = (a.to_string(), b.to_string());
        self.cut_pairs(&[(a.clone(), b.clone()), (b, a)]);
    }

    /// Cuts `who` apart from every other endpoint but those in `except`, both ways.
    pub fn isolate(&mut self, who: &str, except: &[&str]) {
        let mut pairs = Vec::new();
        for other in self.endpoints() {
            if other != who && !except.contains(&other.as_str()) {
                pairs.push((who.to_string(), other.clone()));
                pairs.push((other, who.to_string()));
            }
        }
        self.cut_pairs(&pairs);
    }

    /// Drops what each `(from, to)` sends, installing each namespace's rules at once (so a
    /// partition of many pairs starts within a few tens of milliseconds).
    fn cut_pairs(&mut self, pairs: &[(String, String)]) {
        let mut touched = Vec::new();
        for (from, to) in pairs {
            let (f, t) = (self.endpoint(from), self.endpoint(to));
            self.push_rule(&f.namespace, format!("ip daddr {} counter drop", t.address));
            if !touched.contains(&f.namespace) {
                touched.push(f.namespace);
            }
        }
        for ns in touched {
            self.install(&ns);
        }
        let named: Vec<String> = pairs.iter().map(|(f, t)| format!("{f}→{t}")).collect();
        crate::step!("partition: dropped {}", named.join(", "));
    }

    /// Pulls the cable between Macs `x` and `y`: nothing sent out of either end arrives.
    pub fn cut_cable(&mut self, x: &str, y: &str) {
        let cable = self
            .cable_between(x, y)
            .unwrap_or_else(|| panic!("no cable between {x} and {y}"))
            .clone();
        crate::step!("partition: cable {}–{} cut", cable.a.uuid(), cable.b.uuid());
        for end in [&cable.a, &cable.b] {
            let ns = self.mac(&end.mac).namespace.clone();
            self.push_rule(&ns, format!("oifname \"{}\" counter drop", end.port));
            self.install(&ns);
        }
    }

    /// Removes every cut: the network is whole again.
    pub fn heal(&mut self) {
        let namespaces: Vec<String> = self.partitioned.keys().cloned().collect();
        for ns in namespaces {
            nft(&ns, &format!("delete table inet {TABLE}\n"));
        }
        self.partitioned.clear();
        crate::step!("partition: healed");
    }

    /// The partition tables with their counters, for a failure report.
    pub(crate) fn partition_report(&self) -> String {
        let mut text = String::new();
        for ns in self.partitioned.keys() {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "nft", "list", "table", "inet", TABLE])
                .output();
            text += &format!(
                "$ ip netns exec {ns} nft list table inet {TABLE}\n{}\n",
                out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_else(|e| e.to_string())
            );
        }
        text
    }

    /// Adds `rule` to namespace `ns`'s output chain (installed by [`EmulatedLab::install`]).
    fn push_rule(&mut self, ns: &str, rule: String) {
        let rules = self.partitioned.entry(ns.to_string()).or_default();
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }

    /// Writes namespace `ns`'s table with all its rules, in one transaction.
    fn install(&mut self, ns: &str) {
        let rules = self.partitioned.entry(ns.to_string()).or_default();
        // `add` then `delete` makes the delete succeed whether the table existed or not.
        let script = format!(
            "add table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n{}\n  }}\n}}\n",
            rules
                .iter()
                .map(|r| format!("    {r}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        nft(ns, &script);
    }
}

/// Runs an nft script in namespace `ns`, panicking with what nft said unless it succeeds.
fn nft(ns: &str, script: &str) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("`ip netns exec {ns} nft` cannot be run: {e}"));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .unwrap_or_else(|e| panic!("writing to nft: {e}"));
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for nft: {e}"));
    assert!(
        out.status.success(),
        "nft in {ns} failed ({}): {}\nscript:\n{script}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
