//! tb's end-to-end tests: each module starts tb's real binaries (controllers, nodelets, tbctl,
//! real MLX ranks) on loopback or in network namespaces the test makes, and checks what a user
//! relies on. They are one test binary, so the harness and its dependencies are compiled and
//! linked once: `cargo test -p tb-tests --test e2e MODULE::` runs one module.

mod adapters;
mod api_semantics;
mod auth;
mod backups;
mod bounds;
mod builtin;
mod cli;
mod clock_faults;
mod corrupt_data;
mod cron;
mod dashboard;
mod disk_faults;
mod emulated_lab;
mod examples;
mod exec_paths;
mod fair_share_lab;
mod finetune;
mod first_hour;
mod identity;
mod isolation;
mod jobs;
mod join;
mod linearizability;
mod mlx;
mod partitions;
mod plan;
mod priority_lab;
mod queues_lab;
mod raft_cluster;
mod service_failover;
mod tbctl_jobs;
mod tls;
mod upgrades;
mod watch;
