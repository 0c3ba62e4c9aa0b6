//! The probe server: a TCP listener on each port address, all at one TCP port, serving the
//! protocol of [`crate::probe`]: each request opens a transport session back to the prober.
//!
//! [`ProbeServer::serve_on`] is called with the current port addresses (every heartbeat): it
//! starts listeners for new addresses and stops those whose address is gone. With a requested
//! port of 0 the first listener picks one and every later address uses the same port, since a
//! Node reports a single `probePort`. An address that cannot be bound (not on this machine,
//! port taken) is logged once and tried again after [`RETRY_BIND`].

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::session::{self, Request};
use super::{IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_SESSIONS, OP_TRANSPORT};

/// How long before an address that could not be bound is tried again.
pub const RETRY_BIND: Duration = Duration::from_secs(30);

/// Tries at picking one free port for all addresses, when the port is left to the OS.
const PICK_TRIES: usize = 5;

pub struct ProbeServer {
    /// `--probe-port`; 0: let the OS pick.
    requested: u16,
    state: Mutex<State>,
    permits: Arc<Semaphore>,
    sessions: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    /// The port every listener uses (0 until the first one is bound).
    port: u16,
    listeners: HashMap<IpAddr, JoinHandle<()>>,
    /// Addresses that could not be bound, and when.
    failed: HashMap<IpAddr, Instant>,
}

impl ProbeServer {
    pub fn new(port: u16) -> Arc<ProbeServer> {
        Arc::new(ProbeServer {
            requested: port,
            state: Mutex::new(State {
                port,
                ..Default::default()
            }),
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            sessions: Arc::new(Semaphore::new(MAX_SESSIONS)),
        })
    }

    /// The port the listeners use; 0 while there is none.
    pub fn port(&self) -> u16 {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.listeners.is_empty() {
            0
        } else {
            state.port
        }
    }

    /// The addresses served now, sorted.
    pub fn addresses(&self) -> Vec<IpAddr> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut addrs: Vec<IpAddr> = state.listeners.keys().copied().collect();
        addrs.sort();
        addrs
    }

    /// Serve on exactly `addresses` (as far as they can be bound).
    pub async fn serve_on(&self, addresses: &[IpAddr]) {
        let new: Vec<IpAddr> = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.listeners.retain(|addr, task| {
                let keep = addresses.contains(addr);
                if !keep {
                    tracing::info!(%addr, "probe server: address gone; listener stopped");
                    task.abort();
                }
                keep
            });
            state.failed.retain(|addr, _| addresses.contains(addr));
            let mut new: Vec<IpAddr> = addresses
                .iter()
                .copied()
                .filter(|a| !state.listeners.contains_key(a))
                .filter(|a| {
                    state
                        .failed
                        .get(a)
                        .is_none_or(|t| t.elapsed() >= RETRY_BIND)
                })
                .collect();
            new.sort();
            new.dedup();
            new
        };
        if new.is_empty() {
            return;
        }
        let port = self.state.lock().unwrap_or_else(|e| e.into_inner()).port;
        let bound = if port == 0 {
            pick_common_port(&new).await
        } else {
            let mut bound = Vec::new();
            for addr in &new {
                bound.push((*addr, TcpListener::bind(SocketAddr::new(*addr, port)).await));
            }
            bound
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (addr, result) in bound {
            match result {
                Ok(listener) => {
                    let local = listener.local_addr().map(|a| a.port()).unwrap_or(0);
                    if state.port == 0 {
                        state.port = local;
                    }
                    if local != state.port {
                        // Another caller fixed the port meanwhile; this listener is surplus.
                        continue;
                    }
                    tracing::info!(addr = %SocketAddr::new(addr, local), "probe server listening");
                    state.failed.remove(&addr);
                    let (permits, sessions) = (self.permits.clone(), self.sessions.clone());
                    state
                        .listeners
                        .insert(addr, tokio::spawn(accept_loop(listener, permits, sessions)));
                }
                Err(e) => {
                    if state.failed.insert(addr, Instant::now()).is_none() {
                        tracing::warn!(%addr, port = state.port, requested = self.requested, "probe server cannot listen: {e}");
                    } else {
                        tracing::debug!(%addr, "probe server still cannot listen: {e}");
                    }
                }
            }
        }
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for task in state.listeners.values() {
            task.abort();
        }
    }
}

type Bound = Vec<(IpAddr, std::io::Result<TcpListener>)>;

/// Binds the first address to a port the OS picks and the others to the same port, trying
/// again with a fresh pick when that port is taken on another address.
async fn pick_common_port(addrs: &[IpAddr]) -> Bound {
    let mut last = Vec::new();
    for _ in 0..PICK_TRIES {
        let Some((first, rest)) = addrs.split_first() else {
            return Vec::new();
        };
        let first_result = TcpListener::bind(SocketAddr::new(*first, 0)).await;
        let port = match &first_result {
            Ok(l) => l.local_addr().map(|a| a.port()).unwrap_or(0),
            Err(_) => 0,
        };
        if port == 0 {
            // The first address cannot be bound at all: pick with the next ones.
            let mut bound = vec![(*first, first_result)];
            bound.extend(Box::pin(pick_common_port(rest)).await);
            return bound;
        }
        let mut bound = vec![(*first, first_result)];
        let mut clash = false;
        for addr in rest {
            let r = TcpListener::bind(SocketAddr::new(*addr, port)).await;
            clash |= matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse);
            bound.push((*addr, r));
        }
        if !clash {
            return bound;
        }
        last = bound;
    }
    last
}

async fn accept_loop(listener: TcpListener, permits: Arc<Semaphore>, sessions: Arc<Semaphore>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "probe server busy; connection closed");
                    continue;
                };
                let sessions = sessions.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = serve(stream, sessions).await {
                        tracing::debug!(%peer, "probe connection: {e}");
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::debug!("probe server accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads with the idle timeout; `Ok(0)` at EOF.
async fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    match tokio::time::timeout(IDLE_TIMEOUT, stream.read(buf)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "idle for too long",
        )),
    }
}

async fn write_all(stream: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    match tokio::time::timeout(IDLE_TIMEOUT, stream.write_all(buf)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "peer stopped reading",
        )),
    }
}

/// Fills `buf` whole; `Ok(false)` at a clean EOF before its first byte.
async fn read_message(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = read_some(stream, &mut buf[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Ok(false);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        filled += n;
    }
    Ok(true)
}

/// One control connection: the op byte and request, then a transport session back to the
/// prober, then the verdict.
pub async fn serve(mut stream: TcpStream, sessions: Arc<Semaphore>) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut op = [0u8; 1];
    if !read_message(&mut stream, &mut op).await? {
        return Ok(());
    }
    if op[0] == crate::staging::OP_FETCH {
        // Model staging shares this port: a transfer of a GGUF file's header and tensors.
        let std = stream.into_std()?;
        std.set_nonblocking(false)?;
        return match sessions.try_acquire_owned() {
            Err(_) => Ok(()),
            Ok(permit) => tokio::task::spawn_blocking(move || {
                let _permit = permit;
                crate::staging::serve::serve(std)
            })
            .await
            .map_err(std::io::Error::other)?,
        };
    }
    if op[0] != OP_TRANSPORT {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown op byte {:#04x}", op[0]),
        ));
    }
    let mut raw = [0u8; Request::LEN];
    if !read_message(&mut stream, &mut raw).await? {
        return Ok(());
    }
    let req = Request::decode(&raw)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let (local, peer) = (stream.local_addr()?.ip(), stream.peer_addr()?.ip());
    let outcome = match sessions.try_acquire_owned() {
        Err(_) => Err(format!("busy: {MAX_SESSIONS} probes are running")),
        Ok(permit) => tokio::task::spawn_blocking(move || {
            let _permit = permit;
            session::run_server(local, peer, &req)
        })
        .await
        .map_err(|e| format!("the probe session stopped: {e}"))
        .and_then(|r| r.map_err(|e| e.to_string())),
    };
    let verdict = match outcome {
        Ok(()) => vec![0u8],
        Err(message) => {
            tracing::debug!(%peer, "probe session failed: {message}");
            let bytes = message.as_bytes();
            let n = bytes.len().min(u16::MAX as usize);
            let mut v = vec![1u8];
            v.extend_from_slice(&(n as u16).to_be_bytes());
            v.extend_from_slice(&bytes[..n]);
            v
        }
    };
    write_all(&mut stream, &verdict).await?;
    stream.shutdown().await
}
