//! tb-core: the parts of tb that are pure functions of their input, shared by the controller,
//! tbctl and the benchmarks.
//!
//! - `store`: the deterministic state every controller replicates and the commands that change
//!   it (the Raft state machine applies them; nothing here does I/O);
//! - `scheduler`: a pure function from a snapshot of that state to a plan of writes, which the
//!   store commits (Nomad's shape);
//! - `placement`: how a model's layers are split across Macs, from the measured topology and
//!   each Mac's memory, and the tokens/s that split should give;
//! - `sim`: a simulated cluster (the real store and scheduler in virtual time) for tests and
//!   benchmarks.
//!
//! No tokio runtime, no sockets, no files: everything here runs the same in a test, a bench and
//! on every member of the cluster.

pub mod placement;
pub mod scheduler;
pub mod sim;
pub mod store;
