//! A bound on flow nesting (`[` and `{` inside each other), checked before the YAML parser
//! runs. libyaml's scanner (under serde_yaml) does work proportional to the flow depth for every
//! token, and serde_yaml reads the whole document before its recursion limit (128 levels)
//! refuses it: a file of a few hundred kilobytes of `[` took minutes to reject. tb's objects need
//! a handful of levels.
//!
//! The scan is a light approximation of YAML's: it skips comments, quoted scalars and block
//! scalars (`|`, `>`), and in block context counts a bracket only where a value starts (so
//! `foo[bar` is plain text). It never refuses what serde_yaml would accept with sane depth;
//! at worst it lets a deep document through to serde_yaml's own limit.

/// The deepest flow nesting accepted: serde_yaml's recursion limit.
pub(crate) const MAX_FLOW_DEPTH: usize = 128;

/// The (line, column), 1-based, of the first `[` or `{` nested deeper than [`MAX_FLOW_DEPTH`].
pub(crate) fn too_deep(text: &str) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    // Indentation of the line that opened a block scalar: its content is the lines indented
    // more (and blank lines).
    let mut block_scalar: Option<usize> = None;
    for (line_no, line) in text.split('\n').enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        if let Some(parent) = block_scalar {
            if line.trim().is_empty() || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        let chars: Vec<char> = line.chars().collect();
        // In block context, whether the next token starts a value (line start, after `- `,
        // `? ` or `: `).
        let mut value_start = depth == 0 && quote.is_none();
        let mut prev = ' ';
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied().unwrap_or(' ');
            if let Some(q) = quote {
                if q == '"' && c == '\\' {
                    i += 2;
                    continue;
                }
                if c == q {
                    if q == '\'' && next == '\'' {
                        i += 2;
                        continue;
                    }
                    quote = None;
                }
                prev = c;
                i += 1;
                continue;
            }
            if c == '#' && prev.is_whitespace() {
                break;
            }
            if depth > 0 {
                match c {
                    '[' | '{' => {
                        depth += 1;
                        if depth > MAX_FLOW_DEPTH {
                            return Some((line_no + 1, i + 1));
                        }
                    }
                    ']' | '}' => depth -= 1,
                    '"' | '\'' if matches!(prev, ' ' | '\t' | '[' | '{' | ',' | ':') => {
                        quote = Some(c);
                    }
                    _ => {}
                }
            } else if value_start {
                match c {
                    ' ' | '\t' => {}
                    '[' | '{' => {
                        depth = 1;
                        value_start = false;
                    }
                    '"' | '\'' => {
                        quote = Some(c);
                        value_start = false;
                    }
                    '|' | '>' => {
                        block_scalar = Some(indent);
                        break;
                    }
                    '-' | '?' if next.is_whitespace() => {}
                    // An anchor or a tag before the value: skip it.
                    '&' | '!' => {
                        while i + 1 < chars.len() && !chars[i + 1].is_whitespace() {
                            i += 1;
                        }
                    }
                    _ => value_start = false,
                }
            } else if c == ':' && next.is_whitespace() {
                value_start = true;
            }
            prev = c;
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_found_where_it_passes_the_bound() {
        let text = format!("spec: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(too_deep(&text), Some((1, 6 + MAX_FLOW_DEPTH + 1)));
        let ok = format!(
            "spec: {}{}\n",
            "[".repeat(MAX_FLOW_DEPTH),
            "]".repeat(MAX_FLOW_DEPTH)
        );
        assert_eq!(too_deep(&ok), None);
    }

    #[test]
    fn brackets_in_text_are_not_nesting() {
        let open = "[".repeat(500);
        let texts = [
            format!("a: \"{open}\"\n"),
            format!("a: '{open}'\n"),
            format!("a: x{open}\n"),
            format!("a: 1 # {open}\n"),
            format!("a: |\n  {open}\n  more\nb: 1\n"),
            format!("- >-\n    {open}\n"),
            format!("a: [\"{open}\", '{open}']\n"),
        ];
        for t in texts {
            assert_eq!(too_deep(&t), None, "{t}");
        }
    }

    #[test]
    fn anchors_tags_and_sequences_before_a_flow_value_count() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for t in [
            format!("a: &x {deep}\n"),
            format!("a: !!seq {deep}\n"),
            format!("- {deep}\n"),
            format!("- a:\n  - b: {deep}\n"),
        ] {
            assert!(too_deep(&t).is_some(), "{t}");
        }
    }
}
