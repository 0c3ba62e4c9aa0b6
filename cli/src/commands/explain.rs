//! `tbctl explain KIND[.field.path]`: the documentation of a kind or one of its fields, from the
//! object model itself (no server needed).

use anyhow::{Result, anyhow};

use super::parse_kind;
use crate::args::ExplainArgs;
use crate::output::emit;

pub fn run(args: &ExplainArgs) -> Result<()> {
    let (kind, path) = split_target(&args.target);
    let kind = parse_kind(kind)?;
    let mut text = tb_api::explain::explain(kind, path).map_err(|e| anyhow!(e))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    emit(&text)
}

/// `isvc.spec.nodes` → (`isvc`, `spec.nodes`).
fn split_target(s: &str) -> (&str, &str) {
    s.split_once('.').unwrap_or((s, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_kind_from_path() {
        assert_eq!(split_target("isvc"), ("isvc", ""));
        assert_eq!(
            split_target("isvc.spec.nodes.min"),
            ("isvc", "spec.nodes.min")
        );
    }
}
