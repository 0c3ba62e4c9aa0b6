//! Bootstrap: every rank learns every other rank's opaque blob (data-plane address, queue-pair
//! info) through a star all-gather over TCP, as MLX's JACCL coordinator and NCCL's bootstrap do.
//!
//! Rank 0 listens on the coordinator address; every other rank connects (retrying until the
//! deadline, since rank 0 may start later) and sends `TBB1, rank, world, len, blob`; rank 0
//! answers each with `TBB1, world, (len, blob) × world` in rank order. All integers are u32
//! little-endian. Every wait has the one deadline; errors name the rank involved.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::TransportError;

const MAGIC: u32 = u32::from_le_bytes(*b"TBB1");
/// One bootstrap all-gather round: takes this rank's blob, returns every rank's blob in rank
/// order. Transports take one of these so that several rounds (a vote, then the set-up of the
/// chosen transport) can share one coordinator listener.
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>, TransportError> + 'a;

/// Rounds of all-gather over `coordinator`: rank 0 binds it on first use (so a set-up that
/// fails before any round never touches the network) and serves every round from that one
/// listener, so a rank that hurries on to the next round waits in its backlog instead of
/// meeting a closed port.
pub fn coordinator_exchange(
    coordinator: SocketAddr,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> impl FnMut(&[u8]) -> Result<Vec<Vec<u8>>, TransportError> {
    let mut listener: Option<TcpListener> = None;
    move |blob: &[u8]| {
        if rank != 0 {
            return all_gather(coordinator, rank, world, blob, timeout);
        }
        if listener.is_none() {
            listener = Some(TcpListener::bind(coordinator).map_err(|e| {
                TransportError::Bootstrap(format!(
                    "rank 0 cannot listen on coordinator {coordinator}: {e}"
                ))
            })?);
        }
        let l = listener
            .as_ref()
            .ok_or_else(|| TransportError::Bootstrap("coordinator listener missing".into()))?
            .try_clone()
            .map_err(|e| TransportError::Bootstrap(format!("coordinator socket: {e}")))?;
        serve(l, world, blob, timeout)
    }
}

/// Largest blob a rank may contribute.
pub const MAX_BLOB: usize = 1 << 20;

/// All-gathers `blob` over the ranks: returns every rank's blob, in rank order. Rank 0 binds
/// `coordinator`; the others connect to it.
pub fn all_gather(
    coordinator: SocketAddr,
    rank: usize,
    world: usize,
    blob: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, TransportError> {
    check_args(rank, world, blob)?;
    if rank == 0 {
        let listener = TcpListener::bind(coordinator).map_err(|e| {
            TransportError::Bootstrap(format!(
                "rank 0 cannot listen on coordinator {coordinator}: {e}"
            ))
        })?;
        serve(listener, world, blob, timeout)
    } else {
        join(coordinator, rank, world, blob, timeout)
    }
}

/// Rank 0's side on an already bound listener (tests bind port 0 and pass the address on).
pub fn serve(
    listener: TcpListener,
    world: usize,
    blob: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, TransportError> {
    check_args(0, world, blob)?;
    let deadline = Instant::now() + timeout;
    let fail = |what: String| TransportError::Bootstrap(format!("rank 0: {what}"));
    listener
        .set_nonblocking(true)
        .map_err(|e| fail(format!("coordinator socket: {e}")))?;
    let mut blobs: Vec<Option<Vec<u8>>> = vec![None; world];
    blobs[0] = Some(blob.to_vec());
    let mut conns: Vec<(usize, TcpStream)> = Vec::with_capacity(world.saturating_sub(1));
    while conns.len() + 1 < world {
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<String> = (1..world)
                .filter(|r| blobs[*r].is_none())
                .map(|r| r.to_string())
                .collect();
            return Err(fail(format!(
                "timed out after {timeout:?}: rank(s) {} never joined",
                missing.join(", ")
            )));
        }
        let (mut s, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail(format!("accept: {e}"))),
        };
        let prep = s
            .set_nonblocking(false)
            .and_then(|_| s.set_read_timeout(Some(deadline.saturating_duration_since(now))))
            .and_then(|_| s.set_nodelay(true));
        if let Err(e) = prep {
            tracing::warn!(%from, error = %e, "bootstrap: dropping connection");
            continue;
        }
        let mut head = [0u8; 16];
        if let Err(e) = s.read_exact(&mut head) {
            tracing::warn!(%from, error = %e, "bootstrap: connection without a greeting");
            continue;
        }
        let (r, len) = match parse_greeting(&head, world) {
            Ok(Some(x)) => x,
            Ok(None) => {
                tracing::warn!(%from, "bootstrap: connection with a wrong magic, ignored");
                continue;
            }
            Err(what) => return Err(fail(format!("{what} (from {from})"))),
        };
        if blobs[r].is_some() {
            return Err(fail(format!("rank {r} joined twice (again from {from})")));
        }
        let mut b = vec![0u8; len];
        s.read_exact(&mut b)
            .map_err(|e| fail(format!("reading rank {r}'s blob: {e}")))?;
        blobs[r] = Some(b);
        conns.push((r, s));
    }
    let all: Vec<Vec<u8>> = blobs.into_iter().map(|b| b.unwrap_or_default()).collect();
    let mut reply = Vec::new();
    reply.extend_from_slice(&MAGIC.to_le_bytes());
    reply.extend_from_slice(&(world as u32).to_le_bytes());
    for b in &all {
        reply.extend_from_slice(&(b.len() as u32).to_le_bytes());
        reply.extend_from_slice(b);
    }
    for (r, s) in &mut conns {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .and_then(|_| s.write_all(&reply))
            .map_err(|e| fail(format!("answering rank {r}: {e}")))?;
    }
    Ok(all)
}

/// A non-zero rank's side: connect (retrying until the deadline), send, read the answer.
fn join(
    coordinator: SocketAddr,
    rank: usize,
    world: usize,
    blob: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, TransportError> {
    let deadline = Instant::now() + timeout;
    let fail = |what: String| TransportError::Bootstrap(format!("rank {rank}: {what}"));
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(fail(format!(
                "timed out after {timeout:?} connecting to rank 0 at {coordinator}"
            )));
        }
        match TcpStream::connect_timeout(&coordinator, left.min(Duration::from_secs(2))) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let left = left.max(Duration::from_millis(1));
    s.set_nodelay(true)
        .and_then(|_| s.set_read_timeout(Some(left)))
        .and_then(|_| s.set_write_timeout(Some(left)))
        .map_err(|e| fail(format!("coordinator socket: {e}")))?;
    let mut msg = Vec::with_capacity(16 + blob.len());
    msg.extend_from_slice(&MAGIC.to_le_bytes());
    msg.extend_from_slice(&(rank as u32).to_le_bytes());
    msg.extend_from_slice(&(world as u32).to_le_bytes());
    msg.extend_from_slice(&(blob.len() as u32).to_le_bytes());
    msg.extend_from_slice(blob);
    s.write_all(&msg)
        .map_err(|e| fail(format!("sending to rank 0 at {coordinator}: {e}")))?;
    let read_err = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => fail(format!(
            "timed out after {timeout:?} waiting for rank 0's answer (some rank did not join)"
        )),
        std::io::ErrorKind::UnexpectedEof => {
            fail("rank 0 closed the bootstrap connection (it rejected this rank or failed)".into())
        }
        _ => fail(format!("reading rank 0's answer: {e}")),
    };
    let out = read_answer(&mut s, world).map_err(|e| match e {
        AnswerError::Io(e) => read_err(e),
        AnswerError::Bad(what) => fail(what),
    })?;
    if out[rank] != blob {
        return Err(fail("rank 0 relayed a different blob for this rank".into()));
    }
    Ok(out)
}

/// Checks a joining rank's 16-byte greeting (`TBB1, rank, world, len`) against this world:
/// `Ok(None)` for a wrong magic (a stray connection, ignored), `Ok(Some((rank, blob length)))`,
/// or why the greeting is unacceptable.
pub fn parse_greeting(head: &[u8; 16], world: usize) -> Result<Option<(usize, usize)>, String> {
    let (magic, r, w, len) = (
        u32_at(head, 0),
        u32_at(head, 4) as usize,
        u32_at(head, 8) as usize,
        u32_at(head, 12) as usize,
    );
    if magic != MAGIC {
        return Ok(None);
    }
    if w != world {
        return Err(format!(
            "rank {r} says the world has {w} ranks, expected {world}"
        ));
    }
    if r == 0 || r >= world {
        return Err(format!("a peer claims rank {r}, expected 1..{world}"));
    }
    if len > MAX_BLOB {
        return Err(format!(
            "rank {r} sent a {len}-byte blob, at most {MAX_BLOB} allowed"
        ));
    }
    Ok(Some((r, len)))
}

/// Why rank 0's answer could not be read.
#[derive(Debug)]
pub enum AnswerError {
    /// The connection failed (or ended) while reading.
    Io(std::io::Error),
    /// The bytes are not a valid answer.
    Bad(String),
}

/// Reads rank 0's answer (`TBB1, world, (len, blob) × world`) for a world of `world` ranks.
/// A blob's buffer grows only with the bytes that arrive, so a length claim alone allocates
/// nothing.
pub fn read_answer(s: &mut impl Read, world: usize) -> Result<Vec<Vec<u8>>, AnswerError> {
    let mut head = [0u8; 8];
    s.read_exact(&mut head).map_err(AnswerError::Io)?;
    if u32_at(&head, 0) != MAGIC || u32_at(&head, 4) as usize != world {
        return Err(AnswerError::Bad(format!(
            "rank 0 answered with a bad header {:?} (expected magic TBB1 and world {world})",
            head
        )));
    }
    let mut out = Vec::new();
    for r in 0..world {
        let mut l = [0u8; 4];
        s.read_exact(&mut l).map_err(AnswerError::Io)?;
        let len = u32::from_le_bytes(l) as usize;
        if len > MAX_BLOB {
            return Err(AnswerError::Bad(format!(
                "rank 0 relayed a {len}-byte blob for rank {r}, at most {MAX_BLOB} allowed"
            )));
        }
        let mut b = Vec::new();
        let got = s
            .by_ref()
            .take(len as u64)
            .read_to_end(&mut b)
            .map_err(AnswerError::Io)?;
        if got != len {
            return Err(AnswerError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        out.push(b);
    }
    Ok(out)
}

fn check_args(rank: usize, world: usize, blob: &[u8]) -> Result<(), TransportError> {
    if world == 0 || rank >= world || world > u32::MAX as usize {
        return Err(TransportError::Invalid(format!(
            "bootstrap: rank {rank} is outside a world of {world}"
        )));
    }
    if blob.len() > MAX_BLOB {
        return Err(TransportError::Invalid(format!(
            "bootstrap: rank {rank}'s blob has {} bytes, at most {MAX_BLOB} allowed",
            blob.len()
        )));
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_in_rank_order() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let world = 4;
        let hs: Vec<_> = (1..world)
            .map(|r| {
                std::thread::spawn(move || {
                    all_gather(addr, r, world, &[r as u8; 3], Duration::from_secs(5))
                })
            })
            .collect();
        let all = serve(l, world, b"zero", Duration::from_secs(5)).unwrap();
        assert_eq!(all[0], b"zero");
        assert_eq!(all[3], vec![3u8; 3]);
        for h in hs {
            assert_eq!(h.join().unwrap().unwrap(), all);
        }
    }

    #[test]
    fn missing_rank_times_out_naming_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h =
            std::thread::spawn(move || all_gather(addr, 1, 3, b"one", Duration::from_millis(300)));
        let e = serve(l, 3, b"", Duration::from_millis(300)).unwrap_err();
        assert!(e.to_string().contains("rank(s) 2 never joined"), "{e}");
        let e1 = h.join().unwrap().unwrap_err().to_string();
        assert!(e1.contains("rank 1"), "{e1}");
    }
}
