//! tb-nodelet as a library: the parts of the agent that the `tb-nodelet` binary wires together
//! and that tests exercise directly.
//!
//! - [`discovery`]: Thunderbolt ports, cabled peers and RDMA devices, parsed from macOS's tools.
//! - [`capacity`]: what this machine has (memory, CPU, GPU, memory pressure), read from the OS.
//! - [`exec`]: the exec executor: supervised process groups with rotating logs.
//! - [`mlx`]: the MLX distributed contract: hostfiles, device matrices and per-rank environment.

pub mod agent;
pub mod capacity;
pub mod discovery;
pub mod exec;
pub mod mlx;
