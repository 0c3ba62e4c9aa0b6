//! Printers for objects: aligned tables, `-o yaml`, `-o json`, `-o name`, and the single place
//! that writes to stdout.
//!
//! Contracts other tools rely on: `-o json` of a list is `{"items": [...]}` and of one object the
//! object itself; `-o yaml` likewise; `-o name` prints `kind/name`, one per line.

use std::io::Write;

use anyhow::{Context, Result};
use clap::ValueEnum;
use serde::Serialize;
use tb_api::Object;

/// `-o` of `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Yaml,
    Json,
    /// The table with more columns.
    Wide,
    /// `kind/name`.
    Name,
}

/// Columns separated like kubectl's (three spaces), the last column unpadded.
const GAP: &str = "   ";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Table {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// The width of each column: its widest cell or header.
    pub fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                let n = cell.chars().count();
                match w.get_mut(i) {
                    Some(cur) => *cur = (*cur).max(n),
                    None => w.push(n),
                }
            }
        }
        w
    }

    /// Header and rows, each line ending in a newline.
    pub fn render(&self) -> String {
        let widths = self.widths();
        let mut out = render_row(&self.headers, &widths);
        for row in &self.rows {
            out.push_str(&render_row(row, &widths));
        }
        out
    }
}

/// One line of a table laid out with given widths (used alone when a watch prints rows as
/// they come, aligned with the table printed first).
pub fn render_row(cells: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            line.push_str(GAP);
        }
        line.push_str(cell);
        if i + 1 < cells.len() {
            let w = widths.get(i).copied().unwrap_or(0);
            let pad = w.saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }
    // Empty trailing cells would leave trailing blanks.
    let mut line = line.trim_end().to_string();
    line.push('\n');
    line
}

#[derive(Serialize)]
struct Items<'a> {
    items: &'a [Object],
}

/// `{"items": [...]}`, pretty-printed.
pub fn json_items(objects: &[Object]) -> Result<String> {
    let mut s = serde_json::to_string_pretty(&Items { items: objects }).context("encoding JSON")?;
    s.push('\n');
    Ok(s)
}

pub fn json_object(object: &Object) -> Result<String> {
    let mut s = serde_json::to_string_pretty(object).context("encoding JSON")?;
    s.push('\n');
    Ok(s)
}

/// `items:` followed by the objects, in YAML.
pub fn yaml_items(objects: &[Object]) -> Result<String> {
    serde_yaml::to_string(&Items { items: objects }).context("encoding YAML")
}

pub fn yaml_object(object: &Object) -> String {
    tb_api::load::to_yaml(object)
}

/// `kind/name` per object, one per line.
pub fn names(objects: &[Object]) -> String {
    objects
        .iter()
        .map(|o| format!("{}\n", o.display_name()))
        .collect()
}

/// Write to stdout and flush, so a watch's lines reach a pipe as they happen.
pub fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(kind: &str, name: &str) -> Object {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tb/v1", "kind": kind, "metadata": {"name": name, "namespace": "default"},
            "spec": {"format": "gguf"}
        }))
        .expect("object")
    }

    #[test]
    fn table_columns_align() {
        let mut t = Table::new(["NAME", "MODEL", "AGE"]);
        t.push(vec!["a".into(), "qwen3-235b".into(), "5m".into()]);
        t.push(vec!["longer-name".into(), "m".into(), "10d".into()]);
        assert_eq!(
            t.render(),
            "NAME          MODEL        AGE\n\
             a             qwen3-235b   5m\n\
             longer-name   m            10d\n"
        );
    }

    #[test]
    fn last_column_is_not_padded() {
        let mut t = Table::new(["NAME", "MESSAGE"]);
        t.push(vec!["a".into(), "short".into()]);
        t.push(vec!["b".into(), "a much longer message".into()]);
        for line in t.render().lines() {
            assert_eq!(line, line.trim_end());
        }
    }

    #[test]
    fn rows_rendered_later_keep_the_widths() {
        let mut t = Table::new(["NAME", "AGE"]);
        t.push(vec!["abcdef".into(), "1s".into()]);
        let w = t.widths();
        assert_eq!(render_row(&["x".into(), "2s".into()], &w), "x        2s\n");
    }

    #[test]
    fn names_are_kind_slash_name() {
        let objs = [obj("Model", "llama"), obj("InferenceService", "chat")];
        assert_eq!(names(&objs), "model/llama\ninferenceservice/chat\n");
    }

    #[test]
    fn json_list_has_an_items_wrapper() {
        let objs = [obj("Model", "llama")];
        let v: serde_json::Value =
            serde_json::from_str(&json_items(&objs).expect("json")).expect("parse");
        assert_eq!(v["items"][0]["metadata"]["name"], "llama");
        assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
        let v: serde_json::Value =
            serde_json::from_str(&json_items(&[]).expect("json")).expect("parse");
        assert_eq!(v, serde_json::json!({"items": []}));
        let v: serde_json::Value =
            serde_json::from_str(&json_object(&objs[0]).expect("json")).expect("parse");
        assert_eq!(v["kind"], "Model");
    }

    #[test]
    fn yaml_list_has_an_items_wrapper() {
        let text = yaml_items(&[obj("Model", "llama")]).expect("yaml");
        let v: serde_json::Value = serde_yaml::from_str(&text).expect("parse");
        assert_eq!(v["items"][0]["spec"]["format"], "gguf");
    }
}
