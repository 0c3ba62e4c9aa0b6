//! Link probes: how fast and how far apart two Macs are over one cable, measured through tb's
//! data-plane transport between the two ends' port addresses — RDMA where the link has it and a
//! device opens, TCP otherwise — so the placement sees what a pipeline stage will get.
//!
//! - [`server`]: every nodelet listens on each of its port addresses at one TCP port (the
//!   Node status' `probePort`) for probe requests;
//! - [`client`]: [`client::measure`] runs one probe from a local port address to a peer's;
//! - [`session`]: the two ranks of a probe over the transport (ping-pong, bulk, byte count);
//! - [`watch`]: the nodelet at end `a` of each Link object probes it and writes the figures
//!   into the Link's status.
//!
//! ## Protocol
//!
//! The client connects a control connection (from its own port address, so the traffic takes
//! that cable) and sends the op byte `T` and a [`session::Request`] (RDMA wanted or not, the
//! port of its bootstrap coordinator on its address, rails, round trips). Both ends then open a
//! 2-rank transport and run the [`session`] script. When its half is done, the server writes
//! its verdict on the control connection — `0`, or `1`, a u16 big-endian length and a UTF-8
//! message — and closes.
//!
//! Op `F` on the same port is model staging (see [`crate::staging`]). Any other op byte or a
//! malformed request closes the connection. The server closes a control
//! connection that sends nothing for [`IDLE_TIMEOUT`], serves at most [`MAX_CONNECTIONS`]
//! control connections and [`MAX_SESSIONS`] transport sessions at once (more are refused).

pub mod client;
pub mod server;
pub mod session;
pub mod watch;

use std::time::Duration;

/// Op byte: a probe over the transport.
pub const OP_TRANSPORT: u8 = b'T';
/// Size of one ping-pong message.
pub const PING_SIZE: usize = 64;
/// The server drops a connection that is silent this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once, per nodelet.
pub const MAX_CONNECTIONS: usize = 64;
/// Transport sessions served at once, per nodelet (each holds a few bulk buffers).
pub const MAX_SESSIONS: usize = 4;
/// The probe server's port when `--probe-port` is not given.
pub const DEFAULT_PORT: u16 = 7700;

/// How much a probe measures, and how long it may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeConfig {
    /// Timed round trips of [`PING_SIZE`] bytes.
    pub round_trips: u32,
    /// Untimed round trips first (connection warm-up).
    pub warmup: u32,
    /// Connections per link (rails) when the transport is TCP.
    pub streams: u32,
    /// How long the streams write.
    pub duration: Duration,
    /// The most all streams together write.
    pub max_bytes: u64,
    /// Each connection must be set up within this.
    pub connect_timeout: Duration,
    /// The whole probe (latency and bandwidth) must end within this.
    pub timeout: Duration,
    /// Try RDMA first (the link reports it); TCP when no device opens.
    pub rdma: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            round_trips: 200,
            warmup: 20,
            streams: 4,
            duration: Duration::from_secs(1),
            max_bytes: 1 << 30,
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(20),
            rdma: false,
        }
    }
}

/// What one probe measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Round-trip time of a [`PING_SIZE`]-byte message, microseconds, median.
    pub latency_us_p50: f64,
    /// ... 99th percentile.
    pub latency_us_p99: f64,
    pub round_trips: u32,
    /// Gb/s: bytes the server acknowledged × 8 / elapsed.
    pub bandwidth_gbps: f64,
    /// Rails the transport striped over.
    pub streams: u32,
    /// Bytes the server acknowledged.
    pub bytes: u64,
    pub elapsed: Duration,
    /// The transport the probe ran over: `tcp` or `rdma`.
    pub transport: &'static str,
}

impl Measurement {
    /// Writes the figures into a Link status; the caller stamps when, by whom
    /// and for which request.
    pub fn fill(&self, status: &mut tb_api::specs::LinkStatus) {
        status.latency_us_p50 = Some(round2(self.latency_us_p50));
        status.latency_us_p99 = Some(round2(self.latency_us_p99));
        status.round_trips = self.round_trips;
        status.bandwidth_gbps = Some(round2(self.bandwidth_gbps));
        status.streams = self.streams;
        status.transport = self.transport.into();
        status.error.clear();
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot bind to {local}: {source}")]
    Bind {
        local: std::net::IpAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {peer} within {timeout:?}")]
    ConnectTimeout {
        peer: std::net::SocketAddr,
        timeout: Duration,
    },
    #[error("cannot connect to {peer}: {source}")]
    Connect {
        peer: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{peer}: {what}: {source}")]
    Io {
        peer: std::net::SocketAddr,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{peer}: the probe did not finish within {timeout:?}")]
    Timeout {
        peer: std::net::SocketAddr,
        timeout: Duration,
    },
    #[error("{peer}: transport: {message}")]
    Transport {
        peer: std::net::SocketAddr,
        message: String,
    },
    #[error("{peer}: {message}")]
    Protocol {
        peer: std::net::SocketAddr,
        message: String,
    },
}
