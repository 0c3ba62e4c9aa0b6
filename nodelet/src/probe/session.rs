//! One probe over tb's data-plane transport: the two ends open a 2-rank [`Transport`] between
//! the link's addresses (RDMA where the link has it and a device opens, TCP otherwise — the same
//! choice a job makes), then time ping-pongs and a bulk stream through it. What the placement is
//! given is therefore what a pipeline stage will see.
//!
//! The prober (end `a`) is rank 0 and the bootstrap coordinator; the probe server (end `b`) is
//! rank 1. Both sides are blocking code on the transport; callers run them on blocking threads.
//!
//! Script, after the transport is open:
//! 1. `warmup + round_trips` ping-pongs of [`PING_SIZE`] bytes (rank 0 sends, rank 1 echoes);
//! 2. rank 0 streams [`BULK_MESSAGE`]-byte messages, [`BULK_DEPTH`] in flight, until the bulk
//!    duration or byte budget is spent, then one empty message;
//! 3. rank 1 answers with the 8-byte count of bytes it received, which must equal what was sent.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tb_transport::tcp::TcpConfig;
use tb_transport::{
    BufId, Completion, Endpoints, Preference, Transport, TransportError, select::open_endpoints,
};

use super::PING_SIZE;

/// Size of one bulk message.
pub const BULK_MESSAGE: usize = 4 << 20;
/// Bulk messages in flight at once.
pub const BULK_DEPTH: usize = 4;

/// What the prober asks of the server (sent on the control connection after the op byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Try RDMA first (the link reports it on both ends).
    pub rdma: bool,
    /// The port of rank 0's bootstrap coordinator, on the prober's address.
    pub coordinator_port: u16,
    /// TCP connections per link when the transport is TCP.
    pub rails: u8,
    /// Untimed, then timed round trips.
    pub warmup: u32,
    pub round_trips: u32,
    /// How long the server's half may take, milliseconds (at most [`MAX_SESSION_MS`]).
    pub timeout_ms: u32,
}

/// The longest session a server agrees to.
pub const MAX_SESSION_MS: u32 = 120_000;

impl Request {
    pub const LEN: usize = 1 + 2 + 1 + 4 + 4 + 4;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = u8::from(self.rdma);
        b[1..3].copy_from_slice(&self.coordinator_port.to_be_bytes());
        b[3] = self.rails;
        b[4..8].copy_from_slice(&self.warmup.to_be_bytes());
        b[8..12].copy_from_slice(&self.round_trips.to_be_bytes());
        b[12..16].copy_from_slice(&self.timeout_ms.to_be_bytes());
        b
    }

    /// Decodes a request; the limits keep a stranger from making the server work for long.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Request, String> {
        let r = Request {
            rdma: b[0] == 1,
            coordinator_port: u16::from_be_bytes([b[1], b[2]]),
            rails: b[3],
            warmup: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            round_trips: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            timeout_ms: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        };
        if b[0] > 1 {
            return Err(format!("rdma flag must be 0 or 1, found {}", b[0]));
        }
        if r.coordinator_port == 0 {
            return Err("coordinator port 0".into());
        }
        if !(1..=16).contains(&r.rails) {
            return Err(format!("rails must be 1..=16, found {}", r.rails));
        }
        if r.timeout_ms == 0 || r.timeout_ms > MAX_SESSION_MS {
            return Err(format!(
                "timeout must be 1..={MAX_SESSION_MS} ms, found {}",
                r.timeout_ms
            ));
        }
        if r.warmup > 10_000 || r.round_trips > 100_000 {
            return Err("more than 10000 warm-up or 100000 timed round trips".into());
        }
        Ok(r)
    }
}

/// What rank 0 measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Sorted round-trip times, microseconds.
    pub rtts_us: Vec<f64>,
    /// Bytes the server acknowledged.
    pub bytes: u64,
    pub elapsed: Duration,
    /// `tcp` or `rdma`.
    pub transport: &'static str,
    pub rails: usize,
}

fn endpoints(
    rank: usize,
    mine: IpAddr,
    theirs: IpAddr,
    coordinator: SocketAddr,
    timeout: Duration,
) -> Endpoints {
    let (a, b) = if rank == 0 {
        (mine, theirs)
    } else {
        (theirs, mine)
    };
    Endpoints {
        rank,
        world: 2,
        peers: vec![SocketAddr::new(a, 0), SocketAddr::new(b, 0)],
        coordinator,
        connect_timeout: timeout,
    }
}

fn open(ep: &Endpoints, req: &Request) -> Result<Box<dyn Transport>, TransportError> {
    let want = if req.rdma {
        Preference::RdmaIfAvailable
    } else {
        Preference::Tcp
    };
    let tcp = TcpConfig {
        rails: usize::from(req.rails),
        ..TcpConfig::default()
    }
    .spinning_for(ep, 1);
    open_endpoints(ep, want, tcp)
}

/// A free port on `addr` for rank 0's coordinator. The listener is closed before the bootstrap
/// binds the port again; the window is a few microseconds, and a clash only fails this probe
/// (which is retried with backoff).
pub fn pick_coordinator_port(addr: IpAddr) -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(SocketAddr::new(addr, 0))?;
    Ok(l.local_addr()?.port())
}

/// Rank 0: opens the transport from `local` to `peer` and runs the script. The transport is
/// handed back so the caller can keep it open until the server's verdict has arrived (closing
/// it earlier could fail the server's last send).
pub fn run_prober(
    local: IpAddr,
    peer: IpAddr,
    req: &Request,
    bulk_for: Duration,
    max_bytes: u64,
    timeout: Duration,
) -> Result<(Figures, Box<dyn Transport>), TransportError> {
    let coordinator = SocketAddr::new(local, req.coordinator_port);
    let ep = endpoints(0, local, peer, coordinator, timeout);
    let mut t = open(&ep, req)?;
    let caps = t.capabilities();
    let deadline = Instant::now() + timeout;
    let ping = t.register(PING_SIZE)?;
    let pong = t.register(PING_SIZE)?;
    let mut rtts = Vec::with_capacity(req.round_trips as usize);
    let mut comps = Vec::new();
    for i in 0..u64::from(req.warmup) + u64::from(req.round_trips) {
        t.buf_mut(ping)[..8].copy_from_slice(&i.to_be_bytes());
        let started = Instant::now();
        t.post_recv(1, pong, 2)?;
        t.post_send(1, ping, PING_SIZE, 1)?;
        wait(t.as_mut(), &mut comps, 2, deadline, "ping-pong")?;
        let rtt = started.elapsed();
        if t.buf(pong)[..8] != i.to_be_bytes() {
            return Err(TransportError::Malformed {
                peer: 1,
                what: format!("round trip {i} came back changed"),
            });
        }
        if i >= u64::from(req.warmup) {
            rtts.push(rtt.as_secs_f64() * 1e6);
        }
    }
    rtts.sort_by(f64::total_cmp);

    let bufs: Vec<BufId> = (0..BULK_DEPTH)
        .map(|_| t.register(BULK_MESSAGE))
        .collect::<Result<_, _>>()?;
    let count = t.register(8)?;
    let started = Instant::now();
    let stop_at = started + bulk_for;
    // A send's wr_id is its length, so completions say how much went out.
    let (mut sent, mut queued, mut in_flight, mut next) = (0u64, 0u64, 0usize, 0usize);
    loop {
        let n = (max_bytes - queued).min(BULK_MESSAGE as u64) as usize;
        if n > 0 && in_flight < BULK_DEPTH && Instant::now() < stop_at {
            t.post_send(1, bufs[next % BULK_DEPTH], n, n as u64)?;
            next += 1;
            in_flight += 1;
            queued += n as u64;
            continue;
        }
        if in_flight == 0 {
            break;
        }
        if Instant::now() >= deadline {
            return Err(TransportError::Timeout {
                peer: Some(1),
                step: "probe bulk send".into(),
            });
        }
        comps.clear();
        t.poll(
            &mut comps,
            deadline.saturating_duration_since(Instant::now()),
        )?;
        for c in comps.drain(..) {
            c.result.map_err(|e| step("probe bulk send", e))?;
            sent += c.wr_id;
            in_flight -= 1;
        }
    }
    t.post_recv(1, count, 3)?;
    t.post_send(1, ping, 0, 4)?;
    wait(t.as_mut(), &mut comps, 2, deadline, "bulk byte count")?;
    let elapsed = started.elapsed();
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&t.buf(count)[..8]);
    let acked = u64::from_be_bytes(raw);
    if acked != sent {
        return Err(TransportError::Malformed {
            peer: 1,
            what: format!("the server counted {acked} of {sent} bytes"),
        });
    }
    let figures = Figures {
        rtts_us: rtts,
        bytes: acked,
        elapsed,
        transport: caps.name,
        rails: caps.rails,
    };
    Ok((figures, t))
}

/// Rank 1: opens the transport towards the prober at `peer` and answers the script.
pub fn run_server(local: IpAddr, peer: IpAddr, req: &Request) -> Result<(), TransportError> {
    let timeout = Duration::from_millis(u64::from(req.timeout_ms));
    let coordinator = SocketAddr::new(peer, req.coordinator_port);
    let ep = endpoints(1, local, peer, coordinator, timeout);
    let mut t = open(&ep, req)?;
    let deadline = Instant::now() + timeout;
    let msg = t.register(PING_SIZE)?;
    let mut comps = Vec::new();
    for _ in 0..u64::from(req.warmup) + u64::from(req.round_trips) {
        t.post_recv(0, msg, 1)?;
        wait(t.as_mut(), &mut comps, 1, deadline, "ping")?;
        t.post_send(0, msg, PING_SIZE, 2)?;
        wait(t.as_mut(), &mut comps, 1, deadline, "pong")?;
    }
    let bufs: Vec<BufId> = (0..BULK_DEPTH)
        .map(|_| t.register(BULK_MESSAGE))
        .collect::<Result<_, _>>()?;
    // Receives are matched to messages in the order they were posted, but a striped message may
    // complete after the (empty) one behind it: so each receive's wr_id carries its sequence
    // number (and its buffer), and the stream ends when the empty message's receive and every
    // receive posted before it have completed. Receives still posted are dropped with the
    // transport.
    let wr = |seq: u64, buf: usize| (seq << 8) | buf as u64;
    let mut pending = std::collections::BTreeSet::new();
    let mut seq = 0u64;
    for (i, buf) in bufs.iter().enumerate() {
        t.post_recv(0, *buf, wr(seq, i))?;
        pending.insert(seq);
        seq += 1;
    }
    let mut total = 0u64;
    let mut end: Option<u64> = None;
    while end.is_none_or(|z| pending.range(..z).next().is_some()) {
        comps.clear();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TransportError::Timeout {
                peer: Some(0),
                step: "probe bulk receive".into(),
            });
        }
        t.poll(&mut comps, left)?;
        for c in comps.drain(..) {
            c.result.map_err(|e| step("probe bulk receive", e))?;
            let (done_seq, buf) = (c.wr_id >> 8, (c.wr_id & 0xff) as usize);
            pending.remove(&done_seq);
            if c.len == 0 {
                end = Some(done_seq);
            } else {
                total += c.len as u64;
                if end.is_none() {
                    t.post_recv(0, bufs[buf], wr(seq, buf))?;
                    pending.insert(seq);
                    seq += 1;
                }
            }
        }
    }
    let count = t.register(8)?;
    t.buf_mut(count).copy_from_slice(&total.to_be_bytes());
    t.post_send(0, count, 8, 9)?;
    wait(
        t.as_mut(),
        &mut comps,
        1,
        deadline,
        "sending the byte count",
    )?;
    Ok(())
}

/// Waits for `n` completions (each must be a success); returns `n`.
fn wait(
    t: &mut dyn Transport,
    comps: &mut Vec<Completion>,
    n: usize,
    deadline: Instant,
    step: &str,
) -> Result<usize, TransportError> {
    let mut got = 0;
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TransportError::Timeout {
                peer: Some(1 - t.rank()),
                step: format!("probe {step}"),
            });
        }
        comps.clear();
        t.poll(comps, left)?;
        for c in comps.drain(..) {
            c.result
                .map_err(|e| self::step(&format!("probe {step}"), e))?;
            got += 1;
        }
    }
    Ok(n)
}

fn step(step: &str, e: TransportError) -> TransportError {
    TransportError::Collective {
        step: step.to_string(),
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_strangers_are_refused() {
        let r = Request {
            rdma: true,
            coordinator_port: 4242,
            rails: 4,
            warmup: 20,
            round_trips: 200,
            timeout_ms: 20_000,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[3] = 0;
        assert!(Request::decode(&bad).unwrap_err().contains("rails"));
        let mut bad = r.encode();
        bad[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Request::decode(&bad).unwrap_err().contains("round trips"));
        let mut bad = r.encode();
        bad[0] = 7;
        assert!(Request::decode(&bad).unwrap_err().contains("rdma"));
        let mut bad = r.encode();
        bad[12..16].copy_from_slice(&0u32.to_be_bytes());
        assert!(Request::decode(&bad).unwrap_err().contains("timeout"));
    }
}
