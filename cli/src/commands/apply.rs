//! `tbctl apply`: load and validate every object locally, then send them in one all-or-none
//! Apply request and print each object's outcome. With `--wait`, then wait until the jobs
//! applied are up (InferenceServices Ready, TrainingJobs running or finished), drawing model
//! staging as a progress bar on stderr. Each wait first says on stderr what it waits for (the
//! object and the condition); when the deadline passes, the error shows the object's phase,
//! conditions and last events, which say why it is not up (exit 1).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::Value;
use tb_api::proto::{ApplyRequest, GetRequest, ListRequest};
use tb_api::{Kind, Object};

use super::{Ctx, display_name, parse_object, request_id};
use crate::args::{ApplyArgs, DryRun};
use crate::manifests;
use crate::output::emit;

/// How long `--wait` waits when `--timeout` does not say.
const WAIT: Duration = Duration::from_secs(600);
/// How many of the object's events a timed-out wait shows.
const LAST_EVENTS: usize = 5;

pub async fn run(ctx: &mut Ctx, args: &ApplyArgs, timeout: Option<Duration>) -> Result<()> {
    // Nothing is sent unless every object in every file is valid.
    let objects = manifests::load_valid(&args.files, &ctx.target)?;
    if args.dry_run == DryRun::Client {
        let out: String = objects
            .iter()
            .map(|l| format!("{} validated (client dry run)\n", l.object.display_name()))
            .collect();
        return emit(&out);
    }
    let dry_run = args.dry_run == DryRun::Server;
    let req = ApplyRequest {
        objects_json: objects.iter().map(|l| l.object.to_json()).collect(),
        dry_run,
        // One id for the whole apply, reused by every retry and failover.
        request_id: request_id(),
    };
    let resp = ctx.client().apply(req).await?;
    let suffix = if dry_run { " (server dry run)" } else { "" };
    let out: String = resp
        .results
        .iter()
        .map(|r| format!("{} {}{suffix}\n", display_name(&r.kind, &r.name), r.outcome))
        .collect();
    emit(&out)?;
    if !dry_run {
        warn_quotas_below_usage(ctx, &resp.results).await;
    }
    if args.wait {
        let limit = timeout.unwrap_or(WAIT);
        let deadline = tokio::time::Instant::now() + limit;
        if !objects.iter().any(|l| waits_for(l.object.kind()).is_some()) {
            eprintln!(
                "--wait: nothing to wait for (it waits for InferenceServices to be Ready and \
                 TrainingJobs to run; the rest is in place once applied)"
            );
        }
        for l in &objects {
            let o = &l.object;
            if let Some(kind @ (Kind::InferenceService | Kind::TrainingJob)) = o.kind() {
                let ns = ctx.namespace_for(kind);
                let ns = if o.metadata.namespace.is_empty() {
                    ns
                } else {
                    o.metadata.namespace.clone()
                };
                wait_up(ctx, kind, &ns, &o.metadata.name, deadline, limit).await?;
            }
        }
    }
    Ok(())
}

/// A Queue whose new quota is below what its running work holds is stored as written (nothing
/// running is stopped); say so, as the scheduler's QuotaBelowUsage event will. Best effort: a
/// caller who may not list jobs simply gets no warning here.
async fn warn_quotas_below_usage(ctx: &mut Ctx, results: &[tb_api::proto::ApplyResult]) {
    let queues: Vec<&str> = results
        .iter()
        .filter(|r| r.kind == Kind::Queue.as_str() && r.outcome != "unchanged")
        .map(|r| r.name.as_str())
        .collect();
    if queues.is_empty() {
        return;
    }
    let snap = match super::usage::Snapshot::fetch(ctx).await {
        Ok(snap) => snap,
        Err(e) => {
            tracing::debug!("no quota check after apply: {e:#}");
            return;
        }
    };
    let held = snap.queues();
    for name in queues {
        if let Some(warning) = tb_core::scheduler::queue_status::below_usage(&held, name) {
            eprintln!("Warning: {warning}");
        }
    }
}

/// What `--wait` waits for on an object of this kind, in words; None: it does not wait.
fn waits_for(kind: Option<Kind>) -> Option<&'static str> {
    match kind? {
        Kind::InferenceService => Some("to be Ready (condition Ready=True)"),
        Kind::TrainingJob => Some("to run (phase Running, or Succeeded)"),
        _ => None,
    }
}

/// Why the object is not up yet, from its status and events: the phase with its reason and
/// message, each condition, and the last events (oldest first).
pub fn not_up_report(object: &Value, events: &Result<Vec<Object>, String>) -> String {
    let status = &object["status"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let mut out = String::new();
    let phase = text(&status["phase"]);
    let mut line = format!(
        "  phase: {}",
        if phase.is_empty() {
            "<none yet>"
        } else {
            &phase
        }
    );
    for key in ["reason", "message"] {
        let v = text(&status[key]);
        if !v.is_empty() {
            line.push_str(&format!(" — {v}"));
        }
    }
    out.push_str(&line);
    out.push('\n');
    match status["conditions"].as_array().filter(|c| !c.is_empty()) {
        None => out.push_str("  conditions: <none>\n"),
        Some(cs) => {
            out.push_str("  conditions:\n");
            for c in cs {
                let mut line = format!("    {}={}", text(&c["type"]), text(&c["status"]));
                let (reason, message) = (text(&c["reason"]), text(&c["message"]));
                if !reason.is_empty() {
                    line.push_str(&format!(" {reason}"));
                }
                if !message.is_empty() {
                    line.push_str(&format!(": {message}"));
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    match events {
        Err(e) => out.push_str(&format!("  events: <unavailable: {e}>\n")),
        Ok(list) if list.is_empty() => out.push_str("  events: <none>\n"),
        Ok(list) => {
            let now = chrono::Utc::now();
            let skip = list.len().saturating_sub(LAST_EVENTS);
            out.push_str("  last events (oldest first):\n");
            for e in &list[skip..] {
                out.push_str(&format!(
                    "    {} ago {} {}: {}\n",
                    super::describe::event_age(e, now),
                    text(&e.spec["type"]),
                    text(&e.spec["reason"]),
                    text(&e.spec["message"])
                ));
            }
        }
    }
    out
}

/// Whether a job is up: `Ok(true)` up, `Ok(false)` not yet, `Err` failed.
fn up(kind: Kind, status: &Value) -> Result<bool> {
    let phase = status["phase"].as_str().unwrap_or("");
    if phase == "Failed" {
        bail!(
            "{}: {}",
            status["reason"].as_str().unwrap_or("Failed"),
            status["message"].as_str().unwrap_or("")
        );
    }
    Ok(match kind {
        Kind::InferenceService => status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        }),
        _ => matches!(phase, "Running" | "Succeeded"),
    })
}

/// `[#######.............]  35% staging 12.3/35.1 MiB`
pub fn bar(have: u64, need: u64) -> String {
    let pct = (have * 100).checked_div(need).unwrap_or(100).min(100);
    let filled = (pct / 5) as usize;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    format!(
        "[{}{}] {pct:>3}% staging {:.1}/{:.1} MiB",
        "#".repeat(filled),
        ".".repeat(20 - filled),
        mib(have),
        mib(need)
    )
}

async fn wait_up(
    ctx: &mut Ctx,
    kind: Kind,
    namespace: &str,
    name: &str,
    deadline: tokio::time::Instant,
    limit: Duration,
) -> Result<()> {
    let shown = display_name(kind.as_str(), name);
    let tty = std::io::stderr().is_terminal();
    eprintln!(
        "waiting for {shown} {} (--timeout {})",
        waits_for(Some(kind)).unwrap_or("to be up"),
        tb_client::fmt_duration(limit)
    );
    let mut last_line = String::new();
    loop {
        let job = ctx
            .client()
            .get(GetRequest {
                kind: kind.as_str().into(),
                namespace: namespace.into(),
                name: name.into(),
                stale: false,
            })
            .await?;
        let job: Value = serde_json::from_str(&job.object_json)?;
        if up(kind, &job["status"]).map_err(|e| anyhow::anyhow!("{shown} failed: {e}"))? {
            if tty && !last_line.is_empty() {
                eprintln!();
            }
            return emit(&format!("{shown} is up\n"));
        }
        // Model staging of the current ranks, summed.
        let allocs = ctx
            .client()
            .list(ListRequest {
                kind: Kind::Allocation.as_str().into(),
                namespace: namespace.into(),
                label_selector: format!("{}={name}", tb_api::specs::allocation::LABEL_JOB),
                stale: true,
            })
            .await?;
        let epoch = job["status"]["epoch"].as_u64().unwrap_or(0);
        let (mut have, mut need) = (0u64, 0u64);
        for a in &allocs.objects_json {
            let a: Value = serde_json::from_str(a)?;
            if a["spec"]["epoch"].as_u64() == Some(epoch)
                && a["spec"]["job"]["kind"] == kind.as_str()
            {
                have += a["status"]["stagedBytes"].as_u64().unwrap_or(0);
                need += a["status"]["stageBytes"].as_u64().unwrap_or(0);
            }
        }
        if need > 0 {
            let line = bar(have, need);
            if line != last_line {
                if tty {
                    eprint!("\r{shown} {line}");
                } else {
                    eprintln!("{shown} {line}");
                }
                last_line = line;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            if tty && !last_line.is_empty() {
                eprintln!();
            }
            let events = match parse_object(&job.to_string()) {
                Ok(o) => super::describe::events_of(ctx, kind, &o, false).await,
                Err(e) => Err(format!("{e:#}")),
            };
            // Where it stands goes first, the error (one line) last, where the eye lands.
            eprint!(
                "{shown} after {}:\n{}  (`tbctl describe {} {name}` shows all of it)\n",
                tb_client::fmt_duration(limit),
                not_up_report(&job, &events),
                kind.as_str().to_ascii_lowercase(),
            );
            bail!(
                "timed out after {} waiting for {shown} {}",
                tb_client::fmt_duration(limit),
                waits_for(Some(kind)).unwrap_or("to be up"),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bar_fills_with_the_bytes() {
        assert_eq!(
            bar(0, 100),
            format!("[{}]   0% staging 0.0/0.0 MiB", ".".repeat(20))
        );
        assert!(bar(50 << 20, 100 << 20).starts_with("[##########..........]  50%"));
        assert!(bar(7, 0).contains("100%"));
    }

    #[test]
    fn services_are_up_when_ready_and_jobs_when_running() {
        let ready =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        assert!(up(Kind::InferenceService, &ready).unwrap());
        assert!(!up(Kind::InferenceService, &json!({"phase": "Running"})).unwrap());
        assert!(up(Kind::TrainingJob, &json!({"phase": "Succeeded"})).unwrap());
        let e = up(
            Kind::TrainingJob,
            &json!({"phase": "Failed", "reason": "BackoffLimitExceeded", "message": "rank 1"}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("BackoffLimitExceeded") && e.contains("rank 1"),
            "{e}"
        );
    }
}
