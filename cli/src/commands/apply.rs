//! `tbctl apply`: load and validate every object locally, then send them in one all-or-none
//! Apply request and print each object's outcome.

use anyhow::Result;
use tb_api::proto::ApplyRequest;

use super::{Ctx, display_name, request_id};
use crate::args::{ApplyArgs, DryRun};
use crate::manifests;
use crate::output::emit;

pub async fn run(ctx: &mut Ctx, args: &ApplyArgs) -> Result<()> {
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
    emit(&out)
}
