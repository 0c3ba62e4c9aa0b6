//! Label selectors in kubectl's syntax, for `tbctl get -l` and for watches:
//! `app=web,tier!=db,env in (a,b),env notin (c),has-key,!no-key`.

use std::collections::BTreeMap;
use std::fmt;

use crate::bounds::Quoted;
use crate::name::{validate_label_key, validate_label_value};

/// One condition on a set of labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    /// True when the label is absent, too.
    NotEquals(String, String),
    In(String, Vec<String>),
    /// True when the label is absent, too.
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// Every requirement must hold; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let requirements = split_top_level(text)
            .map_err(|m| format!("invalid selector {}: {m}", Quoted(text)))?
            .into_iter()
            .filter(|part| !part.trim().is_empty())
            .map(|part| {
                parse_requirement(part.trim())
                    .map_err(|m| format!("invalid selector {}: {m}", Quoted(text)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LabelSelector { requirements })
    }

    /// The selector `k1=v1,k2=v2` for a map of labels.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> LabelSelector {
        LabelSelector {
            requirements: labels
                .iter()
                .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => !labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// Splits at commas that are not inside `( )`.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err("nested parentheses".to_string()),
            ')' if depth == 1 => depth = 0,
            ')' => return Err("')' without '('".to_string()),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'(' without ')'".to_string());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    for (op, ctor) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            return Ok(ctor(key_of(key.trim())?, value_of(value.trim())?));
        }
    }
    if let Some((head, rest)) = part.split_once('(') {
        let words: Vec<&str> = head.split_whitespace().collect();
        let values = rest
            .strip_suffix(')')
            .ok_or_else(|| {
                format!(
                    "{}: expected the values in parentheses at the end",
                    Quoted(part)
                )
            })?
            .split(',')
            .map(|v| value_of(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        return match words.as_slice() {
            [key, "in"] => Ok(Requirement::In(key_of(key)?, values)),
            [key, "notin"] => Ok(Requirement::NotIn(key_of(key)?, values)),
            _ => Err(format!(
                "{}: expected KEY in (A,B) or KEY notin (A,B)",
                Quoted(part)
            )),
        };
    }
    if part.split_whitespace().count() > 1 {
        return Err(format!(
            "{}: expected KEY=VALUE, KEY!=VALUE, KEY in (A,B), KEY notin (A,B), KEY or !KEY",
            Quoted(part)
        ));
    }
    Ok(Requirement::Exists(key_of(part)?))
}

fn key_of(key: &str) -> Result<String, String> {
    validate_label_key(key)?;
    Ok(key.to_string())
}

fn value_of(value: &str) -> Result<String, String> {
    validate_label_value(value)?;
    Ok(value.to_string())
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Equals(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEquals(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(",")),
            Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(",")),
            Requirement::Exists(k) => f.write_str(k),
            Requirement::DoesNotExist(k) => write!(f, "!{k}"),
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_form() {
        let s =
            LabelSelector::parse("app=web,tier!=db,env in (a, b),env notin (c),has-key,!no-key")
                .unwrap();
        assert_eq!(
            s.requirements,
            vec![
                Requirement::Equals("app".into(), "web".into()),
                Requirement::NotEquals("tier".into(), "db".into()),
                Requirement::In("env".into(), vec!["a".into(), "b".into()]),
                Requirement::NotIn("env".into(), vec!["c".into()]),
                Requirement::Exists("has-key".into()),
                Requirement::DoesNotExist("no-key".into()),
            ]
        );
        assert_eq!(
            s.to_string(),
            "app=web,tier!=db,env in (a,b),env notin (c),has-key,!no-key"
        );
        assert_eq!(LabelSelector::parse("a==b").unwrap().to_string(), "a=b");
        assert_eq!(
            LabelSelector::parse("example.com/team=ml")
                .unwrap()
                .requirements
                .len(),
            1
        );
        assert_eq!(
            LabelSelector::parse("env in(a)").unwrap().to_string(),
            "env in (a)"
        );
    }

    #[test]
    fn matches_like_kubectl() {
        let l = labels(&[("app", "web"), ("env", "a"), ("has-key", "")]);
        let yes = |s: &str| LabelSelector::parse(s).unwrap().matches(&l);
        assert!(yes(""));
        assert!(yes("app=web"));
        assert!(!yes("app=db"));
        assert!(yes("tier!=db")); // absent label counts as "not equal"
        assert!(!yes("app!=web"));
        assert!(yes("env in (a,b)"));
        assert!(!yes("env in (c)"));
        assert!(yes("env notin (c)"));
        assert!(yes("missing notin (c)"));
        assert!(!yes("env notin (a)"));
        assert!(yes("has-key"));
        assert!(!yes("!has-key"));
        assert!(yes("!no-key"));
        assert!(yes("app=web,env in (a),!no-key"));
        assert!(!yes("app=web,env in (b)"));
    }

    #[test]
    fn rejects_bad_selectors() {
        for bad in [
            "a b",
            "env in (a",
            "env in a)",
            "env between (a)",
            "=x",
            "a=b c",
            "Bad Key=x",
            "env in ((a))",
            "!",
        ] {
            let err = LabelSelector::parse(bad).expect_err(bad);
            assert!(err.starts_with("invalid selector"), "{bad}: {err}");
        }
    }
}
