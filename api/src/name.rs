//! Rules for object names, namespaces and labels (DNS-1123, as in Kubernetes).
//!
//! Names end up in URLs, file names on the Macs and DNS-like keys, so they are kept to a small,
//! safe alphabet. Each check returns a message that says what would have been accepted.

use crate::bounds::Quoted;

const NAME_RULE: &str = "use lower-case letters, digits, '-' and '.'; each dot-separated part \
                         starts and ends with a letter or digit and has at most 63 characters \
                         (253 in all)";
const NAMESPACE_RULE: &str = "use lower-case letters, digits and '-', starting and ending with a \
                              letter or digit (at most 63 characters)";
const LABEL_VALUE_RULE: &str = "use letters, digits, '-', '_' and '.', starting and ending with a \
                                letter or digit (at most 63 characters), or leave it empty";
const LABEL_KEY_RULE: &str = "use a name of letters, digits, '-', '_' and '.', starting and ending \
                              with a letter or digit (at most 63 characters), optionally after a \
                              DNS prefix and '/', as in app or example.com/team";

/// An object name: a DNS-1123 subdomain (`web-1`, `llama.70b`).
pub fn validate_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("a name is required: {NAME_RULE}"));
    }
    if is_dns_subdomain(s) {
        return Ok(());
    }
    let q = Quoted(s);
    if s.len() > 253 {
        return Err(format!(
            "{q} is not a valid name: it has {} characters; a name has at most 253 in all \
             (at most 63 between dots)",
            s.len()
        ));
    }
    if let Some(part) = s.split('.').find(|p| p.len() > 63) {
        return Err(format!(
            "{q} is not a valid name: its part {:?} has {} characters; each dot-separated part of \
             a name has at most 63 (253 in all)",
            part,
            part.len()
        ));
    }
    Err(format!("{q} is not a valid name: {NAME_RULE}"))
}

/// A namespace: a DNS-1123 label (`default`, `team-a`).
pub fn validate_namespace(s: &str) -> Result<(), String> {
    if is_dns_label(s) {
        Ok(())
    } else if s.len() > 63 {
        Err(format!(
            "{} is not a valid namespace: it has {} characters; a namespace has at most 63",
            Quoted(s),
            s.len()
        ))
    } else {
        Err(format!(
            "{} is not a valid namespace: {NAMESPACE_RULE}",
            Quoted(s)
        ))
    }
}

/// A label value: empty, or up to 63 letters, digits, `-`, `_`, `.` with alphanumeric ends.
pub fn validate_label_value(s: &str) -> Result<(), String> {
    if s.is_empty() || is_qualified_name_part(s) {
        Ok(())
    } else {
        Err(format!(
            "{} is not a valid label value: {LABEL_VALUE_RULE}",
            Quoted(s)
        ))
    }
}

/// A label (or annotation) key: `name` or `prefix/name`, where the prefix is a DNS subdomain.
pub fn validate_label_key(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "{} is not a valid label key: its prefix {} must be a lower-case DNS name like \
             example.com (at most 63 characters between dots, 253 in all)",
            Quoted(s),
            Quoted(prefix)
        ));
    }
    if is_qualified_name_part(name) {
        Ok(())
    } else {
        Err(format!(
            "{} is not a valid label key: {LABEL_KEY_RULE}",
            Quoted(s)
        ))
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let end_ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && end_ok(b[0])
        && end_ok(b[b.len() - 1])
        && b.iter().all(|&c| end_ok(c) || c == b'-')
}

/// Dot-separated DNS labels, at most 253 characters in all.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The name part of a label key, or a non-empty label value.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let end_ok = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= 63
        && end_ok(b[0])
        && end_ok(b[b.len() - 1])
        && b.iter()
            .all(|&c| end_ok(c) || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let longest = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(61));
        assert_eq!(longest.len(), 253);
        for good in ["a", "web-1", "llama.70b", "0", "a-b.c-d", &longest] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        let too_long = format!("{longest}b");
        for bad in [
            "",
            "My_Job",
            "-a",
            "a-",
            "a..b",
            "a.-b",
            "UPPER",
            "a b",
            &"a".repeat(64),
            &too_long,
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(
            validate_name("My_Job").unwrap_err(),
            "\"My_Job\" is not a valid name: use lower-case letters, digits, '-' and '.'; each \
             dot-separated part starts and ends with a letter or digit and has at most 63 \
             characters (253 in all)"
        );
    }

    #[test]
    fn long_names_are_refused_with_the_rule_they_break() {
        let err = validate_name(&"a".repeat(64)).unwrap_err();
        assert!(
            err.contains("has 64 characters; each dot-separated part of a name has at most 63"),
            "{err}"
        );
        assert!(!err.contains("at most 253 in all ("), "{err}");
        let err = validate_name(&format!("{}.b", "a".repeat(63).repeat(5))).unwrap_err();
        assert!(
            err.contains("has 317 characters; a name has at most 253"),
            "{err}"
        );
        // A huge name is echoed in part, with its length.
        let err = validate_name(&"x".repeat(10 << 20)).unwrap_err();
        assert!(err.len() < 1400, "{}", err.len());
        assert!(err.contains("…(10485760 bytes)"), "{err}");
        let err = validate_namespace(&"n".repeat(64)).unwrap_err();
        assert!(
            err.contains("has 64 characters; a namespace has at most 63"),
            "{err}"
        );
        let err = validate_label_value(&"v".repeat(1 << 20)).unwrap_err();
        assert!(err.len() < 1400, "{}", err.len());
    }

    #[test]
    fn namespaces() {
        assert!(validate_namespace("default").is_ok());
        assert!(validate_namespace("team-a").is_ok());
        for bad in ["", "a.b", "Team", "-x", &"a".repeat(64)] {
            let err = validate_namespace(bad).unwrap_err();
            assert!(err.contains("is not a valid namespace"), "{err}");
        }
    }

    #[test]
    fn label_values() {
        for good in ["", "web", "v1.2_rc", "A-b", &"x".repeat(63)] {
            assert!(validate_label_value(good).is_ok(), "{good}");
        }
        for bad in ["-x", "x-", "a b", "a/b", &"x".repeat(64)] {
            assert!(validate_label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys() {
        for good in ["app", "example.com/team", "tb/rank", "App_Name", "a.b"] {
            assert!(validate_label_key(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/x",
            "Example.com/x",
            "a/b/c",
            "x/",
            "-x",
            "a b",
            &"k".repeat(64),
        ] {
            assert!(validate_label_key(bad).is_err(), "{bad}");
        }
        assert!(
            validate_label_key("Ex/x")
                .unwrap_err()
                .contains("prefix \"Ex\"")
        );
    }
}
