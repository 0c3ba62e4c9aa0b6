//! Why a TLS connection failed, read from the text of an error chain (rustls and hyper causes
//! reach tbctl and the nodelet only as text through tonic). Each side words its advice itself;
//! the reading lives here once.

/// A connection failure TLS explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The peer's certificate is not signed by the CA we trust.
    UnknownIssuer,
    /// The peer's certificate does not name the address dialled.
    NameMismatch,
    /// A certificate has expired.
    Expired,
    /// We speak TLS; the peer does not (a controller started with `--insecure`).
    PeerNotTls,
    /// We speak plain TCP; the peer wants TLS.
    PeerWantsTls,
}

/// What `chain` (an error and its sources, joined) says, when we connected with TLS
/// (`with_tls`) or without.
pub fn classify(chain: &str, with_tls: bool) -> Option<TlsFailure> {
    let lower = chain.to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if with_tls {
        if has(&["unknownissuer", "unknown issuer"]) {
            Some(TlsFailure::UnknownIssuer)
        } else if has(&["notvalidforname", "not valid for name"]) {
            Some(TlsFailure::NameMismatch)
        } else if has(&["expired"]) {
            Some(TlsFailure::Expired)
        } else if has(&[
            "corrupt message",
            "invalidcontenttype",
            "invalid content type",
        ]) {
            Some(TlsFailure::PeerNotTls)
        } else {
            None
        }
    } else if has(&[
        "h2 protocol error",
        "http2 error",
        "connection reset",
        "broken pipe",
        "transport error",
    ]) && !has(&["refused", "timed out", "dns error"])
    {
        // What a TLS server makes of a plain HTTP/2 client: a broken connection.
        Some(TlsFailure::PeerWantsTls)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_read_from_the_chain() {
        let c = |s, tls| classify(s, tls);
        assert_eq!(
            c("invalid peer certificate: UnknownIssuer", true),
            Some(TlsFailure::UnknownIssuer)
        );
        assert_eq!(
            c("certificate not valid for name \"x\"", true),
            Some(TlsFailure::NameMismatch)
        );
        assert_eq!(
            c("received corrupt message", true),
            Some(TlsFailure::PeerNotTls)
        );
        assert_eq!(
            c("h2 protocol error: http2 error", false),
            Some(TlsFailure::PeerWantsTls)
        );
        assert_eq!(c("transport error: connection refused", false), None);
        assert_eq!(c("h2 protocol error", true), None);
    }
}
