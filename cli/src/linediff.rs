//! A line diff (longest common subsequence) and its unified-format rendering, for `tbctl diff`.
//!
//! Objects are small, so a quadratic LCS over the lines between the common prefix and suffix is
//! plenty; past a size bound the middle is shown as replaced wholesale, which is still a correct
//! (if not minimal) diff.

/// Above this many LCS cells the middle is not aligned line by line.
const MAX_CELLS: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    Equal(&'a str),
    Delete(&'a str),
    Insert(&'a str),
}

/// The edit script turning `old` into `new`.
pub fn diff_lines<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<Op<'a>> {
    let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let (a, b) = (
        &old[prefix..old.len() - suffix],
        &new[prefix..new.len() - suffix],
    );

    let mut ops: Vec<Op<'a>> = old[..prefix].iter().map(|l| Op::Equal(l)).collect();
    if (a.len() + 1).saturating_mul(b.len() + 1) > MAX_CELLS {
        ops.extend(a.iter().map(|l| Op::Delete(l)));
        ops.extend(b.iter().map(|l| Op::Insert(l)));
    } else {
        ops.extend(lcs_script(a, b));
    }
    ops.extend(old[old.len() - suffix..].iter().map(|l| Op::Equal(l)));
    ops
}

fn lcs_script<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Op<'a>> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: length of the LCS of a[i..] and b[j..].
    let w = m + 1;
    let mut lcs = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * w + j] = if a[i] == b[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    let mut ops = Vec::with_capacity(n + m);
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if a[i] == b[j] {
            ops.push(Op::Equal(a[i]));
            i += 1;
            j += 1;
        } else if lcs[(i + 1) * w + j] >= lcs[i * w + j + 1] {
            // Deletions before insertions, as diff(1) prints them.
            ops.push(Op::Delete(a[i]));
            i += 1;
        } else {
            ops.push(Op::Insert(b[j]));
            j += 1;
        }
    }
    ops.extend(a[i..].iter().map(|l| Op::Delete(l)));
    ops.extend(b[j..].iter().map(|l| Op::Insert(l)));
    ops
}

/// A unified diff of two texts with `context` lines around each change, headed by
/// `--- old_name` / `+++ new_name`; empty when the texts are equal.
pub fn unified(old: &str, new: &str, old_name: &str, new_name: &str, context: usize) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let ops = diff_lines(&a, &b);
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| !matches!(op, Op::Equal(_)))
        .map(|(i, _)| i)
        .collect();
    if changed.is_empty() {
        return String::new();
    }

    // Group changes whose context would touch into hunks of op indices [start, end).
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &i in &changed {
        let start = i.saturating_sub(context);
        let end = (i + 1 + context).min(ops.len());
        match hunks.last_mut() {
            Some(h) if start <= h.1 => h.1 = end,
            _ => hunks.push((start, end)),
        }
    }

    // Line numbers (1-based) in old and new at the start of each op.
    let mut pos = Vec::with_capacity(ops.len() + 1);
    let (mut la, mut lb) = (1usize, 1usize);
    for op in &ops {
        pos.push((la, lb));
        match op {
            Op::Equal(_) => {
                la += 1;
                lb += 1;
            }
            Op::Delete(_) => la += 1,
            Op::Insert(_) => lb += 1,
        }
    }

    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    for (start, end) in hunks {
        let slice = &ops[start..end];
        let old_len = slice.iter().filter(|o| !matches!(o, Op::Insert(_))).count();
        let new_len = slice.iter().filter(|o| !matches!(o, Op::Delete(_))).count();
        let (sa, sb) = pos[start];
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(sa, old_len),
            range(sb, new_len)
        ));
        for op in slice {
            let (mark, line) = match op {
                Op::Equal(l) => (' ', l),
                Op::Delete(l) => ('-', l),
                Op::Insert(l) => ('+', l),
            };
            out.push(mark);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `start,len` as diff(1) writes it: an empty range names the line before it.
fn range(start: usize, len: usize) -> String {
    match len {
        0 => format!("{},0", start - 1),
        1 => format!("{start}"),
        _ => format!("{start},{len}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(old: &str, new: &str) -> String {
        let a: Vec<&str> = old.split_whitespace().collect();
        let b: Vec<&str> = new.split_whitespace().collect();
        diff_lines(&a, &b)
            .iter()
            .map(|op| match op {
                Op::Equal(l) => format!(" {l}"),
                Op::Delete(l) => format!("-{l}"),
                Op::Insert(l) => format!("+{l}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn minimal_edit_scripts() {
        assert_eq!(script("a b c", "a b c"), " a  b  c");
        assert_eq!(script("a b c", "a x c"), " a -b +x  c");
        assert_eq!(script("", "a b"), "+a +b");
        assert_eq!(script("a b", ""), "-a -b");
        assert_eq!(script("a b c d", "b c d e"), "-a  b  c  d +e");
        // LCS of ABCBDAB / BDCABA has length 4.
        let ops = {
            let a: Vec<&str> = "A B C B D A B".split(' ').collect();
            let b: Vec<&str> = "B D C A B A".split(' ').collect();
            diff_lines(&a, &b)
                .iter()
                .filter(|o| matches!(o, Op::Equal(_)))
                .count()
        };
        assert_eq!(ops, 4);
    }

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "x", "y", 3), "");
    }

    #[test]
    fn unified_hunks_with_context() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n";
        let new = "1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\n11\n12\n13\n";
        assert_eq!(
            unified(old, new, "live/model/m", "merged/model/m", 2),
            "--- live/model/m\n+++ merged/model/m\n\
             @@ -1,5 +1,5 @@\n 1\n 2\n-3\n+three\n 4\n 5\n\
             @@ -11,2 +11,3 @@\n 11\n 12\n+13\n"
        );
    }

    #[test]
    fn nearby_changes_share_a_hunk() {
        let d = unified("a\nb\nc\nd\n", "A\nb\nc\nD\n", "o", "n", 3);
        assert_eq!(d.matches("@@").count(), 2, "{d}");
        assert!(d.contains("@@ -1,4 +1,4 @@"), "{d}");
    }

    #[test]
    fn creation_diffs_against_nothing() {
        assert_eq!(
            unified("", "a\nb\n", "o", "n", 3),
            "--- o\n+++ n\n@@ -0,0 +1,2 @@\n+a\n+b\n"
        );
    }
}
