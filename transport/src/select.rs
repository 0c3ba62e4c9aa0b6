//! Picks the transport for a job: RDMA when the placement says both ends have it and a device
//! opens (feature `rdma`), else TCP, with one log line saying why. `TB_TRANSPORT=tcp|rdma` in the
//! environment forces a choice (a forced `rdma` that cannot open is an error, not a fallback).
//!
//! The ranks must all make the same choice, or they would wait for each other on different
//! transports. So when RDMA is wanted, every rank first checks locally whether its devices open
//! (`rdma::local_ready`, no network) and the ranks all-gather that vote over the bootstrap; RDMA
//! is used only when every rank voted yes, and the chosen transport's set-up then runs over the
//! same coordinator listener. A device that passes the local check but fails while connecting
//! fails the job (every rank errors out within the connect timeout) rather than splitting it.

use std::net::SocketAddr;
use std::time::Duration;

use super::bootstrap::{Exchange, coordinator_exchange};
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
/// rank 0's bootstrap address. `TB_TRANSPORT` overrides `want`; `TB_TCP_RAILS`,
/// `TB_TCP_SOCKBUF` and `TB_TCP_SPIN_US` tune TCP ([`TcpConfig::for_endpoints`]).
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
    // A caller that does not say how many threads it computes with is taken to use every core.
    open_endpoints(&ep, want, TcpConfig::for_endpoints(&ep, usize::MAX))
}

/// [`open`] with explicit endpoints and TCP settings, and no look at the environment.
pub fn open_endpoints(
    ep: &Endpoints,
    want: Preference,
    tcp: TcpConfig,
) -> Result<Box<dyn Transport>, TransportError> {
    let mut exchange = coordinator_exchange(ep.coordinator, ep.rank, ep.world, ep.connect_timeout);
    let why_tcp = match want {
        Preference::Tcp => "TCP requested".to_string(),
        Preference::Auto => "the placement does not report RDMA on every link".to_string(),
        Preference::Rdma | Preference::RdmaIfAvailable => {
            let mine = rdma_ready(ep);
            let votes = exchange(&[u8::from(mine.is_ok())])?;
            let lacking: Vec<String> = votes
                .iter()
                .enumerate()
                .filter(|(_, v)| v.first() != Some(&1))
                .map(|(r, _)| r.to_string())
                .collect();
            let mine_why = mine
                .err()
                .map(|e| format!(" (here: {e})"))
                .unwrap_or_default();
            if !lacking.is_empty() {
                let why = format!(
                    "rank(s) {} cannot open an RDMA device{mine_why}",
                    lacking.join(", ")
                );
                if want == Preference::Rdma {
                    return Err(TransportError::Unsupported(format!(
                        "RDMA was required: {why}"
                    )));
                }
                why
            } else {
                let t = open_rdma(ep, &mut exchange)?;
                tracing::info!(rank = ep.rank, world = ep.world, "data plane: RDMA");
                return Ok(t);
            }
        }
    };
    tracing::info!(rank = ep.rank, world = ep.world, reason = %why_tcp, "data plane: TCP");
    Ok(Box::new(TcpTransport::open_exchanging(
        ep,
        tcp,
        &mut exchange,
    )?))
}

#[cfg(feature = "rdma")]
fn rdma_ready(ep: &Endpoints) -> Result<(), TransportError> {
    crate::rdma::local_ready(ep)
}

#[cfg(not(feature = "rdma"))]
fn rdma_ready(_ep: &Endpoints) -> Result<(), TransportError> {
    Err(TransportError::Unsupported(
        "this tb-nodelet was built without the `rdma` feature".into(),
    ))
}

#[cfg(feature = "rdma")]
fn open_rdma(
    ep: &Endpoints,
    exchange: &mut Exchange<'_>,
) -> Result<Box<dyn Transport>, TransportError> {
    crate::rdma::open(ep, exchange)
}

#[cfg(not(feature = "rdma"))]
fn open_rdma(
    _ep: &Endpoints,
    _exchange: &mut Exchange<'_>,
) -> Result<Box<dyn Transport>, TransportError> {
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

    /// Ranks that would like RDMA but lack a device agree on TCP together (no device can
    /// exist on these machines), and a rank that requires RDMA makes every rank fail.
    #[test]
    fn ranks_vote_and_fall_back_to_tcp_together() {
        for world in [2usize, 3] {
            let coord = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let coordinator = coord.local_addr().unwrap();
            drop(coord);
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    std::thread::spawn(move || {
                        let ep = Endpoints {
                            rank,
                            world,
                            peers: vec!["127.0.0.1:0".parse().unwrap(); world],
                            coordinator,
                            connect_timeout: Duration::from_secs(10),
                        };
                        open_endpoints(&ep, Preference::RdmaIfAvailable, TcpConfig::default())
                            .map(|t| t.capabilities().name)
                    })
                })
                .collect();
            for h in handles {
                assert_eq!(h.join().unwrap().unwrap(), "tcp");
            }
        }
        let coord = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let coordinator = coord.local_addr().unwrap();
        drop(coord);
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let ep = Endpoints {
                        rank,
                        world: 2,
                        peers: vec!["127.0.0.1:0".parse().unwrap(); 2],
                        coordinator,
                        connect_timeout: Duration::from_secs(3),
                    };
                    let want = if rank == 0 {
                        Preference::Rdma
                    } else {
                        Preference::RdmaIfAvailable
                    };
                    open_endpoints(&ep, want, TcpConfig::default()).map(|_| ())
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let e = results[0].as_ref().unwrap_err().to_string();
        assert!(e.contains("RDMA was required") && e.contains("0, 1"), "{e}");
        assert!(results[1].is_err(), "rank 1 cannot finish the set-up alone");
    }
}
