//! `tbctl completion SHELL`: a completion script for bash, zsh, fish (and the other shells
//! clap_complete knows).

use anyhow::Result;
use clap::CommandFactory;

use crate::args::{Cli, CompletionArgs};

pub fn run(args: CompletionArgs) -> Result<()> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "tbctl", &mut script);
    crate::output::emit(&String::from_utf8_lossy(&script))
}
