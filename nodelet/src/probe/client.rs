//! The prober: one probe of one link, from a local port address to a peer's probe server, over
//! tb's data-plane transport ([`super::session`]).
//!
//! A control connection to the peer's probe server carries the request (op `T`); both ends then
//! open a 2-rank transport between the two port addresses (this end is rank 0 and the bootstrap
//! coordinator), time `warmup` + `round_trips` ping-pongs of [`PING_SIZE`](super::PING_SIZE) bytes (p50 and p99,
//! nearest rank) and stream bulk messages for `duration` or until `max_bytes`; Gb/s = bytes the
//! server acknowledged × 8 / time from the first bulk byte to the count. The server reports its
//! own failure on the control connection, so either end's error reaches the Link status.
//!
//! Each connection must be set up within `connect_timeout` and the whole probe must end within
//! `timeout`; nothing here waits longer.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::session::{self, Request};
use super::{Measurement, OP_TRANSPORT, ProbeConfig, ProbeError};

/// Probes the link from `local` (an address of this machine) to the probe server at `peer`.
pub async fn measure(
    local: IpAddr,
    peer: SocketAddr,
    cfg: &ProbeConfig,
) -> Result<Measurement, ProbeError> {
    match tokio::time::timeout(cfg.timeout, run(local, peer, cfg)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout {
            peer,
            timeout: cfg.timeout,
        }),
    }
}

async fn run(
    local: IpAddr,
    peer: SocketAddr,
    cfg: &ProbeConfig,
) -> Result<Measurement, ProbeError> {
    if cfg.round_trips == 0 {
        return Err(ProbeError::Protocol {
            peer,
            message: "no round trips to time".into(),
        });
    }
    let mut control = connect(local, peer, cfg).await?;
    let coordinator_port = session::pick_coordinator_port(local)
        .map_err(|source| ProbeError::Bind { local, source })?;
    // The transport's own deadline is a little inside the probe's, so its error (naming the
    // step) wins over the bare timeout.
    let inner = cfg.timeout.saturating_sub(Duration::from_millis(200));
    let req = Request {
        rdma: cfg.rdma,
        coordinator_port,
        rails: cfg.streams.clamp(1, 16) as u8,
        warmup: cfg.warmup,
        round_trips: cfg.round_trips,
        timeout_ms: (inner.as_millis() as u32).clamp(1, session::MAX_SESSION_MS),
    };
    let mut hello = vec![OP_TRANSPORT];
    hello.extend_from_slice(&req.encode());
    control
        .write_all(&hello)
        .await
        .map_err(io(peer, "sending the probe request"))?;
    let (bulk_for, max_bytes) = (cfg.duration, cfg.max_bytes);
    let started = Instant::now();
    let prober = tokio::task::spawn_blocking(move || {
        session::run_prober(local, peer.ip(), &req, bulk_for, max_bytes, inner)
    });
    let (figures, open_transport) = match prober.await.map_err(|e| ProbeError::Protocol {
        peer,
        message: format!("the prober stopped: {e}"),
    })? {
        Ok((f, t)) => (Ok(f), Some(t)),
        Err(e) => (Err(e), None),
    };
    // The server's verdict: its error explains ours (a peer that closed, say).
    let verdict = tokio::time::timeout(
        inner
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(200)),
        read_verdict(&mut control),
    )
    .await;
    drop(open_transport);
    let server_said = match verdict {
        Ok(Ok(Ok(()))) => None,
        Ok(Ok(Err(message))) => Some(message),
        Ok(Err(e)) => Some(format!("no verdict from the probe server: {e}")),
        Err(_) => Some("no verdict from the probe server in time".into()),
    };
    match (figures, server_said) {
        (Ok(f), None) => {
            let secs = f.elapsed.as_secs_f64().max(1e-9);
            Ok(Measurement {
                latency_us_p50: percentile(&f.rtts_us, 0.50),
                latency_us_p99: percentile(&f.rtts_us, 0.99),
                round_trips: cfg.round_trips,
                bandwidth_gbps: f.bytes as f64 * 8.0 / secs / 1e9,
                streams: f.rails as u32,
                bytes: f.bytes,
                elapsed: f.elapsed,
                transport: f.transport,
            })
        }
        (Ok(_), Some(theirs)) => Err(ProbeError::Protocol {
            peer,
            message: format!("the probe server failed: {theirs}"),
        }),
        (Err(ours), None) => Err(ProbeError::Transport {
            peer,
            message: ours.to_string(),
        }),
        (Err(ours), Some(theirs)) => Err(ProbeError::Transport {
            peer,
            message: format!("{ours} (the probe server: {theirs})"),
        }),
    }
}

/// The server's answer on the control connection: `0`, or `1` + u16 length + message.
async fn read_verdict(control: &mut TcpStream) -> std::io::Result<Result<(), String>> {
    let mut code = [0u8; 1];
    control.read_exact(&mut code).await?;
    if code[0] == 0 {
        return Ok(Ok(()));
    }
    let mut len = [0u8; 2];
    control.read_exact(&mut len).await?;
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    control.read_exact(&mut msg).await?;
    Ok(Err(String::from_utf8_lossy(&msg).into_owned()))
}

/// A connection from `local` to `peer`, set up within the connect timeout.
async fn connect(
    local: IpAddr,
    peer: SocketAddr,
    cfg: &ProbeConfig,
) -> Result<TcpStream, ProbeError> {
    let bind = |source| ProbeError::Bind { local, source };
    let socket = if peer.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(bind)?;
    socket.bind(SocketAddr::new(local, 0)).map_err(bind)?;
    let stream = tokio::time::timeout(cfg.connect_timeout, socket.connect(peer))
        .await
        .map_err(|_| ProbeError::ConnectTimeout {
            peer,
            timeout: cfg.connect_timeout,
        })?
        .map_err(|source| ProbeError::Connect { peer, source })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

fn io(peer: SocketAddr, what: &'static str) -> impl Fn(std::io::Error) -> ProbeError {
    move |source| ProbeError::Io { peer, what, source }
}

/// Nearest-rank percentile of sorted samples (0 for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), 100.0);
        assert_eq!(percentile(&s, 0.99), 198.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
