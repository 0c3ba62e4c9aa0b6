//! tb-nodelet as a library: the parts of the agent that the `tb-nodelet` binary wires together
//! and that tests exercise directly.
//!
//! - [`discovery`]: Thunderbolt ports, cabled peers, addresses and RDMA devices, parsed from
//!   macOS's tools or Linux's sysfs.
//! - [`topology`]: `--topology FILE`, a described lab: ports and capacity from a file.
//! - [`probe`]: link probes: the probe server, the prober, and the loop that measures Links.
//! - [`capacity`]: what this machine has (memory, CPU, GPU, memory pressure), read from the OS.
//! - [`exec`]: the exec executor: supervised process groups with rotating logs.
//! - [`mlx`]: the MLX distributed contract: hostfiles, device matrices and per-rank environment.
//!
//! The data plane (bootstrap, TCP and RDMA transports, collectives) is the `tb-transport` crate.

pub mod agent;
pub mod builtin;
pub mod capacity;
pub mod discovery;
pub mod exec;
pub mod mlx;
pub mod probe;
pub mod staging;
pub mod topology;
