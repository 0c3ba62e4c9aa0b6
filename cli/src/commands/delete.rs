//! `tbctl delete`: delete objects named on the command line or defined in files. Each object is
//! its own request (with its own request id); a missing object is reported and the rest are
//! still deleted.

use anyhow::Result;
use tb_api::proto::DeleteRequest;
use tonic::Code;

use super::{Ctx, Reported, display_name, parse_kind, print_error, request_id};
use crate::args::DeleteArgs;
use crate::manifests;
use crate::output::emit;

pub async fn run(ctx: &mut Ctx, args: &DeleteArgs) -> Result<()> {
    let targets: Vec<(String, String, String)> = match &args.kind {
        Some(kind) => {
            let kind = parse_kind(kind)?;
            let ns = ctx.namespace_for(kind);
            args.names
                .iter()
                .map(|n| (kind.as_str().to_string(), ns.clone(), n.clone()))
                .collect()
        }
        None => {
            let mut loaded = manifests::load(&args.files)?;
            manifests::default_namespaces(&mut loaded, &ctx.target)?;
            loaded
                .into_iter()
                .map(|i| {
                    let o = i.loaded.object;
                    (o.kind, o.metadata.namespace, o.metadata.name)
                })
                .collect()
        }
    };
    let mut failed = false;
    for (kind, namespace, name) in targets {
        let req = DeleteRequest {
            kind: kind.clone(),
            namespace,
            name: name.clone(),
            resource_version: 0,
            request_id: request_id(),
        };
        match ctx.client().delete(req).await {
            Ok(_) => emit(&format!("{} deleted\n", display_name(&kind, &name)))?,
            Err(e) if e.code == Code::NotFound && args.ignore_not_found => {}
            Err(e) => {
                print_error(&e.to_string());
                failed = true;
            }
        }
    }
    if failed {
        return Err(Reported(1).into());
    }
    Ok(())
}
