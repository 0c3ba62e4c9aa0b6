//! Server lists: `HOST:PORT[,HOST:PORT...]`, as given to `--server`, `TB_SERVER` or a context.
//!
//! Parsing happens before any connection is made, so a typo is reported as such rather than as
//! a connection failure.

use std::fmt;

/// A server address or list that does not parse; the message says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AddrError(String);

type Result<T> = std::result::Result<T, AddrError>;

/// Return early with an [`AddrError`] made like `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(AddrError(format!($($arg)*)))
    };
}

/// The port `tb-controller` listens on unless told otherwise.
pub const DEFAULT_SERVER: &str = "127.0.0.1:7400";

/// One controller address, `HOST:PORT` (IPv6 hosts in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddr(String);

impl ServerAddr {
    /// The URI tonic connects to: `https` when the client verifies the controllers with a CA.
    pub fn uri(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://{}", self.0)
    }
}

impl AsRef<str> for ServerAddr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse a comma-separated list of addresses, keeping their order (it is the failover order)
/// and dropping repeats.
pub fn parse_server_list(s: &str) -> Result<Vec<ServerAddr>> {
    let mut out: Vec<ServerAddr> = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            bail!("server list {s:?}: empty address; expected HOST:PORT[,HOST:PORT...]");
        }
        let addr = parse_server(part)?;
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    Ok(out)
}

/// Parse one `HOST:PORT`, also accepting an `http://` or `https://` prefix (whether TLS is
/// used follows from the CA, [`crate::tls`]).
pub fn parse_server(s: &str) -> Result<ServerAddr> {
    let rest = if let Some(r) = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
    {
        r
    } else if s.contains("://") {
        bail!("server {s:?}: expected HOST:PORT");
    } else {
        s
    };
    let rest = rest.trim_end_matches('/');
    let Some((host, port)) = rest.rsplit_once(':') else {
        bail!("server {s:?}: expected HOST:PORT (the port is missing)");
    };
    if host.is_empty() {
        bail!("server {s:?}: expected HOST:PORT (the host is missing)");
    }
    if host.contains(['/', ' ', '\t', '@']) {
        bail!("server {s:?}: expected HOST:PORT");
    }
    // An IPv6 address must be bracketed, or its colons are ambiguous with the port's.
    let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    if host.contains(':') && !bracketed {
        bail!("server {s:?}: write IPv6 addresses in brackets, as [::1]:7400");
    }
    if (host.starts_with('[') || host.ends_with(']')) && !bracketed {
        bail!("server {s:?}: unbalanced brackets in the host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => bail!("server {s:?}: port {port:?} is not a number from 1 to 65535"),
    }
    Ok(ServerAddr(format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &str) -> Vec<String> {
        parse_server_list(s)
            .expect("valid list")
            .into_iter()
            .map(|a| a.to_string())
            .collect()
    }

    #[test]
    fn parses_lists_in_order() {
        assert_eq!(list("a:1"), ["a:1"]);
        assert_eq!(
            list("mac1:7400, mac2:7400,10.0.0.3:7401"),
            ["mac1:7400", "mac2:7400", "10.0.0.3:7401"]
        );
        assert_eq!(list("http://a:1,[::1]:7400"), ["a:1", "[::1]:7400"]);
        assert_eq!(list("a:1,b:2,a:1"), ["a:1", "b:2"]);
    }

    #[test]
    fn uri_scheme_follows_tls() {
        let a = parse_server("https://mac1:7400").expect("valid");
        assert_eq!(a.uri(false), "http://mac1:7400");
        assert_eq!(a.uri(true), "https://mac1:7400");
    }

    #[test]
    fn rejects_bad_addresses() {
        for bad in [
            "",
            "a",
            "a:",
            ":7400",
            "a:0",
            "a:70000",
            "a:b",
            "a:1,,b:2",
            "::1:7400",
            "[::1:7400",
            "ftp://a:1",
            "a b:1",
        ] {
            assert!(
                parse_server_list(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn errors_say_what_was_expected() {
        let e = parse_server_list("mac1").expect_err("no port").to_string();
        assert!(e.contains("HOST:PORT"), "{e}");
    }
}
