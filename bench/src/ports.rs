//! Free loopback ports for the members the benchmark starts.

use anyhow::Context;

/// `n` distinct ports that were free a moment ago (the OS picks them; all listeners are held
/// until every port is chosen, so the list has no duplicates).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("binding a free loopback port"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr().context("reading a bound port")?.port()))
        .collect()
}
