//! Splits a YAML stream into documents at `---` lines, remembering where each one starts so
//! that errors inside a document can be reported at the right line of the file.

/// One document of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Document {
    /// The document's text. A separator line is kept as spaces (plus whatever followed `--- `), so
    /// that line and column numbers inside the document map straight onto the file.
    pub text: String,
    /// File line (1-based) of the first line of `text`.
    pub first_line: usize,
    /// File line (1-based) of the first line with content, where the object "is".
    pub start: usize,
}

/// `---` alone, or `--- ` followed by content or a comment.
fn is_separator(line: &str) -> bool {
    let line = line.trim_end_matches('\r');
    line == "---" || line.starts_with("--- ")
}

/// A line that is neither blank nor a comment.
fn has_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#')
}

/// The documents of `text` that have content; empty and comment-only documents are dropped.
pub(crate) fn split_documents(text: &str) -> Vec<Document> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut docs = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut first_line = 1;
    for (i, line) in text.split('\n').enumerate() {
        if is_separator(line) {
            push_document(&mut docs, &current, first_line);
            current.clear();
            first_line = i + 1;
            current.push(format!("   {}", &line[3..]));
        } else {
            current.push(line.to_string());
        }
    }
    push_document(&mut docs, &current, first_line);
    docs
}

fn push_document(docs: &mut Vec<Document>, lines: &[String], first_line: usize) {
    if let Some(offset) = lines.iter().position(|l| has_content(l)) {
        docs.push(Document {
            text: lines.join("\n"),
            first_line,
            start: first_line + offset,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_tracks_lines() {
        let text = "# header\n\na: 1\n---\nb: 2\n--- # note\n\n# only a comment\n---\nc: 3\n";
        let docs = split_documents(text);
        assert_eq!(docs.len(), 3);
        assert_eq!((docs[0].first_line, docs[0].start), (1, 3));
        assert_eq!((docs[1].first_line, docs[1].start), (4, 5));
        assert_eq!((docs[2].first_line, docs[2].start), (9, 10));
        assert_eq!(docs[1].text, "   \nb: 2");
    }

    #[test]
    fn keeps_columns_of_content_after_the_separator() {
        let docs = split_documents("--- {a: 1}\n");
        assert_eq!(docs[0].text, "    {a: 1}\n");
        assert_eq!(docs[0].start, 1);
    }

    #[test]
    fn ignores_separators_inside_indented_text_and_empty_input() {
        assert!(split_documents("").is_empty());
        assert!(split_documents("---\n---\n# x\n").is_empty());
        let docs = split_documents("a: |\n  ---\n  text\n");
        assert_eq!(docs.len(), 1);
        assert!(split_documents("\u{feff}a: 1").len() == 1);
    }
}
