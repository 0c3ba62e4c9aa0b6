//! `tbctl get -w`: list, print, then print every change as it happens.
//!
//! The watch starts from the list's resourceVersion and remembers how far it has read (see
//! `observe::Position`: several objects may change at one version). When the connection drops
//! it fails over and resumes there (replayed events are skipped, so nothing prints twice); when
//! the server says the version is too old (OUT_OF_RANGE) it lists again and prints only the
//! differences from what it had shown, so nothing is missed.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use tb_api::Object;
use tb_api::proto::{WatchEvent, WatchRequest};
use tonic::Code;

use super::get::{Query, list};
use super::observe::Position;
use super::{Ctx, parse_object};
use crate::client::{RpcError, is_failover};
use crate::columns::View;
use crate::output::{self, OutputFormat, emit, render_row};

/// Pause before reopening a watch the server ended, so a server that keeps ending it is not
/// hammered.
const REOPEN_DELAY: Duration = Duration::from_millis(200);

type Key = (String, String);

fn key(o: &Object) -> Key {
    (o.metadata.namespace.clone(), o.metadata.name.clone())
}

/// Prints the initial list and then events in the chosen format.
pub struct Printer {
    format: Option<OutputFormat>,
    view: View,
    /// Column widths once the header is out (tables only).
    widths: Option<Vec<usize>>,
}

#[derive(Serialize)]
struct EventLine<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    object: &'a Object,
}

/// One watch event as a line of JSON: `{"type": "ADDED", "object": {...}}`.
pub fn json_event_line(type_: &str, object: &Object) -> Result<String> {
    let mut line = serde_json::to_string(&EventLine { type_, object })?;
    line.push('\n');
    Ok(line)
}

/// One watch event as a YAML document.
pub fn yaml_event_doc(type_: &str, object: &Object) -> Result<String> {
    Ok(format!(
        "---\n{}",
        serde_yaml::to_string(&EventLine { type_, object })?
    ))
}

impl Printer {
    pub fn new(format: Option<OutputFormat>, view: View) -> Printer {
        Printer {
            format,
            view,
            widths: None,
        }
    }

    fn is_table(&self) -> bool {
        matches!(self.format, None | Some(OutputFormat::Wide))
    }

    /// The objects that exist when the watch starts. Tables print as a table; the other
    /// formats print them as ADDED events, so every line of a JSON watch is one event.
    pub fn initial(&mut self, objects: &[Object]) -> Result<String> {
        if !self.is_table() {
            return objects.iter().map(|o| self.event("ADDED", o)).collect();
        }
        if objects.is_empty() {
            return Ok(String::new());
        }
        let table = self.view.table(objects, chrono::Utc::now());
        self.widths = Some(table.widths());
        Ok(table.render())
    }

    pub fn event(&mut self, type_: &str, o: &Object) -> Result<String> {
        Ok(match self.format {
            Some(OutputFormat::Json) => json_event_line(type_, o)?,
            Some(OutputFormat::Yaml) => yaml_event_doc(type_, o)?,
            Some(OutputFormat::Name) => format!("{}\n", o.display_name()),
            None | Some(OutputFormat::Wide) => {
                let row = self.view.row(o, chrono::Utc::now());
                match &mut self.widths {
                    Some(w) => {
                        // Keep earlier columns where they were; a longer cell just pushes on.
                        render_row(&row, w)
                    }
                    None => {
                        let mut t = output::Table::new(self.view.headers());
                        t.push(row);
                        self.widths = Some(t.widths());
                        t.render()
                    }
                }
            }
        })
    }
}

/// What the watch has shown so far.
struct Shown {
    objects: BTreeMap<Key, Object>,
    /// How far the watch has read: it resumes from there.
    position: Position,
}

pub async fn run(
    ctx: &mut Ctx,
    query: &Query,
    view: View,
    format: Option<OutputFormat>,
) -> Result<()> {
    let mut printer = Printer::new(format, view);
    let (objects, version) = list(ctx, query).await?;
    emit(&printer.initial(&objects)?)?;
    let mut shown = Shown {
        objects: objects.into_iter().map(|o| (key(&o), o)).collect(),
        position: Position::listed(version),
    };
    loop {
        let req = WatchRequest {
            kind: query.kind.as_str().to_string(),
            namespace: query.namespace.clone(),
            label_selector: query.selector.clone(),
            resource_version: shown.position.watch_from(),
        };
        let mut stream = match ctx.client().watch(req).await {
            Ok(s) => s,
            Err(RpcError {
                code: Code::OutOfRange,
                message,
            }) => {
                tracing::info!(%message, "watch too old; listing again");
                relist(ctx, query, &mut shown, &mut printer).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        loop {
            match stream.message().await {
                Ok(Some(ev)) => emit(&handle(&ev, query, &mut shown, &mut printer)?)?,
                Ok(None) => {
                    let server = ctx
                        .client()
                        .current_server()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    tracing::info!(%server, "the server ended the watch; resuming elsewhere");
                    ctx.client().fail_over();
                    tokio::time::sleep(REOPEN_DELAY).await;
                    break;
                }
                Err(s) if s.code() == Code::OutOfRange => {
                    tracing::info!(message = s.message(), "watch fell behind; listing again");
                    relist(ctx, query, &mut shown, &mut printer).await?;
                    break;
                }
                Err(s) if is_failover(&s) => {
                    let server = ctx
                        .client()
                        .current_server()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    tracing::info!(%server, code = ?s.code(), message = s.message(), "watch lost; resuming elsewhere");
                    ctx.client().fail_over();
                    tokio::time::sleep(REOPEN_DELAY).await;
                    break;
                }
                Err(s) => {
                    return Err(RpcError {
                        code: s.code(),
                        message: s.message().to_string(),
                    }
                    .into());
                }
            }
        }
    }
}

/// Record one event; the text to print for it (empty if it is not to be shown).
fn handle(
    ev: &WatchEvent,
    query: &Query,
    shown: &mut Shown,
    printer: &mut Printer,
) -> Result<String> {
    let o = parse_object(&ev.object_json)?;
    let version = if ev.resource_version != 0 {
        ev.resource_version
    } else {
        o.metadata.resource_version
    };
    if !shown.position.admit(version, key(&o)) {
        // Replayed after a failover: already printed.
        return Ok(String::new());
    }
    if !query.wants(&o) {
        return Ok(String::new());
    }
    if ev.r#type == "DELETED" {
        shown.objects.remove(&key(&o));
    } else {
        shown.objects.insert(key(&o), o.clone());
    }
    printer.event(&ev.r#type, &o)
}

/// List again and print what changed since the last thing shown.
async fn relist(
    ctx: &mut Ctx,
    query: &Query,
    shown: &mut Shown,
    printer: &mut Printer,
) -> Result<()> {
    let (objects, version) = list(ctx, query).await?;
    emit(&catch_up(shown, objects, version, printer)?)
}

/// Replace what was shown with a fresh list; the events that turn one into the other.
fn catch_up(
    shown: &mut Shown,
    objects: Vec<Object>,
    version: u64,
    printer: &mut Printer,
) -> Result<String> {
    let fresh: BTreeMap<Key, Object> = objects.into_iter().map(|o| (key(&o), o)).collect();
    let mut out = String::new();
    for (k, o) in &fresh {
        match shown.objects.get(k) {
            None => out.push_str(&printer.event("ADDED", o)?),
            Some(old) if old.metadata.resource_version != o.metadata.resource_version => {
                out.push_str(&printer.event("MODIFIED", o)?)
            }
            Some(_) => {}
        }
    }
    for (k, old) in &shown.objects {
        if !fresh.contains_key(k) {
            out.push_str(&printer.event("DELETED", old)?);
        }
    }
    shown.objects = fresh;
    shown.position = Position::listed(version);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tb_api::Kind;

    fn obj(name: &str, rv: u64) -> Object {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": name, "resourceVersion": rv},
            "spec": {"priority": 1, "weight": 2}
        }))
        .expect("object")
    }

    fn query() -> Query {
        Query {
            kind: Kind::Queue,
            namespace: String::new(),
            selector: String::new(),
            names: Vec::new(),
            stale: false,
        }
    }

    fn view() -> View {
        View {
            kind: Kind::Queue,
            all_namespaces: false,
            wide: false,
        }
    }

    fn event(type_: &str, o: &Object, rv: u64) -> WatchEvent {
        WatchEvent {
            r#type: type_.into(),
            object_json: o.to_json(),
            resource_version: rv,
        }
    }

    #[test]
    fn json_events_are_one_per_line() {
        let mut p = Printer::new(Some(OutputFormat::Json), view());
        let text = p.initial(&[obj("a", 1), obj("b", 2)]).expect("print");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["type"], "ADDED");
        assert_eq!(lines[1]["object"]["metadata"]["name"], "b");
    }

    #[test]
    fn table_rows_follow_the_header() {
        let mut p = Printer::new(None, view());
        let first = p.event("ADDED", &obj("a", 1)).expect("print");
        assert!(first.starts_with("NAME"), "{first}");
        let next = p.event("MODIFIED", &obj("a", 2)).expect("print");
        assert!(next.starts_with("a "), "{next}");
        assert_eq!(next.lines().count(), 1);
    }

    #[test]
    fn replayed_events_are_skipped() {
        let mut shown = Shown {
            objects: BTreeMap::new(),
            position: Position::listed(5),
        };
        let mut p = Printer::new(Some(OutputFormat::Name), view());
        handle(
            &event("ADDED", &obj("old", 4), 4),
            &query(),
            &mut shown,
            &mut p,
        )
        .expect("handle");
        assert!(shown.objects.is_empty());
        handle(
            &event("ADDED", &obj("new", 6), 6),
            &query(),
            &mut shown,
            &mut p,
        )
        .expect("handle");
        assert_eq!(shown.position.version(), 6);
        assert!(
            shown
                .objects
                .contains_key(&(String::new(), "new".to_string()))
        );
        handle(
            &event("DELETED", &obj("new", 6), 7),
            &query(),
            &mut shown,
            &mut p,
        )
        .expect("handle");
        assert!(shown.objects.is_empty());
        assert_eq!(shown.position.version(), 7);
    }

    #[test]
    fn objects_changed_by_one_entry_all_print() {
        let mut shown = Shown {
            objects: BTreeMap::new(),
            position: Position::listed(5),
        };
        let mut p = Printer::new(Some(OutputFormat::Name), view());
        let a = handle(
            &event("ADDED", &obj("a", 6), 6),
            &query(),
            &mut shown,
            &mut p,
        )
        .expect("handle");
        let b = handle(
            &event("ADDED", &obj("b", 6), 6),
            &query(),
            &mut shown,
            &mut p,
        )
        .expect("handle");
        assert_eq!((a.as_str(), b.as_str()), ("queue/a\n", "queue/b\n"));
        // Resumed from just before 6, the server sends both again: neither prints twice.
        assert_eq!(shown.position.watch_from(), 5);
        let again = handle(
            &event("ADDED", &obj("a", 6), 6),
            &query(),
            &mut shown,
            &mut p,
        )
        .expect("handle");
        assert!(again.is_empty());
    }

    #[test]
    fn relisting_prints_only_differences() {
        let mut shown = Shown {
            objects: [obj("same", 2), obj("changed", 3), obj("gone", 4)]
                .into_iter()
                .map(|o| (key(&o), o))
                .collect(),
            position: Position::listed(4),
        };
        let mut p = Printer::new(Some(OutputFormat::Json), view());
        let fresh = vec![obj("same", 2), obj("changed", 8), obj("new", 9)];
        let text = catch_up(&mut shown, fresh, 10, &mut p).expect("catch up");
        let events: Vec<(String, String)> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json line");
                (
                    v["type"].as_str().unwrap_or_default().to_string(),
                    v["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        let want = [
            ("MODIFIED", "changed"),
            ("ADDED", "new"),
            ("DELETED", "gone"),
        ];
        assert_eq!(events.len(), want.len(), "{text}");
        for (t, n) in want {
            assert!(events.contains(&(t.to_string(), n.to_string())), "{text}");
        }
        assert_eq!(shown.position, Position::listed(10));
        assert_eq!(shown.objects.len(), 3);
    }

    #[test]
    fn names_filter_events() {
        let mut q = query();
        q.names = vec!["x".into()];
        let mut shown = Shown {
            objects: BTreeMap::new(),
            position: Position::listed(0),
        };
        let mut p = Printer::new(Some(OutputFormat::Name), view());
        handle(&event("ADDED", &obj("y", 3), 3), &q, &mut shown, &mut p).expect("handle");
        assert!(shown.objects.is_empty());
        // The version still advances, so a resume does not replay it.
        assert_eq!(shown.position.version(), 3);
    }
}
