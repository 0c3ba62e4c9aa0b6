//! `tbctl drain NODE`: cordon the Node, taint it `tb/drain=true:NoExecute` so that tb moves its
//! work elsewhere, and wait until nothing runs there.
//!
//! "Nothing runs" means no Allocation labelled `tb/node=NODE` is both meant to run
//! (`spec.desired: run`) and not yet ended (phase Pending or Running). The wait watches
//! Allocations (see `observe`), bounded by `--timeout` (default 5m). Output: `node/NAME
//! cordoned`, then `node/NAME drained`; on timeout, an error naming what still runs, exit 1.

use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use tb_api::specs::{AllocationStatus, allocation::LABEL_NODE};
use tb_api::{Kind, Object};
use tokio::time::Instant;

use super::cordon::{Mark, set_mark};
use super::observe::{Scope, observe};
use super::{Ctx, Reported, display_name};
use crate::client::fmt_duration;
use crate::columns::{at, cell};
use crate::output::{Table, emit};

/// How long `drain` waits when `--timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// An allocation that keeps a Node from being drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// `namespace/name`.
    pub allocation: String,
    /// `trainingjob/x`.
    pub job: String,
    pub rank: String,
    pub phase: String,
}

/// The allocations still meant to run and not yet ended, in the order given.
pub fn still_running<'a>(allocations: impl IntoIterator<Item = &'a Object>) -> Vec<Running> {
    allocations
        .into_iter()
        .filter(|a| {
            // A missing `desired` means run (its default).
            let desired = at(&a.spec, &["desired"])
                .and_then(Value::as_str)
                .unwrap_or("run");
            desired == "run" && !AllocationStatus::from_value(&a.status).phase.is_terminal()
        })
        .map(|a| {
            let job_kind = at(&a.spec, &["job", "kind"])
                .and_then(Value::as_str)
                .unwrap_or("");
            let job_name = at(&a.spec, &["job", "name"])
                .and_then(Value::as_str)
                .unwrap_or("");
            Running {
                allocation: format!("{}/{}", a.metadata.namespace, a.metadata.name),
                job: if job_name.is_empty() {
                    "<none>".into()
                } else {
                    display_name(job_kind, job_name)
                },
                rank: cell(at(&a.spec, &["rank"])),
                phase: at(&a.status, &["phase"])
                    .and_then(Value::as_str)
                    .unwrap_or("Pending")
                    .to_string(),
            }
        })
        .collect()
}

/// The table printed when the drain times out, indented under the error line.
pub fn running_table(running: &[Running]) -> String {
    let mut t = Table::new(["ALLOCATION", "JOB", "RANK", "PHASE"]);
    for r in running {
        t.push(vec![
            r.allocation.clone(),
            r.job.clone(),
            r.rank.clone(),
            r.phase.clone(),
        ]);
    }
    t.render().lines().map(|l| format!("  {l}\n")).collect()
}

pub async fn run(ctx: &mut Ctx, node: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    set_mark(ctx, node, Mark::Drain).await?;
    emit(&format!("node/{node} {}\n", Mark::Drain.past_tense()))?;
    let scope = Scope {
        kind: Kind::Allocation,
        namespace: String::new(),
        selector: format!("{LABEL_NODE}={node}"),
    };
    let mut last = Vec::new();
    let drained = observe(ctx, &scope, Some(deadline), |view| {
        last = still_running(view.objects.values());
        Ok(last.is_empty().then_some(()))
    })
    .await?;
    if drained.is_some() {
        return emit(&format!("node/{node} drained\n"));
    }
    eprintln!(
        "error: timed out after {} waiting for node/{node} to drain; still running:\n{}",
        fmt_duration(timeout),
        running_table(&last)
    );
    Err(Reported(1).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn alloc(name: &str, rank: u32, desired: Option<&str>, phase: Option<&str>) -> Object {
        let mut spec = json!({"job": {"kind": "TrainingJob", "name": "ft"}, "node": "mac1", "rank": rank,
                              "worldSize": 2, "epoch": 1, "executor": "exec", "command": ["true"]});
        if let Some(d) = desired {
            spec["desired"] = json!(d);
        }
        let status = phase.map_or(Value::Null, |p| json!({"phase": p}));
        serde_json::from_value(json!({
            "apiVersion": "tb/v1", "kind": "Allocation",
            "metadata": {"name": name, "namespace": "default", "labels": {"tb/node": "mac1"}},
            "spec": spec, "status": status
        }))
        .expect("allocation")
    }

    #[test]
    fn only_live_allocations_meant_to_run_block() {
        let allocs = [
            alloc("ft-e1-r0", 0, Some("run"), Some("Running")),
            alloc("ft-e1-r1", 1, None, None),
            alloc("ft-e0-r0", 0, Some("stop"), Some("Running")),
            alloc("old-r0", 0, Some("run"), Some("Succeeded")),
            alloc("lost-r0", 0, Some("run"), Some("Lost")),
            alloc("failed-r0", 0, Some("run"), Some("Failed")),
        ];
        let running = still_running(&allocs);
        assert_eq!(
            running,
            [
                Running {
                    allocation: "default/ft-e1-r0".into(),
                    job: "trainingjob/ft".into(),
                    rank: "0".into(),
                    phase: "Running".into(),
                },
                Running {
                    allocation: "default/ft-e1-r1".into(),
                    job: "trainingjob/ft".into(),
                    rank: "1".into(),
                    phase: "Pending".into(),
                },
            ]
        );
        assert!(still_running(&allocs[2..]).is_empty());
    }

    #[test]
    fn timeout_table_is_indented() {
        let text = running_table(&still_running(&[alloc(
            "ft-e1-r0",
            0,
            Some("run"),
            Some("Running"),
        )]));
        assert_eq!(
            text,
            "  ALLOCATION         JOB              RANK   PHASE\n  default/ft-e1-r0   trainingjob/ft   0      Running\n"
        );
    }
}
