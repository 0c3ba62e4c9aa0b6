//! The object store: the deterministic state every controller replicates (from `tb-core`), and
//! the watch hub that turns applied changes into watch streams.

pub use tb_core::store::*;

pub mod watch;

pub use watch::WatchHub;
