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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_offer_every_verb() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut cmd = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "tbctl", &mut script);
            let script = String::from_utf8_lossy(&script);
            for verb in [
                "logs", "events", "wait", "top", "hostfile", "cordon", "uncordon", "drain",
                "token", "up", "down",
            ] {
                assert!(script.contains(verb), "{shell}: {verb}");
            }
            // Fish writes long options as `-l follow`.
            assert!(
                script.contains("follow") && script.contains("nodelets"),
                "{shell}"
            );
        }
    }
}
