//! Finds where a field is written in a YAML (or JSON) document, for errors found after parsing
//! (a bad name, `ranks: 0`), which serde cannot place. Best effort: it follows the path key by
//! key, each one searched for inside the block of the one before.

/// One step of a field path: a mapping key or a list index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `spec.command[0]` → [spec, command, 0]. Keys may themselves contain dots (label keys such as
/// `example.com/team`); those are resolved against the text by `locate`.
fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key.to_string()));
        }
        while let Some((index, tail)) = rest.split_once(']') {
            if let Ok(i) = index.parse() {
                out.push(Step::Index(i));
            }
            rest = tail.strip_prefix('[').unwrap_or(tail);
        }
    }
    out
}

/// A place in the text: 0-based line, 0-based byte column, and the indentation of that line.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    line: usize,
    col: usize,
    indent: usize,
}

/// The 1-based (line, column) in `text` of the value at `path`, or of the deepest part of the
/// path that could be found; `None` if not even the first key is there.
pub(crate) fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.split('\n').collect();
    let steps = steps(path);
    // The cursor is the position just after the parent's key; children are searched from it.
    let mut parent: Option<Cursor> = None;
    let mut best: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < steps.len() {
        let hit = match &steps[i] {
            Step::Index(n) => parent
                .and_then(|p| find_item(&lines, p, *n))
                .map(|c| (c, i + 1)),
            Step::Key(_) => {
                // Try the longest run of keys first, so `example.com/team` is found whole.
                let run = steps[i..]
                    .iter()
                    .take_while(|s| matches!(s, Step::Key(_)))
                    .count();
                (1..=run).rev().find_map(|len| {
                    let key = steps[i..i + len]
                        .iter()
                        .filter_map(|s| match s {
                            Step::Key(k) => Some(k.as_str()),
                            Step::Index(_) => None,
                        })
                        .collect::<Vec<_>>()
                        .join(".");
                    find_key(&lines, parent, &key).map(|c| (c, i + len))
                })
            }
        };
        let Some((found, next)) = hit else { break };
        best = Some(value_position(lines[found.line], found));
        parent = Some(found);
        i = next;
    }
    best
}

/// The second `key:` of the block mapping whose first key is at 1-based (`line`, `column`): the
/// entry a "duplicate entry" error is about.
pub(crate) fn duplicate_key(
    text: &str,
    (line, column): (usize, usize),
    key: &str,
) -> Option<(usize, usize)> {
    let indent = column.checked_sub(1)?;
    let mut seen = 0;
    for (n, l) in text.split('\n').enumerate().skip(line.checked_sub(1)?) {
        let this_indent = l.len() - l.trim_start().len();
        if is_content(l) && this_indent < indent {
            break; // left the mapping
        }
        let rest = l.get(indent..).unwrap_or("");
        let at_key = this_indent == indent
            && (rest.starts_with(key) || rest.get(1..).is_some_and(|r| r.starts_with(key)));
        if at_key && find_key_in_line(l, indent, key).is_some() {
            seen += 1;
            if seen == 2 {
                return Some((n + 1, column));
            }
        }
    }
    None
}

/// Looks for `key:` inside the block that starts at `parent` (the whole text at the top level).
fn find_key(lines: &[&str], parent: Option<Cursor>, key: &str) -> Option<Cursor> {
    let (first, mut col) = parent.map_or((0, 0), |p| (p.line, p.col));
    for (n, line) in lines.iter().enumerate().skip(first) {
        let indent = line.len() - line.trim_start().len();
        if let Some(p) = parent
            && n > p.line
            && is_content(line)
            && indent <= p.indent
        {
            return None; // left the parent's block
        }
        if let Some(at) = find_key_in_line(line, col, key) {
            return Some(Cursor {
                line: n,
                col: at,
                indent,
            });
        }
        col = 0;
    }
    None
}

/// The byte column just after `key:` (quoted or not) in `line`, searching from `from`.
fn find_key_in_line(line: &str, from: usize, key: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut start = from;
    while let Some(rel) = line.get(start..)?.find(key) {
        let at = start + rel;
        let end = at + key.len();
        start = at + 1;
        let quote = at
            .checked_sub(1)
            .map(|p| bytes[p])
            .filter(|q| *q == b'"' || *q == b'\'');
        let before = match quote {
            Some(_) => at.checked_sub(2).map(|p| bytes[p]),
            None => at.checked_sub(1).map(|p| bytes[p]),
        };
        let boundary = before.is_none_or(|b| matches!(b, b' ' | b'\t' | b'{' | b',' | b'-'));
        let mut after = end;
        if let Some(q) = quote {
            if bytes.get(after) != Some(&q) {
                continue;
            }
            after += 1;
        }
        while bytes.get(after) == Some(&b' ') {
            after += 1;
        }
        let colon = bytes.get(after) == Some(&b':');
        let value_ok = quote.is_some()
            || matches!(
                bytes.get(after + 1),
                None | Some(b' ' | b'\t' | b'\r' | b'{' | b'[')
            );
        if boundary && colon && value_ok {
            return Some(after + 1);
        }
    }
    None
}

/// The `n`-th item of the list that is the value at `parent` (block `- x` items or flow `[x, y]`).
fn find_item(lines: &[&str], parent: Cursor, n: usize) -> Option<Cursor> {
    let rest = lines[parent.line].get(parent.col..)?.trim_start();
    if rest.starts_with('[') {
        return Some(parent); // flow list: the list itself is as close as we get
    }
    let mut seen = 0;
    // Items of this list share the indentation of the first one; deeper dashes are nested lists.
    let mut item_indent = None;
    for (i, line) in lines.iter().enumerate().skip(parent.line + 1) {
        let indent = line.len() - line.trim_start().len();
        if !is_content(line) {
            continue;
        }
        let trimmed = line.trim_start();
        let is_item = trimmed == "-" || trimmed.starts_with("- ");
        if indent < parent.indent || (indent == parent.indent && !is_item) {
            return None;
        }
        if is_item && *item_indent.get_or_insert(indent) == indent {
            if seen == n {
                return Some(Cursor {
                    line: i,
                    col: indent + 1,
                    indent,
                });
            }
            seen += 1;
        }
    }
    None
}

/// Where to point for a found key: at its value if it has one on the same line, else at the key.
fn value_position(line: &str, at: Cursor) -> (usize, usize) {
    let rest = &line[at.col.min(line.len())..];
    let value = rest.len() - rest.trim_start().len();
    let target = if rest.trim().is_empty() || rest.trim_start().starts_with('#') {
        // Point at the key: walk back over the colon, the key and an optional quote.
        line[..at.col]
            .rfind(|c: char| c.is_whitespace() || c == '{' || c == ',')
            .map_or(0, |p| p + 1)
    } else {
        at.col + value
    };
    (at.line + 1, line[..target].chars().count() + 1)
}

fn is_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#')
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: My_Job
  labels:
    example.com/team: \"bad value\"
spec:
  command:
    - sh
    - \"\"
  nodeSelector: {}
  ranks: 0
  checkpoints:
    dir: \"\"
";

    #[test]
    fn finds_values_and_keys() {
        assert_eq!(locate(DOC, "metadata.name"), Some((4, 9)));
        assert_eq!(locate(DOC, "spec.ranks"), Some((12, 10)));
        assert_eq!(
            locate(DOC, "metadata.labels.example.com/team"),
            Some((6, 23))
        );
        assert_eq!(locate(DOC, "spec.checkpoints.dir"), Some((14, 10)));
        assert_eq!(locate(DOC, "spec.checkpoints"), Some((13, 3)));
        assert_eq!(locate(DOC, "spec.command[1]"), Some((10, 7)));
        assert_eq!(locate(DOC, "spec.command[0]"), Some((9, 7)));
    }

    #[test]
    fn falls_back_to_the_deepest_key_found() {
        // `spec.memory` is not written: point at `spec`.
        assert_eq!(locate(DOC, "spec.memory"), Some((7, 1)));
        // `dir` exists, but not under `metadata`.
        assert_eq!(locate(DOC, "metadata.dir"), Some((3, 1)));
        assert_eq!(locate(DOC, "status"), None);
    }

    #[test]
    fn finds_the_duplicate_of_a_key() {
        let text = "spec:\n  ranks: 1\n  nested:\n    ranks: 5\n  ranks: 2\nother: 1\n";
        assert_eq!(duplicate_key(text, (2, 3), "ranks"), Some((5, 3)));
        assert_eq!(duplicate_key(text, (2, 3), "other"), None);
    }

    #[test]
    fn works_on_flow_style_and_json() {
        let json = "{\n  \"spec\": {\"ranks\": 0, \"nodes\": {\"min\": 0}}\n}";
        assert_eq!(locate(json, "spec.ranks"), Some((2, 21)));
        assert_eq!(locate(json, "spec.nodes.min"), Some((2, 41)));
    }
}
