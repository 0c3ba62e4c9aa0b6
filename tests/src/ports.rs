//! Loopback ports for the servers tests start.
//!
//! Binding port 0 and passing the number on races: between closing the probe socket and the
//! server binding, the kernel may hand the same port to an outgoing connection (ephemeral
//! ports come from the same pool) or to another test. So ports are taken from a range below
//! the ephemeral range (Linux: 32768–60999, macOS: 49152–65535), which outgoing connections never
//! use, and each port is claimed with an exclusive `flock` on a file named after it in a
//! directory shared by every test process on the machine. The lock is held until the process
//! exits, so no two tests, in this process or a concurrent `cargo test`, get the same port.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Mutex;

/// Ports handed out: well below every common ephemeral range.
const FIRST: u16 = 20_000;
const LAST: u16 = 32_000;

struct Allocator {
    next: u16,
    /// Lock files of the ports this process holds; closing one would release its port.
    held: Vec<File>,
}

static ALLOCATOR: Mutex<Option<Allocator>> = Mutex::new(None);

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("tb-tests-ports")
}

/// A port on 127.0.0.1 that is free now and that no other test will be given.
pub fn free_port() -> u16 {
    let mut guard = ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner());
    let alloc = guard.get_or_insert_with(|| {
        // Start somewhere different in each process, so concurrent runs rarely probe the same
        // ports (they would skip each other's anyway, thanks to the locks).
        let seed = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos() as u64)
                .unwrap_or(0);
        Allocator {
            next: FIRST + (seed % u64::from(LAST - FIRST)) as u16,
            held: Vec::new(),
        }
    });
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    for _ in FIRST..LAST {
        let port = alloc.next;
        alloc.next = if port + 1 >= LAST { FIRST } else { port + 1 };
        let Some(lock) = claim(&dir, port) else {
            continue;
        };
        // Someone outside the tests may be listening there.
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        alloc.held.push(lock);
        return port;
    }
    panic!("no free port left in {FIRST}..{LAST}");
}

/// `len` consecutive ports on 127.0.0.1, each free now and claimed as [`free_port`] claims
/// one: `(first, last)`, inclusive.
pub fn free_range(len: u16) -> (u16, u16) {
    assert!(len > 0 && len < LAST - FIRST, "a range of {len} ports");
    let mut guard = ALLOCATOR.lock().unwrap_or_else(|e| e.into_inner());
    let alloc = guard.get_or_insert_with(|| Allocator {
        next: FIRST + (std::process::id() % u32::from(LAST - FIRST)) as u16,
        held: Vec::new(),
    });
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    for _ in 0..(LAST - FIRST) / len {
        let start = if alloc.next + len > LAST {
            FIRST
        } else {
            alloc.next
        };
        alloc.next = start + len;
        let mut locks = Vec::new();
        for port in start..start + len {
            match claim(&dir, port) {
                Some(lock) if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() => {
                    locks.push(lock)
                }
                // Taken: drop the locks claimed so far (releasing them) and move on.
                _ => break,
            }
        }
        if locks.len() == usize::from(len) {
            alloc.held.extend(locks);
            return (start, start + len - 1);
        }
    }
    panic!("no {len} consecutive free ports in {FIRST}..{LAST}");
}

/// Held by every test whose `tbctl up` leaves the nodelets' rank ports at their defaults
/// (32323+, above the allocator's range, so they cannot be claimed): one at a time.
pub async fn default_rank_ports() -> tokio::sync::MutexGuard<'static, ()> {
    static DEFAULT_RANK_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    DEFAULT_RANK_PORTS.lock().await
}

/// A port for `tbctl up --port P`, which also takes P+1 (the services listener): both are
/// claimed.
pub fn free_up_port() -> u16 {
    free_range(2).0
}

/// `host:port` on 127.0.0.1 for a fresh port.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Take the machine-wide lock for `port`, or `None` if another process holds it.
fn claim(dir: &std::path::Path, port: u16) -> Option<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{port}.lock")))
        .ok()?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    (rc == 0).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_bindable() {
        let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
        let unique: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!((FIRST..LAST).contains(&p));
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("an allocated port is free");
        }
    }

    #[test]
    fn a_claimed_port_cannot_be_claimed_again() {
        let dir = lock_dir();
        std::fs::create_dir_all(&dir).expect("lock dir");
        let port = free_port();
        // flock locks belong to the open file description: a second open of the same file
        // (as another process would do) must not get the lock.
        assert!(claim(&dir, port).is_none(), "port {port} was claimed twice");
    }
}
