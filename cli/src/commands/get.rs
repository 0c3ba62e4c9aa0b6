//! `tbctl get`: list a kind or fetch objects by name, as a table, YAML, JSON or names; with
//! `-w`, keep printing changes (see `watch`).

use anyhow::{Result, bail};
use tb_api::proto::{GetRequest, ListRequest};
use tb_api::selector::LabelSelector;
use tb_api::{Kind, Object};

use super::{Ctx, Reported, parse_kind, parse_object, print_error};
use crate::args::GetArgs;
use crate::columns::View;
use crate::output::{self, OutputFormat, emit};

/// What `get` asks for, checked.
#[derive(Debug, Clone)]
pub struct Query {
    pub kind: Kind,
    /// Empty: every namespace (or a cluster-scoped kind).
    pub namespace: String,
    pub selector: String,
    /// Empty: all objects that match.
    pub names: Vec<String>,
    pub stale: bool,
}

impl Query {
    pub fn wants(&self, o: &Object) -> bool {
        self.names.is_empty() || self.names.contains(&o.metadata.name)
    }

    pub fn list_request(&self) -> ListRequest {
        ListRequest {
            kind: self.kind.as_str().to_string(),
            namespace: self.namespace.clone(),
            label_selector: self.selector.clone(),
            stale: self.stale,
        }
    }
}

pub async fn run(ctx: &mut Ctx, args: &GetArgs) -> Result<()> {
    let kind = parse_kind(&args.kind)?;
    let selector = args.selector.clone().unwrap_or_default();
    if !selector.is_empty() {
        // A bad selector is a local mistake; say so before contacting anyone.
        if let Err(e) = LabelSelector::parse(&selector) {
            bail!("--selector: {e}");
        }
        if !args.names.is_empty() {
            bail!("--selector cannot be combined with names");
        }
    }
    if args.all_namespaces && !args.names.is_empty() {
        bail!(
            "--all-namespaces cannot be combined with names: an object is named within one namespace"
        );
    }
    let namespace = if args.all_namespaces {
        String::new()
    } else {
        ctx.namespace_for(kind)
    };
    let query = Query {
        kind,
        namespace,
        selector,
        names: args.names.clone(),
        stale: args.stale,
    };
    let view = View {
        kind,
        all_namespaces: args.all_namespaces,
        wide: args.output == Some(OutputFormat::Wide),
    };
    if args.watch {
        return super::watch::run(ctx, &query, view, args.output).await;
    }
    if query.names.is_empty() {
        let objects = list(ctx, &query).await?.0;
        if objects.is_empty() && matches!(args.output, None | Some(OutputFormat::Wide)) {
            eprintln!("{}", no_resources(&query));
            return Ok(());
        }
        let objects = with_queue_positions(ctx, kind, objects, args.output).await;
        return emit(&render_list(&objects, args.output, view)?);
    }

    // By name: print what was found, report what was not, and fail if anything was missing.
    let mut found = Vec::new();
    let mut failed = false;
    for name in &query.names {
        let req = GetRequest {
            kind: kind.as_str().to_string(),
            namespace: query.namespace.clone(),
            name: name.clone(),
            stale: query.stale,
        };
        match ctx.client().get(req).await {
            Ok(r) => found.push(parse_object(&r.object_json)?),
            Err(e) => {
                print_error(&e.to_string());
                failed = true;
            }
        }
    }
    if !found.is_empty() {
        let text = match (args.output, found.as_slice()) {
            // One object asked for by name prints as itself, not as a list.
            (Some(OutputFormat::Json), [one]) if query.names.len() == 1 => {
                output::json_object(one)?
            }
            (Some(OutputFormat::Yaml), [one]) if query.names.len() == 1 => output::yaml_object(one),
            _ => {
                let found = with_queue_positions(ctx, kind, found.clone(), args.output).await;
                render_list(&found, args.output, view)?
            }
        };
        emit(&text)?;
    }
    if failed {
        return Err(Reported(1).into());
    }
    Ok(())
}

/// For tables of jobs: each job's queue and (when pending) its place in the cluster-wide order,
/// put in `status.queue` / `status.position` of the copies shown. The controller does not
/// store positions (every admission would rewrite every pending job's status); they come from
/// the scheduler's own ordering over a fresh listing. Best effort: without it the columns show
/// `-`.
async fn with_queue_positions(
    ctx: &mut Ctx,
    kind: Kind,
    mut objects: Vec<Object>,
    format: Option<OutputFormat>,
) -> Vec<Object> {
    let job_kind = matches!(kind, Kind::TrainingJob | Kind::InferenceService);
    if !job_kind || !matches!(format, None | Some(OutputFormat::Wide)) || objects.is_empty() {
        return objects;
    }
    let Ok(snap) = super::usage::Snapshot::fetch(ctx).await else {
        return objects;
    };
    let placements = snap.placements();
    for o in &mut objects {
        let key = (
            o.kind.clone(),
            o.metadata.namespace.clone(),
            o.metadata.name.clone(),
        );
        if o.status.is_null() {
            o.status = serde_json::json!({});
        }
        if let Some((queue, position)) = placements.get(&key)
            && let Some(status) = o.status.as_object_mut()
        {
            status.insert("queue".into(), queue.clone().into());
            if let Some(p) = position {
                status.insert("position".into(), (*p).into());
            }
        }
    }
    objects
}

/// The matching objects, sorted by namespace and name, and the store's version to watch from.
pub async fn list(ctx: &mut Ctx, query: &Query) -> Result<(Vec<Object>, u64)> {
    let resp = ctx.client().list(query.list_request()).await?;
    let mut objects = resp
        .objects_json
        .iter()
        .map(|j| parse_object(j))
        .collect::<Result<Vec<_>>>()?;
    objects.retain(|o| query.wants(o));
    objects.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    Ok((objects, resp.resource_version))
}

pub fn render_list(objects: &[Object], format: Option<OutputFormat>, view: View) -> Result<String> {
    Ok(match format {
        Some(OutputFormat::Json) => output::json_items(objects)?,
        Some(OutputFormat::Yaml) => output::yaml_items(objects)?,
        Some(OutputFormat::Name) => output::names(objects),
        None | Some(OutputFormat::Wide) => view.table(objects, chrono::Utc::now()).render(),
    })
}

fn no_resources(q: &Query) -> String {
    if q.namespace.is_empty() {
        "No resources found".to_string()
    } else {
        format!("No resources found in {} namespace.", q.namespace)
    }
}
