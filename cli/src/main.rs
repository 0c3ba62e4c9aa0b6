//! `tbctl`: the command-line client of tb. Parses the command line, sets up logging, runs the
//! verb, and turns the outcome into an exit code: 0 ok, 1 error (`diff`: 1 changes, 2 error),
//! with errors printed to stderr as `error: ...`. `wait` and `drain` exit 1 when their
//! `--timeout` passes (and `wait` at once when the job it waits on fails); `up` exits 0 when
//! its cluster is already running.
//!
//! Verbs: apply, diff, get, describe, delete, logs, events, wait, explain, top nodes, hostfile,
//! cordon, uncordon, drain, token create, login, whoami, auth can-i, admin, audit, up, down,
//! cluster, config, completion; each in its
//! own module under `commands/`.

mod args;
mod columns;
mod commands;
mod config;
mod linediff;
mod local;
mod manifests;
mod output;
mod portplan;

use std::process::ExitCode;

// The connection to the controllers (failover, retries, TLS, the token, server lists) is
// tb-client's, shared with the nodelet and the tests.
use tb_client::addr as servers;
use tb_client::{client, tls};

use clap::Parser;

use crate::args::{Cli, Command, LogFormat};
use crate::commands::{Reported, print_error};

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.global.log_format);
    // `diff` keeps 1 for "there are changes", so its errors exit 2.
    let error_code = if matches!(cli.command, Command::Diff(_)) {
        2
    } else {
        1
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            print_error(&format!("starting the async runtime: {e}"));
            return ExitCode::from(error_code);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if let Some(Reported(code)) = e.downcast_ref::<Reported>() {
                // The command printed its errors; keep diff's error code distinct from "changes".
                return ExitCode::from((*code).max(error_code));
            }
            if is_broken_pipe(&e) {
                // The reader went away (`tbctl get -w | head`): nothing more to say.
                return ExitCode::SUCCESS;
            }
            print_error(&format!("{e:#}"));
            ExitCode::from(error_code)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
