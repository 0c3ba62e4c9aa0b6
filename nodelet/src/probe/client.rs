//! The prober: one probe of one link, from a local port address to a peer's probe server.
//!
//! Latency: `warmup` untimed then `round_trips` timed ping-pongs of [`PING_SIZE`] bytes on one
//! connection; p50 and p99 of the round-trip times (nearest rank). Bandwidth: `streams`
//! connections, all set up before the clock starts, each writing [`CHUNK`]-byte chunks until
//! `duration` has passed or all streams together have written `max_bytes`; then each waits for
//! the server's byte count. Gb/s = acknowledged bytes × 8 / time from the first byte to the
//! last count.
//!
//! Every socket is bound to the local port address, so the traffic leaves by that link. Each
//! connection must be set up within `connect_timeout` and the whole probe must end within
//! `timeout`; nothing here waits longer.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::{CHUNK, Measurement, OP_BULK, OP_PING, PING_SIZE, ProbeConfig, ProbeError};

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
    let (latency_us_p50, latency_us_p99) = latency(local, peer, cfg).await?;
    let (bytes, elapsed) = bandwidth(local, peer, cfg).await?;
    let secs = elapsed.as_secs_f64().max(1e-9);
    Ok(Measurement {
        latency_us_p50,
        latency_us_p99,
        round_trips: cfg.round_trips,
        bandwidth_gbps: bytes as f64 * 8.0 / secs / 1e9,
        streams: cfg.streams,
        bytes,
        elapsed,
    })
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

/// Round trips of [`PING_SIZE`] bytes: (p50, p99) in microseconds.
async fn latency(
    local: IpAddr,
    peer: SocketAddr,
    cfg: &ProbeConfig,
) -> Result<(f64, f64), ProbeError> {
    if cfg.round_trips == 0 {
        return Err(ProbeError::Protocol {
            peer,
            message: "no round trips to time".into(),
        });
    }
    let mut stream = connect(local, peer, cfg).await?;
    stream
        .write_all(&[OP_PING])
        .await
        .map_err(io(peer, "sending the ping op"))?;
    let mut msg = [0u8; PING_SIZE];
    let mut back = [0u8; PING_SIZE];
    let mut samples = Vec::with_capacity(cfg.round_trips as usize);
    for i in 0..u64::from(cfg.warmup) + u64::from(cfg.round_trips) {
        msg[..8].copy_from_slice(&i.to_be_bytes());
        let started = Instant::now();
        stream.write_all(&msg).await.map_err(io(peer, "ping"))?;
        stream
            .read_exact(&mut back)
            .await
            .map_err(io(peer, "pong"))?;
        let rtt = started.elapsed();
        if back != msg {
            return Err(ProbeError::Protocol {
                peer,
                message: format!("round trip {i} came back changed"),
            });
        }
        if i >= u64::from(cfg.warmup) {
            samples.push(rtt.as_secs_f64() * 1e6);
        }
    }
    let _ = stream.shutdown().await;
    samples.sort_by(f64::total_cmp);
    Ok((percentile(&samples, 0.50), percentile(&samples, 0.99)))
}

/// Nearest-rank percentile of sorted samples (0 for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Parallel bulk streams: (bytes the server acknowledged, elapsed).
async fn bandwidth(
    local: IpAddr,
    peer: SocketAddr,
    cfg: &ProbeConfig,
) -> Result<(u64, Duration), ProbeError> {
    let streams = cfg.streams.max(1);
    let mut connections = Vec::with_capacity(streams as usize);
    for _ in 0..streams {
        let mut s = connect(local, peer, cfg).await?;
        s.write_all(&[OP_BULK])
            .await
            .map_err(io(peer, "sending the bulk op"))?;
        connections.push(s);
    }
    let chunk: Arc<[u8]> = vec![0xA5u8; CHUNK].into();
    let budget = Arc::new(AtomicU64::new(cfg.max_bytes));
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started + cfg.duration);
    let mut tasks = tokio::task::JoinSet::new();
    for stream in connections {
        tasks.spawn(bulk_stream(
            stream,
            peer,
            chunk.clone(),
            budget.clone(),
            deadline,
        ));
    }
    let mut total: u64 = 0;
    while let Some(joined) = tasks.join_next().await {
        let acked = joined.map_err(|e| ProbeError::Protocol {
            peer,
            message: format!("a bulk stream stopped: {e}"),
        })??;
        total = total.saturating_add(acked);
    }
    Ok((total, started.elapsed()))
}

/// Takes up to `want` bytes from the shared budget.
fn take(budget: &AtomicU64, want: u64) -> u64 {
    let mut taken = 0;
    let _ = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
        taken = left.min(want);
        Some(left - taken)
    });
    taken
}

/// One stream: write until the deadline or the budget runs out, then read the server's count.
async fn bulk_stream(
    mut stream: TcpStream,
    peer: SocketAddr,
    chunk: Arc<[u8]>,
    budget: Arc<AtomicU64>,
    deadline: tokio::time::Instant,
) -> Result<u64, ProbeError> {
    let mut sent: u64 = 0;
    while tokio::time::Instant::now() < deadline {
        let n = take(&budget, chunk.len() as u64) as usize;
        if n == 0 {
            break;
        }
        stream
            .write_all(&chunk[..n])
            .await
            .map_err(io(peer, "bulk write"))?;
        sent += n as u64;
    }
    stream
        .shutdown()
        .await
        .map_err(io(peer, "ending the bulk stream"))?;
    let mut count = [0u8; 8];
    stream
        .read_exact(&mut count)
        .await
        .map_err(io(peer, "reading the byte count"))?;
    let acked = u64::from_be_bytes(count);
    if acked != sent {
        return Err(ProbeError::Protocol {
            peer,
            message: format!("the server counted {acked} of {sent} bytes"),
        });
    }
    Ok(acked)
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

    #[test]
    fn the_budget_is_shared_and_never_overdrawn() {
        let b = AtomicU64::new(10);
        assert_eq!(take(&b, 4), 4);
        assert_eq!(take(&b, 4), 4);
        assert_eq!(take(&b, 4), 2);
        assert_eq!(take(&b, 4), 0);
    }
}
