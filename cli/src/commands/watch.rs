//! `tbctl get -w`: list, print, then print every change as it happens.
//!
//! A [`tb_client::Informer`] does the listing and watching: it starts the watch from the list's
//! resourceVersion, resumes on the next controller when the connection drops (replayed events
//! are skipped, so nothing prints twice), and when the server says the version is too old
//! (OUT_OF_RANGE) lists again and reports only the differences from what it had, so nothing is
//! missed and each difference prints once.

use anyhow::Result;
use serde::Serialize;
use tb_api::Object;
use tb_client::informer::{Change, Informer, InformerError, Scope};

use super::Ctx;
use super::get::Query;
use crate::columns::View;
use crate::output::{self, OutputFormat, emit, render_row};

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

pub async fn run(
    ctx: &mut Ctx,
    query: &Query,
    view: View,
    format: Option<OutputFormat>,
) -> Result<()> {
    let mut printer = Printer::new(format, view);
    let mut informer = Informer::new(Scope {
        kind: query.kind,
        namespace: query.namespace.clone(),
        selector: query.selector.clone(),
    })
    .with_stale_list(query.stale);
    loop {
        let batch = match informer.next(ctx.client()).await {
            Ok(batch) => batch,
            Err(InformerError::Rpc(e)) => return Err(e.into()),
            Err(InformerError::Malformed(e)) => {
                return Err(
                    anyhow::Error::new(e).context("the server sent an object tbctl cannot read")
                );
            }
        };
        if batch.initial {
            // The objects are in (namespace, name) order, as `get` prints them.
            let objects: Vec<Object> = informer
                .objects()
                .values()
                .filter(|o| query.wants(o))
                .cloned()
                .collect();
            emit(&printer.initial(&objects)?)?;
            continue;
        }
        emit(&print_changes(&batch.changes, query, &mut printer)?)?;
    }
}

/// The text for the changes `query` asks for.
fn print_changes(changes: &[Change], query: &Query, printer: &mut Printer) -> Result<String> {
    let mut out = String::new();
    for c in changes.iter().filter(|c| query.wants(&c.object)) {
        out.push_str(&printer.event(&c.type_, &c.object)?);
    }
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
    fn names_filter_changes() {
        let mut q = query();
        q.names = vec!["x".into()];
        let mut p = Printer::new(Some(OutputFormat::Name), view());
        let changes = [
            Change {
                type_: "ADDED".into(),
                object: obj("y", 3),
            },
            Change {
                type_: "MODIFIED".into(),
                object: obj("x", 4),
            },
        ];
        let text = print_changes(&changes, &q, &mut p).expect("print");
        assert_eq!(text, "queue/x\n");
    }
}
