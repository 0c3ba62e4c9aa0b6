//! The controller join token: what `tb-controller --join URL` presents to become a member.
//!
//! Format (one line, ASCII): `tbmember1.<CAHASH>.<SECRET>`
//!
//! * `tbmember1` — what the token is and its version (distinct from a nodelet's `tbjoin-…`);
//! * `CAHASH` — 64 lowercase hex digits: the SHA-256 of the cluster CA certificate's DER. The
//!   joiner trusts the controller at URL only if it presents a CA with this hash (as k3s pins
//!   its CA), so the token is never sent to anyone else;
//! * `SECRET` — 64 lowercase hex digits: HMAC-SHA256(cluster secret, `tb member join v1` + SALT),
//!   SALT being empty until the token is first rotated, then a random value kept in the
//!   replicated store. It is not the cluster secret, and nothing secret is stored to verify it:
//!   every member holds the cluster secret and derives the same value. Holding the token gets a
//!   controller the CA key and the cluster secret, so it is as sensitive as they are (admins
//!   only, files 0600).

use sha2::{Digest, Sha256};

/// The prefix (and version) of a controller join token.
pub const PREFIX: &str = "tbmember1";
/// The prefix of a nodelet's join token, named in the error for a mix-up.
const NODELET_PREFIX: &str = "tbjoin-";
/// The file a controller keeps its cluster's join token in (mode 0600).
pub const TOKEN_FILE: &str = "join.token";
/// The longest token accepted anywhere (a real one is 139 bytes).
pub const MAX_TOKEN_LEN: usize = 256;
/// What the secret is derived for; changing it changes every cluster's token.
const SECRET_CONTEXT: &[u8] = b"tb member join v1";

/// A parsed token.
#[derive(Clone, PartialEq, Eq)]
pub struct MemberToken {
    /// SHA-256 of the CA certificate's DER, lowercase hex.
    pub ca_hash: String,
    /// The secret part, lowercase hex.
    pub secret: String,
}

impl std::fmt::Debug for MemberToken {
    // The secret never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberToken")
            .field("ca_hash", &self.ca_hash)
            .finish_non_exhaustive()
    }
}

/// Why a string is not a controller join token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the token is longer than {MAX_TOKEN_LEN} bytes")]
    TooLong,
    #[error(
        "this is a nodelet's join token (tbjoin-…, from `tbctl token create`); a controller \
         joins with the cluster's member token: `tbctl cluster join-token`, or DATA_DIR/{TOKEN_FILE} \
         of a member"
    )]
    NodeletToken,
    #[error("expected {PREFIX}.CAHASH.SECRET (three parts separated by dots), got {0} part(s)")]
    Parts(usize),
    #[error("unknown token version {0:?}: expected {PREFIX}")]
    Version(String),
    #[error("the {0} part: expected 64 lowercase hex digits")]
    Hex(&'static str),
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl MemberToken {
    /// Parse a token (surrounding whitespace, such as a file's newline, is ignored).
    pub fn parse(text: &str) -> Result<MemberToken, TokenError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TokenError::Empty);
        }
        if text.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong);
        }
        if text.starts_with(NODELET_PREFIX) {
            return Err(TokenError::NodeletToken);
        }
        let parts: Vec<&str> = text.split('.').collect();
        let [version, ca_hash, secret] = parts[..] else {
            return Err(TokenError::Parts(parts.len()));
        };
        if version != PREFIX {
            return Err(TokenError::Version(tb_api::bounds::excerpt(version)));
        }
        if !is_hex64(ca_hash) {
            return Err(TokenError::Hex("CAHASH"));
        }
        if !is_hex64(secret) {
            return Err(TokenError::Hex("SECRET"));
        }
        Ok(MemberToken {
            ca_hash: ca_hash.to_string(),
            secret: secret.to_string(),
        })
    }

    /// The token of a cluster with this CA certificate (PEM), cluster secret and salt (the
    /// store's `member_join_salt`).
    pub fn for_cluster(
        ca_cert_pem: &str,
        cluster_secret: &str,
        salt: &str,
    ) -> anyhow::Result<MemberToken> {
        Ok(MemberToken {
            ca_hash: ca_hash(ca_cert_pem)?,
            secret: derive_secret(cluster_secret, salt),
        })
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    pub fn matches(&self, presented: &MemberToken) -> bool {
        let a = format!("{}.{}", self.ca_hash, self.secret);
        let b = format!("{}.{}", presented.ca_hash, presented.secret);
        tb_api::secret::constant_time_eq(a.as_bytes(), b.as_bytes())
    }
}

impl std::fmt::Display for MemberToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}.{}.{}", self.ca_hash, self.secret)
    }
}

/// SHA-256 of a PEM certificate's DER, lowercase hex.
pub fn ca_hash(cert_pem: &str) -> anyhow::Result<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("not a PEM certificate: {e}"))?;
    Ok(hex::encode(Sha256::digest(&pem.contents)))
}

/// HMAC-SHA256 (RFC 2104) of the join context and salt under the cluster secret, hex.
fn derive_secret(cluster_secret: &str, salt: &str) -> String {
    let message = [SECRET_CONTEXT, salt.as_bytes()].concat();
    hex::encode(crate::auth::hmac_sha256(
        cluster_secret.as_bytes(),
        &message,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::hmac_sha256;

    const HASH: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const SECRET: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    #[test]
    fn a_token_round_trips() {
        let text = format!("{PREFIX}.{HASH}.{SECRET}");
        let t = MemberToken::parse(&format!("  {text}\n")).expect("a valid token");
        assert_eq!(t.ca_hash, HASH);
        assert_eq!(t.secret, SECRET);
        assert_eq!(t.to_string(), text);
        assert!(t.matches(&t.clone()));
        // The secret stays out of debug output.
        assert!(!format!("{t:?}").contains(SECRET));
    }

    #[test]
    fn malformed_tokens_say_what_is_wrong() {
        let cases: Vec<(String, TokenError)> = vec![
            ("".into(), TokenError::Empty),
            (" \n".into(), TokenError::Empty),
            ("x".repeat(MAX_TOKEN_LEN + 1), TokenError::TooLong),
            (format!("tbjoin-{SECRET}"), TokenError::NodeletToken),
            (format!("{PREFIX}.{HASH}"), TokenError::Parts(2)),
            (format!("{PREFIX}.{HASH}.{SECRET}.x"), TokenError::Parts(4)),
            (
                format!("tbmember2.{HASH}.{SECRET}"),
                TokenError::Version("tbmember2".into()),
            ),
            (
                format!("{PREFIX}.{}.{SECRET}", &HASH[1..]),
                TokenError::Hex("CAHASH"),
            ),
            (
                format!("{PREFIX}.{}.{SECRET}", HASH.to_uppercase()),
                TokenError::Hex("CAHASH"),
            ),
            (
                format!("{PREFIX}.{HASH}.{}z", &SECRET[1..]),
                TokenError::Hex("SECRET"),
            ),
            (
                format!("{PREFIX}.{HASH}.tbcluster-{SECRET}"),
                TokenError::Hex("SECRET"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(MemberToken::parse(&text), Err(want), "{text:?}");
        }
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than a block is hashed first.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            hex::encode(mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn the_token_follows_the_ca_and_the_secret_and_reveals_neither() {
        let ca = crate::tls::Ca::create().expect("a CA");
        let other = crate::tls::Ca::create().expect("another CA");
        let a = MemberToken::for_cluster(ca.cert_pem(), "tbcluster-aaaa", "").expect("a token");
        let b = MemberToken::for_cluster(other.cert_pem(), "tbcluster-aaaa", "").expect("a token");
        let c = MemberToken::for_cluster(ca.cert_pem(), "tbcluster-bbbb", "").expect("a token");
        let rotated =
            MemberToken::for_cluster(ca.cert_pem(), "tbcluster-aaaa", "1").expect("a token");
        assert_ne!(a.ca_hash, b.ca_hash);
        assert_eq!(a.secret, b.secret);
        assert_ne!(a.secret, c.secret);
        assert_eq!(rotated.ca_hash, a.ca_hash);
        assert_ne!(rotated.secret, a.secret);
        assert!(!a.matches(&b) && !a.matches(&c) && !a.matches(&rotated));
        assert!(!a.to_string().contains("tbcluster-aaaa"));
        assert_eq!(MemberToken::parse(&a.to_string()), Ok(a));
    }
}
