//! Picks the transport for a job: RDMA when the placement says both ends have it and a device
//! opens (feature `rdma`), else TCP, with one log line saying why. `TB_TRANSPORT=tcp|rdma` in the
//! environment forces a choice (a forced `rdma` that cannot open is an error, not a fallback).
//!
//! The RDMA hook is `crate::transport::rdma::open(&Endpoints) -> Result<Box<dyn Transport>,
//! TransportError>` behind the `rdma` feature.

use std::net::SocketAddr;
use std::time::Duration;

use super::tcp::{TcpConfig, TcpTransport};
use super::{Endpoints, Transport, TransportError};

/// What the caller (the placement) would like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preference {
    /// RDMA if every link of this rank has it (the placement says so) and a device opens; else TCP.
    #[default]
    Auto,
    /// The placement says every link has RDMA: try it first, fall back to TCP.
    RdmaIfAvailable,
    /// TCP only.
    Tcp,
    /// RDMA or fail.
    Rdma,
}

impl Preference {
    /// Parses `TB_TRANSPORT` values: `tcp`, `rdma`, `auto`.
    pub fn parse(s: &str) -> Result<Self, TransportError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Preference::Tcp),
            "rdma" => Ok(Preference::Rdma),
            "auto" | "" => Ok(Preference::Auto),
            other => Err(TransportError::Invalid(format!(
                "TB_TRANSPORT: expected `tcp`, `rdma` or `auto`, found `{other}`"
            ))),
        }
    }
}

/// Opens the data plane for `rank` of `world`: `peers[i]` is rank i's data address, `coordinator`
/// rank 0's bootstrap address. `TB_TRANSPORT` overrides `want`; `TB_TCP_RAILS` and
/// `TB_TCP_SOCKBUF` tune TCP ([`TcpConfig::from_env`]).
pub fn open(
    rank: usize,
    world: usize,
    peers: &[SocketAddr],
    coordinator: SocketAddr,
    want: Preference,
) -> Result<Box<dyn Transport>, TransportError> {
    let want = match std::env::var("TB_TRANSPORT") {
        Ok(v) => {
            let forced = Preference::parse(&v)?;
            if forced != Preference::Auto {
                tracing::info!(transport = %v, "TB_TRANSPORT forces the transport");
            }
            if forced == Preference::Auto {
                want
            } else {
                forced
            }
        }
        Err(_) => want,
    };
    let ep = Endpoints {
        rank,
        world,
        peers: peers.to_vec(),
        coordinator,
        connect_timeout: Duration::from_secs(60),
    };
    open_endpoints(&ep, want, TcpConfig::from_env())
}

/// [`open`] with explicit endpoints and TCP settings, and no look at the environment.
pub fn open_endpoints(
    ep: &Endpoints,
    want: Preference,
    tcp: TcpConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    let why_tcp = match want {
        Preference::Tcp => "TCP requested".to_string(),
        Preference::Auto => "the placement does not report RDMA on every link".to_string(),
        Preference::Rdma | Preference::RdmaIfAvailable => match open_rdma(ep) {
            Ok(t) => {
                tracing::info!(rank = ep.rank, world = ep.world, "data plane: RDMA");
                return Ok(t);
            }
            Err(e) if want == Preference::Rdma => return Err(e),
            Err(e) => format!("RDMA did not open: {e}"),
        },
    };
    tracing::info!(rank = ep.rank, world = ep.world, reason = %why_tcp, "data plane: TCP");
    Ok(Box::new(TcpTransport::open(ep, tcp)?))
}

#[cfg(feature = "rdma")]
fn open_rdma(ep: &Endpoints) -> Result<Box<dyn Transport>, TransportError> {
    crate::transport::rdma::open(ep)
}

#[cfg(not(feature = "rdma"))]
fn open_rdma(_ep: &Endpoints) -> Result<Box<dyn Transport>, TransportError> {
    Err(TransportError::Unsupported(
        "this tb-nodelet was built without the `rdma` feature".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tb_transport() {
        assert_eq!(Preference::parse("TCP").ok(), Some(Preference::Tcp));
        assert_eq!(Preference::parse("rdma").ok(), Some(Preference::Rdma));
        assert_eq!(Preference::parse("").ok(), Some(Preference::Auto));
        let err = Preference::parse("ib").map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("`ib`"), "{err}");
    }

    #[cfg(not(feature = "rdma"))]
    #[test]
    fn forced_rdma_without_the_feature_is_an_error_not_a_fallback() {
        let ep = Endpoints {
            rank: 0,
            world: 1,
            peers: vec!["127.0.0.1:0".parse().unwrap()],
            coordinator: "127.0.0.1:9".parse().unwrap(),
            connect_timeout: Duration::from_secs(1),
        };
        let e = open_endpoints(&ep, Preference::Rdma, TcpConfig::default())
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, TransportError::Unsupported(_)), "{e}");
    }
}
