//! Harness for tb's end-to-end tests: everything here starts or talks to the real binaries
//! (`tb-controller`, `tbctl`) over real sockets on 127.0.0.1.
//!
//! - [`bins`] finds the binaries in the workspace's target directory, building them once per
//!   test process so a test never runs a stale build;
//! - [`ports`] hands out loopback ports that no other test (in this process or another) uses;
//! - [`workdir`] makes a temporary directory per test, kept (and its path printed) when the test
//!   fails;
//! - [`controller`] is one `tb-controller` process: start, SIGKILL, SIGTERM, restart on the same
//!   data directory, with its log captured to a file whose tail is printed when a test fails;
//! - [`cluster`] starts 1, 3 (or more) controllers as one Raft cluster and answers questions
//!   about it (who leads, have all members applied the same log);
//! - [`client`] holds gRPC connections and retries a write on other members with the same
//!   `request_id` when its outcome is unknown;
//! - [`objects`] builds the JSON objects the tests apply and reads fields back;
//! - [`netns`] builds an emulated lab as root: network namespaces as Macs, shaped links as
//!   cables, the real binaries inside;
//! - [`partition`] cuts and heals the emulated lab's network (one way, both ways, a cable);
//! - [`rank0`] asks rank 0 of a built-in service at its own endpoint (HTTPS with the
//!   service's certificate, the service's key), as the controllers' forwarder does;
//! - [`ranks`] samples which ranks of a job run, from the process table (fencing checks);
//! - [`linearizability`] records register histories and checks them (e2e tests, `tb-chaos`);
//! - [`tbctl`] runs the CLI and captures its exit code and output;
//! - [`wait`] polls a condition until a deadline, so tests never sleep for a guessed time.
//!
//! When a test fails it prints its progress lines ([`step!`]), the last lines of every
//! controller's log, and the path of its directory, which is kept (data directories and full
//! logs). Knobs, all optional:
//! - `TB_TEST_KEEP=1` keeps the directories of passing tests too;
//! - `TB_TEST_BIN_DIR=DIR` uses prebuilt binaries from DIR instead of building them;
//! - `RUST_LOG` is passed on to the controllers (default `info,openraft=warn`).

pub mod auth;
pub mod bins;
pub mod client;
pub mod cluster;
pub mod controller;
pub mod lab;
pub mod linearizability;
pub mod netns;
pub mod objects;
pub mod partition;
pub mod ports;
pub mod rank0;
pub mod ranks;
pub mod tbctl;
pub mod wait;
pub mod workdir;

pub use client::{Client, is_retryable};
pub use cluster::{Cluster, ClusterOptions};
pub use controller::{Controller, ControllerConfig};
pub use tbctl::{Tbctl, TbctlOutput};
pub use workdir::TestDir;

/// Print a progress line with the time since the process started; shown only when a test fails
/// (the test harness captures output), where it tells which phase the test was in.
#[macro_export]
macro_rules! step {
    ($($arg:tt)*) => {
        eprintln!("[{:>7.2}s] {}", $crate::elapsed_secs(), format_args!($($arg)*))
    };
}

/// Seconds since the harness was first used in this process.
pub fn elapsed_secs() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// Every nodelet a test starts (itself or through `tbctl up`) skips measuring the built-in
/// engine: a few seconds of CPU per nodelet, on a machine running many of them at once, and a
/// figure no test but the one that asks for it reads.
pub const ENGINE_CALIBRATION: (&str, &str) = ("TB_ENGINE_CALIBRATION", "off");
