//! `tbctl events`: Events, oldest first (by when they were last seen), as kubectl's `events`
//! shows them: `[NAMESPACE] LAST SEEN TYPE REASON OBJECT MESSAGE`, LAST SEEN reading `5m` or
//! `5m (x3 over 20m)` for a repeated event.
//!
//! `--for KIND/NAME` keeps the events about one object (events about a cluster-scoped object
//! are looked for in every namespace); `-A` lists every namespace. `-o json` prints
//! `{"items": [...]}` and `-o yaml` `items: [...]`. With `-w`, the list is followed by each new
//! or repeated event as it is recorded: table rows aligned under the first header, or, with
//! `-o json`, one `{"type": "ADDED"|"MODIFIED", "object": {...}}` per line (the listed events
//! first, as ADDED), as `get -w` prints.

use anyhow::Result;
use chrono::{DateTime, Utc};
use tb_api::proto::ListRequest;
use tb_api::{Kind, Object};

use super::describe::{event_age, involves, last_seen, sort_events};
use super::observe::{Scope, observe};
use super::watch::{json_event_line, yaml_event_doc};
use super::{Ctx, parse_object, parse_object_ref};
use crate::args::{EventsArgs, EventsOutput};
use crate::columns::{at, cell, involved_object};
use crate::output::{self, Table, emit, render_row};

/// Which events to show.
#[derive(Debug, Clone)]
struct Filter {
    /// Empty: every namespace.
    namespace: String,
    about: Option<(Kind, String)>,
}

impl Filter {
    fn wants(&self, e: &Object) -> bool {
        match &self.about {
            None => true,
            Some((kind, name)) => involves(e, *kind, &self.namespace, name, ""),
        }
    }
}

/// Prints the table (or JSON/YAML), keeping the column widths of the first header.
pub struct Printer {
    output: Option<EventsOutput>,
    all_namespaces: bool,
    widths: Option<Vec<usize>>,
}

impl Printer {
    pub fn new(output: Option<EventsOutput>, all_namespaces: bool) -> Printer {
        Printer {
            output,
            all_namespaces,
            widths: None,
        }
    }

    fn headers(&self) -> Vec<&'static str> {
        let mut h = Vec::new();
        if self.all_namespaces {
            h.push("NAMESPACE");
        }
        h.extend(["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]);
        h
    }

    pub fn row(&self, e: &Object, now: DateTime<Utc>) -> Vec<String> {
        let mut r = Vec::new();
        if self.all_namespaces {
            r.push(e.metadata.namespace.clone());
        }
        r.extend([
            event_age(e, now),
            cell(at(&e.spec, &["type"])),
            cell(at(&e.spec, &["reason"])),
            involved_object(&e.spec),
            cell(at(&e.spec, &["message"])),
        ]);
        r
    }

    /// The whole list, for a plain `events`.
    pub fn list(&self, events: &[Object], now: DateTime<Utc>) -> Result<String> {
        match self.output {
            Some(EventsOutput::Json) => output::json_items(events),
            Some(EventsOutput::Yaml) => output::yaml_items(events),
            None => {
                let mut t = Table::new(self.headers());
                for e in events {
                    t.push(self.row(e, now));
                }
                Ok(t.render())
            }
        }
    }

    /// Events as a watch prints them: the first ones under a header, later ones row by row.
    pub fn watched(&mut self, events: &[(&str, &Object)], now: DateTime<Utc>) -> Result<String> {
        let mut out = String::new();
        for &(type_, e) in events {
            match self.output {
                Some(EventsOutput::Json) => out.push_str(&json_event_line(type_, e)?),
                Some(EventsOutput::Yaml) => out.push_str(&yaml_event_doc(type_, e)?),
                None => {
                    let row = self.row(e, now);
                    match &self.widths {
                        Some(w) => out.push_str(&render_row(&row, w)),
                        None => {
                            // Size the columns to everything known now; later rows keep them.
                            let mut t = Table::new(self.headers());
                            for (_, e) in events {
                                t.push(self.row(e, now));
                            }
                            self.widths = Some(t.widths());
                            return Ok(t.render());
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

pub async fn run(ctx: &mut Ctx, args: &EventsArgs) -> Result<()> {
    let about = args.for_.as_deref().map(parse_object_ref).transpose()?;
    let namespace = match &about {
        _ if args.all_namespaces => String::new(),
        // Events about a Node or Queue may be recorded in any namespace.
        Some((kind, _)) if !kind.is_namespaced() => String::new(),
        _ => ctx.target.namespace.clone(),
    };
    let filter = Filter { namespace, about };
    let mut printer = Printer::new(args.output, args.all_namespaces);
    if !args.watch {
        let req = ListRequest {
            kind: Kind::Event.as_str().to_string(),
            namespace: filter.namespace.clone(),
            label_selector: String::new(),
            stale: false,
        };
        let resp = ctx.client().list(req).await?;
        let mut events = resp
            .objects_json
            .iter()
            .map(|j| parse_object(j))
            .collect::<Result<Vec<_>>>()?;
        events.retain(|e| filter.wants(e));
        sort_events(&mut events);
        if events.is_empty() && args.output.is_none() {
            eprintln!("{}", no_events(&filter.namespace));
            return Ok(());
        }
        return emit(&printer.list(&events, Utc::now())?);
    }
    let scope = Scope {
        kind: Kind::Event,
        namespace: filter.namespace.clone(),
        selector: String::new(),
    };
    observe(ctx, &scope, None, |view| {
        // A repeat of an event updates it (MODIFIED); it prints as a new line all the same.
        let mut fresh: Vec<(&str, &Object)> = view
            .changes
            .iter()
            .filter(|c| c.type_ != "DELETED" && filter.wants(&c.object))
            .map(|c| (c.type_.as_str(), &c.object))
            .collect();
        fresh.sort_by_key(|(_, e)| {
            last_seen(e)
                .map(|t| t.timestamp_millis())
                .unwrap_or(i64::MIN)
        });
        emit(&printer.watched(&fresh, Utc::now())?)?;
        Ok(None::<()>)
    })
    .await?;
    Ok(())
}

fn no_events(namespace: &str) -> String {
    if namespace.is_empty() {
        "No events found.".to_string()
    } else {
        format!("No events found in {namespace} namespace.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    fn event(
        name: &str,
        ns: &str,
        kind: &str,
        on: &str,
        last: &str,
        count: u32,
        reason: &str,
    ) -> Object {
        serde_json::from_value(json!({
            "apiVersion": "tb/v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
            "spec": {"type": "Normal", "reason": reason, "message": format!("{reason} happened"), "count": count,
                     "involvedObject": {"kind": kind, "namespace": ns, "name": on},
                     "firstTimestamp": "2025-06-01T11:40:00Z", "lastTimestamp": last}
        }))
        .expect("event")
    }

    #[test]
    fn table_is_kubectl_style_and_oldest_first() {
        let mut events = vec![
            event(
                "e2",
                "default",
                "TrainingJob",
                "ft",
                "2025-06-01T11:59:00Z",
                1,
                "Started",
            ),
            event(
                "e1",
                "default",
                "TrainingJob",
                "ft",
                "2025-06-01T11:55:00Z",
                3,
                "BackOff",
            ),
        ];
        sort_events(&mut events);
        let text = Printer::new(None, false)
            .list(&events, now())
            .expect("table");
        assert_eq!(
            text,
            "LAST SEEN          TYPE     REASON    OBJECT           MESSAGE\n\
             5m (x3 over 20m)   Normal   BackOff   trainingjob/ft   BackOff happened\n\
             60s                Normal   Started   trainingjob/ft   Started happened\n"
        );
        let wide = Printer::new(None, true)
            .list(&events, now())
            .expect("table");
        assert!(wide.starts_with("NAMESPACE   LAST SEEN"), "{wide}");
        assert!(
            wide.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("default ")),
            "{wide}"
        );
    }

    #[test]
    fn json_is_an_items_list() {
        let events = vec![event(
            "e1",
            "default",
            "Node",
            "mac1",
            "2025-06-01T11:55:00Z",
            1,
            "NodeReady",
        )];
        let v: Value = serde_json::from_str(
            &Printer::new(Some(EventsOutput::Json), false)
                .list(&events, now())
                .expect("json"),
        )
        .expect("parse");
        assert_eq!(v["items"][0]["spec"]["reason"], "NodeReady");
    }

    #[test]
    fn for_filters_by_object() {
        let filter = Filter {
            namespace: "default".into(),
            about: Some((Kind::TrainingJob, "ft".into())),
        };
        assert!(filter.wants(&event("a", "default", "TrainingJob", "ft", "", 1, "R")));
        assert!(!filter.wants(&event("b", "default", "TrainingJob", "other", "", 1, "R")));
        assert!(!filter.wants(&event("c", "default", "InferenceService", "ft", "", 1, "R")));
        assert!(!filter.wants(&event("d", "team", "TrainingJob", "ft", "", 1, "R")));
        let any_ns = Filter {
            namespace: String::new(),
            about: Some((Kind::TrainingJob, "ft".into())),
        };
        assert!(any_ns.wants(&event("d", "team", "TrainingJob", "ft", "", 1, "R")));
        let everything = Filter {
            namespace: String::new(),
            about: None,
        };
        assert!(everything.wants(&event("x", "team", "Node", "mac1", "", 1, "R")));
    }

    #[test]
    fn watch_rows_follow_the_first_header() {
        let mut p = Printer::new(None, false);
        let first = event(
            "e1",
            "default",
            "TrainingJob",
            "ft",
            "2025-06-01T11:55:00Z",
            1,
            "Scheduled",
        );
        let text = p.watched(&[("ADDED", &first)], now()).expect("first");
        assert_eq!(text.lines().count(), 2);
        assert!(text.starts_with("LAST SEEN"), "{text}");
        let next = event(
            "e2",
            "default",
            "TrainingJob",
            "ft",
            "2025-06-01T11:59:00Z",
            1,
            "Started",
        );
        let text = p.watched(&[("ADDED", &next)], now()).expect("next");
        assert_eq!(text.lines().count(), 1);
        assert!(text.starts_with("60s "), "{text}");

        let mut p = Printer::new(Some(EventsOutput::Json), false);
        let text = p
            .watched(&[("ADDED", &first), ("MODIFIED", &next)], now())
            .expect("json");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["type"], "ADDED");
        assert_eq!(lines[1]["type"], "MODIFIED");
        assert_eq!(lines[1]["object"]["metadata"]["name"], "e2");
    }
}
