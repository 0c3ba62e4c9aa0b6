//! Parsers for the RDMA tools on macOS: `rdma_ctl status` (is RDMA over Thunderbolt enabled?)
//! and `ibv_devices` (which `rdma_*` devices exist).
//!
//! `rdma_ctl status` prints `enabled` or `disabled`, possibly inside a sentence; the word is
//! matched case-insensitively as a whole word. `ibv_devices` prints a header
//! (`    device          \t   node GUID`), a line of dashes, then one row per device
//! (`    rdma_en3        \t 0000000000000000`).
//!
//! Pure: take the commands' output as strings, do no I/O.

/// Why `rdma_ctl status` or `ibv_devices` output could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RdmaError {
    /// `rdma_ctl status` said neither `enabled` nor `disabled`, or said both.
    #[error(
        "expected `rdma_ctl status` to say exactly one of `enabled` or `disabled`, found `{found}`"
    )]
    AmbiguousStatus {
        /// The (trimmed) output.
        found: String,
    },
    /// `ibv_devices` output lacks the `device  node GUID` header.
    #[error("expected an `ibv_devices` header with `device` and `node GUID`, found `{found}`")]
    MissingHeader {
        /// The first non-empty line, if any.
        found: String,
    },
    /// A device row is not `<name> <16 hex digit GUID>`.
    #[error(
        "line {line}: expected `<device> <node GUID>` in `ibv_devices` output, found `{found}`"
    )]
    BadRow {
        /// 1-based line number.
        line: usize,
        /// The line found.
        found: String,
    },
}

/// Parses `rdma_ctl status`: `true` when it says `enabled`, `false` when it says `disabled`.
pub fn parse_rdma_status(text: &str) -> Result<bool, RdmaError> {
    let mut enabled = false;
    let mut disabled = false;
    for word in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        if word.eq_ignore_ascii_case("enabled") {
            enabled = true;
        } else if word.eq_ignore_ascii_case("disabled") {
            disabled = true;
        }
    }
    match (enabled, disabled) {
        (true, false) => Ok(true),
        (false, true) => Ok(false),
        _ => Err(RdmaError::AmbiguousStatus {
            found: text.trim().to_owned(),
        }),
    }
}

/// Parses `ibv_devices` into the device names (`rdma_en3`, ...), in the order listed.
pub fn parse_ibv_devices(text: &str) -> Result<Vec<String>, RdmaError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or_default();
    let lower = header.to_ascii_lowercase();
    if !(lower.contains("device") && lower.contains("node guid")) {
        return Err(RdmaError::MissingHeader {
            found: header.to_owned(),
        });
    }
    let mut devices = Vec::new();
    for (index, raw) in lines {
        let line = raw.trim();
        if line.chars().all(|c| c == '-' || c.is_whitespace()) {
            continue;
        }
        let bad = || RdmaError::BadRow {
            line: index + 1,
            found: line.to_owned(),
        };
        let mut fields = line.split_whitespace();
        let (Some(name), Some(guid), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(bad());
        };
        if guid.len() != 16 || !guid.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        devices.push(name.to_owned());
    }
    Ok(devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: &str = include_str!("../../tests/fixtures/discovery/mesh_member/rdma_ctl.txt");
    const OFF: &str = include_str!("../../tests/fixtures/discovery/rdma_disabled/rdma_ctl.txt");
    const MESH_IBV: &str =
        include_str!("../../tests/fixtures/discovery/mesh_member/ibv_devices.txt");
    const OFF_IBV: &str =
        include_str!("../../tests/fixtures/discovery/rdma_disabled/ibv_devices.txt");

    #[test]
    fn status() {
        assert_eq!(parse_rdma_status(ON), Ok(true));
        assert_eq!(parse_rdma_status(OFF), Ok(false));
        assert_eq!(parse_rdma_status("ENABLED\n"), Ok(true));
        assert_eq!(parse_rdma_status("Disabled."), Ok(false));
    }

    #[test]
    fn status_must_be_one_word_or_the_other() {
        for text in ["", "unknown", "enabled? disabled", "reenabled"] {
            let err = parse_rdma_status(text).expect_err(text);
            assert!(matches!(err, RdmaError::AmbiguousStatus { .. }), "{text}");
            assert!(err.to_string().contains("`enabled` or `disabled`"));
        }
    }

    #[test]
    fn devices() {
        assert_eq!(
            parse_ibv_devices(MESH_IBV),
            Ok(vec![
                "rdma_en2".into(),
                "rdma_en3".into(),
                "rdma_en4".into(),
                "rdma_en5".into()
            ])
        );
        assert_eq!(parse_ibv_devices(OFF_IBV), Ok(vec![]));
    }

    #[test]
    fn malformed_devices_are_rejected_with_what_was_expected() {
        let err = parse_ibv_devices("").expect_err("empty");
        assert_eq!(
            err,
            RdmaError::MissingHeader {
                found: String::new()
            }
        );
        let err = parse_ibv_devices("Failed to get IB devices list").expect_err("no header");
        assert!(err.to_string().contains("node GUID"));
        let header = "    device          \t   node GUID\n    ------          \t----------------\n";
        let err = parse_ibv_devices(&format!("{header}    rdma_en3\n")).expect_err("no guid");
        assert_eq!(
            err,
            RdmaError::BadRow {
                line: 3,
                found: "rdma_en3".into()
            }
        );
        let err =
            parse_ibv_devices(&format!("{header}    rdma_en3 \t xyz\n")).expect_err("bad guid");
        assert!(matches!(err, RdmaError::BadRow { line: 3, .. }));
    }
}
