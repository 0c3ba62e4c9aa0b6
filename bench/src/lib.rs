//! tb's benchmarks. `controller-bench` runs a 3-member tb controller cluster and a 3-member
//! etcd cluster on this machine, one after the other, drives both with the same client code
//! (the same writes, the same concurrency, the same leader-seeking failover), and prints a
//! markdown table: throughput, p50/p99 latency, leader-failover time and memory.
//!
//! Layout: `backend` is the two-method seam between the client and a system under test, with
//! `tb` and `etcd` behind it; `member` runs one server process; `cluster` groups three of them
//! and waits for health; `client` finds the leader and fails over; `load` and `failover` are
//! the two experiments; `stats`, `machine` and `report` turn measurements into the table.
//!
//! `jobs-bench` runs one controller and four nodelets, times apply → all ranks of a job
//! running, samples the idle nodelets' memory and CPU, and does the same with Slurm (slurmctld
//! and slurmd) where it is installed. Its parts are under `jobs`; `procstat` samples `/proc`,
//! and `binaries` builds tb and finds other programs for both benchmarks.
//!
//! `scheduler-bench` (`scheduler`) drives the real scheduler and state machine in virtual time
//! over 64 simulated Macs and 5,000 queued jobs: admissions/s, freed → admitted, fairness.
//!
//! `pipeline-bench` and `serve-bench` drive tb's built-in engine (and llama.cpp's
//! `llama-server`) through their OpenAI-compatible streaming endpoints: `openai_load` starts
//! the servers on loopback and reads one streamed completion with the time of every token.

pub mod backend;
pub mod bench;
pub mod binaries;
pub mod client;
pub mod cluster;
pub mod etcd;
pub mod failover;
pub mod jobs;
pub mod llama_rpc;
pub mod load;
pub mod machine;
pub mod member;
pub mod openai_load;
pub mod payload;
pub mod placement;
pub mod ports;
pub mod procstat;
pub mod report;
pub mod scheduler;
pub mod scheduler_raft;
pub mod secure;
pub mod stats;
pub mod tb;

/// etcd's v3 gRPC API (the subset in `proto/etcd.proto`), generated at build time.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
