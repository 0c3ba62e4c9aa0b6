//! `Timestamp`: a point in time in an api object (creationTimestamp, a condition's
//! lastTransitionTime, an event's times, a job's startTime, a schedule's lastScheduleTime...).
//!
//! On the wire (stored JSON, gRPC, YAML) it is an RFC 3339 string, as it always was: tb writes
//! UTC with milliseconds (`2026-06-01T12:00:00.000Z`). A parsed timestamp keeps the text it was
//! read from and writes it back unchanged, so stored state, manifests and the formats clients
//! see are byte-identical to what they were when these fields were plain strings (and a
//! `...T12:00:00Z` written by hand stays that). Reading garbage is an error naming the value.
//!
//! Fields that may be unset are `Option<Timestamp>` with [`optional`] as their serde `with`:
//! it reads `""` and `null` as unset and writes unset as `""` (what the string fields held).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time, RFC 3339 on the wire. Ordered (and equal) by instant first, then by text.
#[derive(Clone)]
pub struct Timestamp {
    at: DateTime<Utc>,
    text: String,
}

/// A string that is not an RFC 3339 time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "expected an RFC 3339 time such as 2026-06-01T12:00:00Z, got {}: {reason}",
    crate::bounds::Quoted(.text)
)]
pub struct TimestampError {
    text: String,
    reason: String,
}

impl Timestamp {
    /// `at`, to the millisecond, written as tb writes times: UTC, milliseconds, `Z`.
    pub fn from_datetime(at: DateTime<Utc>) -> Timestamp {
        let at = at.trunc_subsecs(3);
        Timestamp {
            text: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            at,
        }
    }

    /// The current time.
    pub fn now() -> Timestamp {
        Timestamp::from_datetime(Utc::now())
    }

    /// Reads an RFC 3339 time (any offset; the instant is kept in UTC, the text as given).
    pub fn parse(text: &str) -> Result<Timestamp, TimestampError> {
        let at = DateTime::parse_from_rfc3339(text).map_err(|e| TimestampError {
            text: text.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Timestamp {
            at: at.with_timezone(&Utc),
            text: text.to_string(),
        })
    }

    /// The instant.
    pub fn at(&self) -> DateTime<Utc> {
        self.at
    }

    /// The RFC 3339 text, as stored and sent.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl From<DateTime<Utc>> for Timestamp {
    fn from(at: DateTime<Utc>) -> Timestamp {
        Timestamp::from_datetime(at)
    }
}

impl FromStr for Timestamp {
    type Err = TimestampError;
    fn from_str(s: &str) -> Result<Timestamp, TimestampError> {
        Timestamp::parse(s)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.text)
    }
}

impl PartialEq for Timestamp {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.text == other.text
    }
}

impl Eq for Timestamp {}

impl Hash for Timestamp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.at.hash(state);
        self.text.hash(state);
    }
}

impl PartialOrd for Timestamp {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timestamp {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at
            .cmp(&other.at)
            .then_with(|| self.text.cmp(&other.text))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match deserializer.deserialize_str(TimestampVisitor)? {
            Some(t) => Ok(t),
            None => Err(de::Error::custom(
                "expected an RFC 3339 time such as 2026-06-01T12:00:00Z, got an empty string",
            )),
        }
    }
}

/// In a schema (and `tbctl explain`), a timestamp is a string of format `date-time`.
impl schemars::JsonSchema for Timestamp {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "format": "date-time"})
    }
}

/// Reads a timestamp string; the empty string is None. Errors are raised inside the visitor,
/// so that YAML errors point at the offending value.
struct TimestampVisitor;

impl<'de> Visitor<'de> for TimestampVisitor {
    type Value = Option<Timestamp>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an RFC 3339 time such as 2026-06-01T12:00:00Z")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Option<Timestamp>, E> {
        if s.is_empty() {
            return Ok(None);
        }
        Timestamp::parse(s).map(Some).map_err(E::custom)
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<Timestamp>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<Timestamp>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Timestamp>, D::Error> {
        d.deserialize_str(TimestampVisitor)
    }
}

/// serde `with` for `Option<Timestamp>` fields: `""` and `null` read as None, None writes `""`.
pub mod optional {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.as_ref().map_or("", Timestamp::as_str))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        d.deserialize_option(TimestampVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(default, with = "optional", skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
        #[serde(default, with = "optional")]
        always: Option<Timestamp>,
    }

    /// Strings tb has stored or been sent (its own millisecond UTC stamps, hand-written
    /// manifests, chrono's default form) come back byte for byte.
    #[test]
    fn existing_strings_round_trip_unchanged() {
        for text in [
            "2026-06-01T12:00:00.000Z",
            "2026-12-02T13:21:14.798Z",
            "2026-01-01T02:00:00Z",
            "2025-06-01T12:00:00+00:00",
            "2026-03-04T05:06:07.123456789+00:00",
            "2026-06-01T14:00:00+02:00",
        ] {
            let t: Timestamp = serde_json::from_value(json!(text)).unwrap();
            assert_eq!(serde_json::to_value(&t).unwrap(), json!(text));
            assert_eq!(serde_yaml::to_string(&t).unwrap().trim(), text);
            let y: Timestamp = serde_yaml::from_str(text).unwrap();
            assert_eq!(y, t);
        }
    }

    #[test]
    fn written_as_utc_milliseconds() {
        let at = DateTime::parse_from_rfc3339("2026-06-01T14:00:00.123456+02:00")
            .unwrap()
            .with_timezone(&Utc);
        let t = Timestamp::from_datetime(at);
        assert_eq!(t.as_str(), "2026-06-01T12:00:00.123Z");
        assert_eq!(Timestamp::parse(t.as_str()).unwrap(), t);
        assert_eq!(
            Timestamp::parse("2026-06-01T14:00:00+02:00").unwrap().at(),
            Timestamp::parse("2026-06-01T12:00:00Z").unwrap().at()
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = Timestamp::parse("yesterday").unwrap_err().to_string();
        assert!(err.contains("RFC 3339"), "{err}");
        assert!(err.contains("yesterday"), "{err}");
        let err = serde_json::from_value::<Holder>(json!({"at": "2026-13-01T00:00:00Z"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("2026-13-01T00:00:00Z"), "{err}");
        assert!(serde_json::from_value::<Holder>(json!({"at": 5})).is_err());
        assert!(serde_json::from_value::<Timestamp>(json!("")).is_err());
    }

    #[test]
    fn unset_reads_from_empty_or_null_and_writes_as_before() {
        let h: Holder = serde_json::from_value(json!({"at": "", "always": null})).unwrap();
        assert_eq!(
            h,
            Holder {
                at: None,
                always: None
            }
        );
        assert_eq!(serde_json::to_string(&h).unwrap(), r#"{"always":""}"#);
        let h: Holder = serde_yaml::from_str("at:\nalways: ''\n").unwrap();
        assert_eq!(h.at, None);
        let h: Holder = serde_json::from_value(json!({"at": "2026-01-01T02:00:00Z"})).unwrap();
        assert_eq!(
            serde_json::to_string(&h).unwrap(),
            r#"{"at":"2026-01-01T02:00:00Z","always":""}"#
        );
    }

    /// A stored object, an event spec and a condition list read and write back byte for byte,
    /// set and unset times alike.
    #[test]
    fn api_objects_keep_their_bytes() {
        let stored = r#"{"apiVersion":"tb/v1","kind":"TrainingJob","metadata":{"name":"t","namespace":"default","uid":"u","resourceVersion":7,"generation":1,"creationTimestamp":"2026-01-01T02:00:00Z"},"spec":{"command":["x"]},"status":{"conditions":[{"lastTransitionTime":"2026-01-01T02:00:01.250Z","status":"True","type":"Ready"}],"startTime":"2026-01-01T02:00:00.999Z"}}"#;
        let obj = crate::Object::from_json(stored).unwrap();
        assert_eq!(obj.to_json(), stored);
        let status = crate::status::JobStatus::from_value(&obj.status);
        assert_eq!(
            status.start_time.as_ref().map(Timestamp::as_str),
            Some("2026-01-01T02:00:00.999Z")
        );
        let yaml = crate::to_yaml(&obj);
        assert!(
            yaml.contains("creationTimestamp: 2026-01-01T02:00:00Z"),
            "{yaml}"
        );

        let event = crate::specs::EventSpec::default();
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["firstTimestamp"], json!(""));
        assert_eq!(json["lastTimestamp"], json!(""));
        let back: crate::specs::EventSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);

        let condition = crate::Condition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&condition).unwrap(),
            r#"{"type":"Ready","status":"True"}"#
        );
    }

    /// A manifest with a bad time says where and what was expected.
    #[test]
    fn a_bad_time_in_a_manifest_names_the_field() {
        let yaml = "apiVersion: tb/v1\nkind: Node\nmetadata:\n  name: m1\n  creationTimestamp: yesterday\n";
        let err = crate::load_str("node.yaml", yaml).unwrap_err().to_string();
        assert!(err.contains("creationTimestamp"), "{err}");
        assert!(err.contains("RFC 3339"), "{err}");
        assert!(err.contains("yesterday"), "{err}");
        assert!(err.starts_with("node.yaml:5:"), "{err}");
    }

    #[test]
    fn ordered_by_instant() {
        let early = Timestamp::parse("2026-06-01T14:00:00+02:00").unwrap();
        let late = Timestamp::parse("2026-06-01T12:00:01Z").unwrap();
        assert!(early < late);
    }
}
