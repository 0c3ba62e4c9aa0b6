//! Byte quantities written the Kubernetes way: `64Gi`, `512G`, `1.5Ti`, `1024`.
//!
//! A [`Quantity`] keeps the text the user wrote, so that what they applied is what they read back,
//! next to the number of bytes it means, which is what the scheduler compares.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::bounds::Quoted;

/// What every "this is not a quantity" error says, so users learn the syntax from the message.
const EXPECTED: &str = "a quantity like 64Gi, 512G or 1.5Ti";

/// Suffixes and their multipliers. Binary ones come first so that `from_bytes` can pick from them.
const BINARY: [(&str, u64); 6] = [
    ("Ei", 1 << 60),
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
];
const DECIMAL: [(&str, u64); 6] = [
    ("E", 1_000_000_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("T", 1_000_000_000_000),
    ("G", 1_000_000_000),
    ("M", 1_000_000),
    ("k", 1_000),
];

/// More decimal places than this cannot matter for a byte count and would overflow the arithmetic.
const MAX_FRACTION_DIGITS: usize = 18;

/// An amount of memory or storage in bytes, with the text it was written as.
#[derive(Debug, Clone)]
pub struct Quantity {
    bytes: u64,
    text: String,
}

/// Why a string is not a [`Quantity`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("expected {EXPECTED}, got {}", Quoted(.0))]
    Invalid(String),
    #[error("quantity {} is negative; expected {EXPECTED}", Quoted(.0))]
    Negative(String),
    #[error("quantity {} is too large (at most 16Ei)", Quoted(.0))]
    TooLarge(String),
    #[error(
        "quantity {} is not a whole number of bytes; memory is counted in whole bytes (write 1 or more, or a unit such as 512Mi)",
        Quoted(.0)
    )]
    Fractional(String),
}

impl Quantity {
    /// Parses `64Gi`, `512G`, `1.5Ti`, `100Mi`, `1k`, `1024`, `0`. A quantity that is not a whole
    /// number of bytes (`0.5`, `1.1Ki`) is refused; Kubernetes would round it up silently.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let text = s.trim();
        if text.starts_with('-') {
            return Err(QuantityError::Negative(text.to_string()));
        }
        let (number, multiplier) = split_suffix(text);
        let (whole, fraction) = match number.split_once('.') {
            Some((w, f)) => (w, f),
            None => (number, ""),
        };
        let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        let well_formed = !(whole.is_empty() && fraction.is_empty())
            && digits_only(whole)
            && digits_only(fraction)
            && !(number.contains('.') && fraction.is_empty())
            && fraction.len() <= MAX_FRACTION_DIGITS;
        if !well_formed {
            return Err(QuantityError::Invalid(text.to_string()));
        }
        let too_large = || QuantityError::TooLarge(text.to_string());
        // u128 holds (2^64 - 1) * 2^60 and 10^18 * 2^60 without overflow, so only the final
        // conversion to u64 can fail once the whole part fits in u64.
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse::<u64>().map_err(|_| too_large())?.into()
        };
        let multiplier = u128::from(multiplier);
        let mut total = whole * multiplier;
        if !fraction.is_empty() {
            let scale = 10u128.pow(fraction.len() as u32);
            let numerator: u128 = fraction.parse::<u128>().map_err(|_| too_large())? * multiplier;
            // Half a byte means nothing: refuse rather than silently round.
            if !numerator.is_multiple_of(scale) {
                return Err(QuantityError::Fractional(text.to_string()));
            }
            total += numerator / scale;
        }
        let bytes = u64::try_from(total).map_err(|_| too_large())?;
        Ok(Quantity {
            bytes,
            text: text.to_string(),
        })
    }

    /// A quantity of exactly `bytes`, written with the largest binary suffix that divides it
    /// (`1073741824` → `1Gi`, `1536` → `1536`).
    pub fn from_bytes(bytes: u64) -> Quantity {
        let text = BINARY
            .iter()
            .find(|(_, m)| bytes != 0 && bytes.is_multiple_of(*m))
            .map(|(suffix, m)| format!("{}{suffix}", bytes / m))
            .unwrap_or_else(|| bytes.to_string());
        Quantity { bytes, text }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The text as written (trimmed), e.g. `1.5Ti`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Splits `64Gi` into (`64`, 2^30). A number without a suffix counts bytes.
fn split_suffix(text: &str) -> (&str, u64) {
    for (suffix, multiplier) in BINARY.iter().chain(DECIMAL.iter()) {
        if let Some(number) = text.strip_suffix(suffix) {
            return (number, *multiplier);
        }
    }
    (text, 1)
}

impl Default for Quantity {
    fn default() -> Self {
        Quantity::from_bytes(0)
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// Equality, order and hash follow the byte count: `1Gi` and `1024Mi` are the same amount.
impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.bytes.cmp(&other.bytes)
    }
}
impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bytes.hash(state);
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

/// In a schema (and `tbctl explain`), a quantity is a string of format `quantity`.
impl schemars::JsonSchema for Quantity {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "format": "quantity"})
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

/// Errors are raised inside the visitor, so that YAML errors point at the offending value.
struct QuantityVisitor;

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        Quantity::parse(v).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        Ok(Quantity {
            bytes: v,
            text: v.to_string(),
        })
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::custom(QuantityError::Negative(v.to_string()))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
        if !v.is_finite() {
            return Err(E::custom(QuantityError::Invalid(v.to_string())));
        }
        self.visit_str(&v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        const KI: u64 = 1 << 10;
        const MI: u64 = 1 << 20;
        const GI: u64 = 1 << 30;
        const TI: u64 = 1 << 40;
        let table: &[(&str, u64)] = &[
            ("0", 0),
            ("1024", 1024),
            ("1k", 1000),
            ("1Ki", KI),
            ("100Mi", 100 * MI),
            ("64Gi", 64 * GI),
            ("512G", 512_000_000_000),
            ("1.5Ti", TI + TI / 2),
            ("0.5Gi", GI / 2),
            (".5Gi", GI / 2),
            ("1.5k", 1500),
            ("2M", 2_000_000),
            ("3T", 3_000_000_000_000),
            ("1Pi", 1 << 50),
            ("2P", 2_000_000_000_000_000),
            ("15Ei", 15 << 60),
            ("1E", 1_000_000_000_000_000_000),
            ("18446744073709551615", u64::MAX),
            (" 8Gi ", 8 * GI),
        ];
        for (text, bytes) in table {
            let q = Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(q.bytes(), *bytes, "{text}");
            assert_eq!(q.to_string(), text.trim());
        }
    }

    #[test]
    fn rejects_bad_input_with_a_clear_message() {
        for bad in [
            "", "12XB", "Gi", "1.Gi", "1..5Gi", "1 Gi", "64GB", "1m", "1gi", "abc", "+1", "1e3",
        ] {
            let err = Quantity::parse(bad).expect_err(bad);
            assert!(matches!(err, QuantityError::Invalid(_)), "{bad}: {err:?}");
        }
        assert_eq!(
            Quantity::parse("12XB").unwrap_err().to_string(),
            r#"expected a quantity like 64Gi, 512G or 1.5Ti, got "12XB""#
        );
        assert!(matches!(
            Quantity::parse("-1Gi"),
            Err(QuantityError::Negative(_))
        ));
        for big in [
            "16Ei",
            "18446744073709551616",
            "99999999999999999999999Ki",
            "20E",
        ] {
            assert!(
                matches!(Quantity::parse(big), Err(QuantityError::TooLarge(_))),
                "{big}"
            );
        }
        assert!(Quantity::parse("1.0000000000000000001Gi").is_err());
        for fractional in ["0.5", "1.1Ki", "0.0001k", ".5"] {
            let err = Quantity::parse(fractional).expect_err(fractional);
            assert!(matches!(err, QuantityError::Fractional(_)), "{fractional}");
            assert!(
                err.to_string().contains("is not a whole number of bytes"),
                "{err}"
            );
        }
        // YAML reads 0.5 as a number.
        let err = serde_yaml::from_str::<Quantity>("0.5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a whole number of bytes"), "{err}");
    }

    #[test]
    fn from_bytes_uses_the_largest_exact_binary_suffix() {
        assert_eq!(Quantity::from_bytes(0).to_string(), "0");
        assert_eq!(Quantity::from_bytes(1536).to_string(), "1536");
        assert_eq!(Quantity::from_bytes(2048).to_string(), "2Ki");
        assert_eq!(Quantity::from_bytes(3 << 30).to_string(), "3Gi");
        assert_eq!(Quantity::from_bytes(1 << 40).to_string(), "1Ti");
        assert_eq!(Quantity::from_bytes(1_000_000).to_string(), "1000000");
        assert_eq!(Quantity::from_bytes(u64::MAX).bytes(), u64::MAX);
    }

    #[test]
    fn equality_compares_bytes() {
        assert_eq!(
            Quantity::parse("1Gi").unwrap(),
            Quantity::parse("1024Mi").unwrap()
        );
        assert!(Quantity::parse("1G").unwrap() < Quantity::parse("1Gi").unwrap());
    }

    #[test]
    fn serde_keeps_the_original_text() {
        let q: Quantity = serde_json::from_str(r#""1.5Ti""#).unwrap();
        assert_eq!(serde_json::to_string(&q).unwrap(), r#""1.5Ti""#);
        let q: Quantity = serde_json::from_str("1024").unwrap();
        assert_eq!(q.bytes(), 1024);
        assert_eq!(serde_json::to_string(&q).unwrap(), r#""1024""#);
        let q: Quantity = serde_yaml::from_str("64Gi").unwrap();
        assert_eq!(q.bytes(), 64 << 30);
        let q: Quantity = serde_yaml::from_str("2048").unwrap();
        assert_eq!(q.to_string(), "2048");
    }

    #[test]
    fn serde_rejects_bad_input() {
        let err = serde_json::from_str::<Quantity>(r#""12XB""#)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(r#"expected a quantity like 64Gi, 512G or 1.5Ti, got "12XB""#),
            "{err}"
        );
        let err = serde_json::from_str::<Quantity>("-5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("negative"), "{err}");
        let err = serde_json::from_str::<Quantity>("true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a quantity like 64Gi"), "{err}");
    }
}
