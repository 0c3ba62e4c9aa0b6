//! What the transport's integration tests share: a coordinator address that no concurrent
//! test's connection can take.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// A free port on 127.0.0.1 for rank 0's coordinator, below Linux's ephemeral range (32768+).
/// The port is closed again before rank 0 binds it, and in that window concurrent tests open
/// connections whose local ports the kernel picks from the ephemeral range: a port asked of
/// the kernel with `:0` was once taken that way. Each call starts past the last port handed
/// out, so that two tests never get the same one.
pub fn coordinator_addr() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    (0..10_000u32)
        .map(|_| NEXT.fetch_add(1, Ordering::Relaxed))
        .filter_map(|i| u16::try_from(10_000 + start.wrapping_add(i) % 10_000).ok())
        .find_map(|port| {
            let l = TcpListener::bind(("127.0.0.1", port)).ok()?;
            l.local_addr().ok()
        })
        .expect("a free port in 10000..20000")
}
