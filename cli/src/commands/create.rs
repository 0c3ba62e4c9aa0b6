//! `tbctl create job --from schedule/NAME [JOB]`: start one run of a Schedule now, from its job
//! template, as the Schedule would (labelled with it, so `concurrencyPolicy` and the history
//! count it). Output: `trainingjob/JOB created`.

use anyhow::{Result, bail};
use tb_api::Kind;
use tb_api::proto::{ApplyRequest, GetRequest};
use tb_api::specs::{ScheduleSpec, job_from_template, parse_spec};

use super::{Ctx, parse_object, request_id};
use crate::args::CreateJobArgs;

pub async fn run(ctx: &mut Ctx, args: &CreateJobArgs) -> Result<()> {
    let Some(("schedule" | "schedules", schedule_name)) = args.from.split_once('/') else {
        bail!(
            "--from {:?}: expected schedule/NAME (the Schedule whose template to run)",
            args.from
        );
    };
    let namespace = ctx.namespace_for(Kind::Schedule);
    let resp = ctx
        .client()
        .get(GetRequest {
            kind: Kind::Schedule.as_str().to_string(),
            namespace,
            name: schedule_name.to_string(),
            stale: false,
        })
        .await?;
    let schedule = parse_object(&resp.object_json)?;
    let spec: ScheduleSpec = parse_spec(&schedule.spec)?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None => format!(
            "{schedule_name}-manual-{}",
            chrono::Utc::now().format("%Y%m%d%H%M%S")
        ),
    };
    let job = job_from_template(&schedule, &spec, &name, "manual");
    let job = tb_api::validate_object(&job).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    ctx.client()
        .apply(ApplyRequest {
            objects_json: vec![job.to_json()],
            dry_run: false,
            request_id: request_id(),
        })
        .await?;
    println!("trainingjob/{name} created");
    Ok(())
}
