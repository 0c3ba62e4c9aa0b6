//! `tbctl wait KIND/NAME --for=...`: block until an object has a condition (`condition=Ready`,
//! `condition=Complete=True`), reaches a phase (`phase=Running`), or is deleted (`delete`).
//!
//! It watches rather than polls (see `observe`), so it resumes across controller failover and
//! re-lists when its watch is too old. Outcomes, on stdout and through the exit code:
//! - met: `kind/name condition met`, exit 0;
//! - the deadline (`--timeout`, default 60s) passes: `error: timed out waiting for the condition
//!   on kind/name`, exit 1;
//! - a job that fails while waited on (phase Failed, or condition Failed=True), unless the wait
//!   is for that failure: `error: kind/name failed: <reason>: <message>`, exit 1 at once;
//! - the object does not exist (for a condition or phase), or is deleted meanwhile: exit 1.

use std::fmt;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use serde_json::Value;
use tb_api::{Kind, Object};
use tokio::time::Instant;

use super::observe::{Scope, observe};
use super::{Ctx, display_name, parse_object_ref};
use crate::args::WaitArgs;
use crate::columns::at;
use crate::output::emit;

/// How long `wait` waits when `--timeout` is not given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

const EXPECTED: &str = "expected condition=TYPE[=STATUS], phase=PHASE or delete";

/// What `--for` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitFor {
    /// A condition with this status (`True`, `False` or `Unknown`).
    Condition { type_: String, status: String },
    /// `status.phase`, compared without regard to case.
    Phase(String),
    /// The object no longer exists.
    Delete,
}

impl fmt::Display for WaitFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitFor::Condition { type_, status } => write!(f, "condition={type_}={status}"),
            WaitFor::Phase(p) => write!(f, "phase={p}"),
            WaitFor::Delete => f.write_str("delete"),
        }
    }
}

impl WaitFor {
    /// Whether the wait is for a failure itself, so that failing is success.
    fn awaits_failure(&self) -> bool {
        match self {
            WaitFor::Condition { type_, status } => {
                type_.eq_ignore_ascii_case("Failed") && status == "True"
            }
            WaitFor::Phase(p) => p.eq_ignore_ascii_case("Failed"),
            WaitFor::Delete => true,
        }
    }
}

/// Parse `--for`: `condition=TYPE`, `condition=TYPE=STATUS`, `phase=PHASE` or `delete`.
pub fn parse_wait_for(s: &str) -> Result<WaitFor, String> {
    let bad = |why: &str| format!("{s:?}: {why}; {EXPECTED}");
    if s.eq_ignore_ascii_case("delete") {
        return Ok(WaitFor::Delete);
    }
    let Some((what, rest)) = s.split_once('=') else {
        return Err(bad("unknown condition"));
    };
    let word = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    match what.to_ascii_lowercase().as_str() {
        "condition" => {
            let (type_, status) = match rest.split_once('=') {
                None => (rest, "True"),
                Some((t, v)) => {
                    let status = match v.to_ascii_lowercase().as_str() {
                        "true" => "True",
                        "false" => "False",
                        "unknown" => "Unknown",
                        _ => {
                            return Err(bad(&format!(
                                "condition status {v:?} is not True, False or Unknown"
                            )));
                        }
                    };
                    (t, status)
                }
            };
            if !word(type_) {
                return Err(bad("the condition type is missing or malformed"));
            }
            Ok(WaitFor::Condition {
                type_: type_.to_string(),
                status: status.to_string(),
            })
        }
        "phase" if word(rest) => Ok(WaitFor::Phase(rest.to_string())),
        "phase" => Err(bad("the phase is missing or malformed")),
        "jsonpath" => Err(bad("jsonpath is not supported")),
        _ => Err(bad(&format!("unknown kind of condition {what:?}"))),
    }
}

/// Where an object stands with respect to a wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Met,
    /// The job failed: `<reason>: <message>`.
    Failed(String),
    /// The object does not exist (and the wait is not for its deletion).
    Absent,
    Waiting,
}

pub fn judge(object: Option<&Object>, want: &WaitFor) -> Verdict {
    let Some(o) = object else {
        return if *want == WaitFor::Delete {
            Verdict::Met
        } else {
            Verdict::Absent
        };
    };
    let met = match want {
        WaitFor::Delete => false,
        WaitFor::Condition { type_, status } => condition(o, type_)
            .is_some_and(|c| at(c, &["status"]).and_then(Value::as_str) == Some(status.as_str())),
        WaitFor::Phase(p) => phase(o).is_some_and(|have| have.eq_ignore_ascii_case(p)),
    };
    if met {
        return Verdict::Met;
    }
    let is_job = matches!(o.kind(), Some(Kind::TrainingJob | Kind::InferenceService));
    if is_job
        && !want.awaits_failure()
        && let Some(why) = failure(o)
    {
        return Verdict::Failed(why);
    }
    Verdict::Waiting
}

fn phase(o: &Object) -> Option<&str> {
    at(&o.status, &["phase"]).and_then(Value::as_str)
}

/// A condition of the object, matched by type without regard to case.
fn condition<'a>(o: &'a Object, type_: &str) -> Option<&'a Value> {
    at(&o.status, &["conditions"])?
        .as_array()?
        .iter()
        .find(|c| {
            at(c, &["type"])
                .and_then(Value::as_str)
                .is_some_and(|t| t.eq_ignore_ascii_case(type_))
        })
}

/// Why a job failed, if it did: its Failed condition's reason and message, else the status's.
fn failure(o: &Object) -> Option<String> {
    let text = |v: &Value, f: &str| {
        at(v, &[f])
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let failed_condition = condition(o, "Failed")
        .filter(|c| at(c, &["status"]).and_then(Value::as_str) == Some("True"));
    let (reason, message) = match failed_condition {
        Some(c) => (text(c, "reason"), text(c, "message")),
        None if phase(o) == Some("Failed") => {
            (text(&o.status, "reason"), text(&o.status, "message"))
        }
        None => return None,
    };
    let parts: Vec<String> = [reason, message]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    Some(if parts.is_empty() {
        "phase Failed".to_string()
    } else {
        parts.join(": ")
    })
}

pub async fn run(ctx: &mut Ctx, args: &WaitArgs, timeout: Duration) -> Result<()> {
    let (kind, name) = parse_object_ref(&args.target)?;
    let namespace = ctx.namespace_for(kind);
    let shown = display_name(kind.as_str(), &name);
    let scope = Scope {
        kind,
        namespace: namespace.clone(),
        selector: String::new(),
    };
    let key = (namespace, name);
    let deadline = Instant::now() + timeout;
    let outcome = observe(ctx, &scope, Some(deadline), |view| {
        Ok(match judge(view.objects.get(&key), &args.for_) {
            Verdict::Met => Some(Ok(())),
            Verdict::Failed(why) => Some(Err(anyhow!("{shown} failed: {why}"))),
            Verdict::Absent if view.initial => Some(Err(anyhow!("{shown} not found"))),
            Verdict::Absent => Some(Err(anyhow!(
                "{shown} was deleted while waiting for {}",
                args.for_
            ))),
            Verdict::Waiting => None,
        })
    })
    .await?;
    match outcome {
        None => bail!("timed out waiting for the condition on {shown}"),
        Some(result) => {
            result?;
            emit(&format!("{shown} condition met\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: Value) -> Object {
        serde_json::from_value(json!({
            "apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "ft", "namespace": "default"},
            "spec": {}, "status": status
        }))
        .expect("object")
    }

    fn cond(type_: &str, status: &str) -> WaitFor {
        WaitFor::Condition {
            type_: type_.into(),
            status: status.into(),
        }
    }

    #[test]
    fn parses_the_for_flag() {
        assert_eq!(
            parse_wait_for("condition=Complete"),
            Ok(cond("Complete", "True"))
        );
        assert_eq!(
            parse_wait_for("condition=Ready=false"),
            Ok(cond("Ready", "False"))
        );
        assert_eq!(
            parse_wait_for("Condition=Ready=Unknown"),
            Ok(cond("Ready", "Unknown"))
        );
        assert_eq!(
            parse_wait_for("phase=Running"),
            Ok(WaitFor::Phase("Running".into()))
        );
        assert_eq!(parse_wait_for("delete"), Ok(WaitFor::Delete));
        assert_eq!(parse_wait_for("Delete"), Ok(WaitFor::Delete));
        for bad in [
            "",
            "Complete",
            "condition",
            "condition=",
            "condition=Ready=maybe",
            "condition=a b",
            "phase=",
            "deleted",
            "status=Running",
            "jsonpath={.status.phase}=Running",
        ] {
            let e = parse_wait_for(bad).expect_err(bad);
            assert!(
                e.contains("expected condition=TYPE[=STATUS], phase=PHASE or delete"),
                "{e}"
            );
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(
            parse_wait_for("condition=Ready=maybe")
                .expect_err("bad")
                .contains("\"maybe\"")
        );
    }

    #[test]
    fn the_flag_works_through_clap() {
        use clap::Parser;
        let cli =
            crate::args::Cli::try_parse_from(["tbctl", "wait", "tj/x", "--for=condition=Complete"])
                .expect("parse");
        match cli.command {
            crate::args::Command::Wait(a) => assert_eq!(a.for_, cond("Complete", "True")),
            _ => unreachable!("wait"),
        }
        let e = crate::args::Cli::try_parse_from(["tbctl", "wait", "tj/x", "--for=ready"])
            .expect_err("bad");
        assert!(e.to_string().contains("phase=PHASE"), "{e}");
    }

    #[test]
    fn conditions_and_phases() {
        let running = job(
            json!({"phase": "Running", "conditions": [{"type": "Complete", "status": "False"}]}),
        );
        assert_eq!(
            judge(Some(&running), &cond("Complete", "True")),
            Verdict::Waiting
        );
        assert_eq!(
            judge(Some(&running), &cond("complete", "False")),
            Verdict::Met
        );
        assert_eq!(
            judge(Some(&running), &WaitFor::Phase("running".into())),
            Verdict::Met
        );
        assert_eq!(judge(Some(&running), &WaitFor::Delete), Verdict::Waiting);
        let done = job(
            json!({"phase": "Succeeded", "conditions": [{"type": "Complete", "status": "True"}]}),
        );
        assert_eq!(judge(Some(&done), &cond("Complete", "True")), Verdict::Met);
        assert_eq!(judge(None, &WaitFor::Delete), Verdict::Met);
        assert_eq!(judge(None, &cond("Complete", "True")), Verdict::Absent);
    }

    #[test]
    fn a_failed_job_ends_the_wait() {
        let failed = job(
            json!({"phase": "Failed", "reason": "BackoffLimitExceeded", "message": "rank 1 exited 1",
                                "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                "message": "rank 1 exited 1 (3 restarts)"}]}),
        );
        assert_eq!(
            judge(Some(&failed), &cond("Complete", "True")),
            Verdict::Failed("BackoffLimitExceeded: rank 1 exited 1 (3 restarts)".into())
        );
        assert!(matches!(
            judge(Some(&failed), &WaitFor::Phase("Running".into())),
            Verdict::Failed(_)
        ));
        // Waiting for the failure itself, or for deletion, is not cut short.
        assert_eq!(judge(Some(&failed), &cond("Failed", "True")), Verdict::Met);
        assert_eq!(
            judge(Some(&failed), &WaitFor::Phase("Failed".into())),
            Verdict::Met
        );
        assert_eq!(judge(Some(&failed), &WaitFor::Delete), Verdict::Waiting);
        // Phase alone is enough; without a reason the phase is the explanation.
        let bare = job(json!({"phase": "Failed"}));
        assert_eq!(
            judge(Some(&bare), &cond("Complete", "True")),
            Verdict::Failed("phase Failed".into())
        );
        let reason_only = job(json!({"phase": "Failed", "reason": "DeadlineExceeded"}));
        assert_eq!(
            judge(Some(&reason_only), &cond("Complete", "True")),
            Verdict::Failed("DeadlineExceeded".into())
        );
    }

    #[test]
    fn only_jobs_fail_fast() {
        let node: Object = serde_json::from_value(json!({
            "apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "mac1"},
            "status": {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .expect("node");
        assert_eq!(judge(Some(&node), &cond("Ready", "True")), Verdict::Waiting);
    }
}
