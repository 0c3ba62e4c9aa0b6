//! tbctl's command line: global flags, verbs and their flags (clap derive).

use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use crate::output::OutputFormat;

#[derive(Debug, Parser)]
#[command(
    name = "tbctl",
    version,
    about = "Control a tb cluster: apply, inspect and delete the jobs and services running on your Macs",
    propagate_version = true,
    after_help = "Servers are taken from --server, else $TB_SERVER, else the current context \
                  (tbctl config set-context), else 127.0.0.1:7400."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Controllers to talk to, tried in order: HOST:PORT[,HOST:PORT...] (default: $TB_SERVER,
    /// then the context's servers).
    #[arg(long, global = true, value_name = "HOST:PORT[,...]")]
    pub server: Option<String>,
    /// The context to use instead of the current one.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NS")]
    pub namespace: Option<String>,
    /// How long one request may take, retries and failovers included (e.g. 10s, 500ms, 2m).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Format of log lines on stderr (verbosity from RUST_LOG, default warn).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update objects from YAML files, all or none.
    Apply(ApplyArgs),
    /// Show what `apply` would change; exit 0: no changes, 1: changes, 2: error.
    Diff(DiffArgs),
    /// List objects or show some by name.
    Get(GetArgs),
    /// Show an object in detail, with its conditions and recent events.
    Describe(DescribeArgs),
    /// Delete objects by name or as listed in files.
    Delete(DeleteArgs),
    /// Document a kind or one of its fields: KIND[.field.path].
    Explain(ExplainArgs),
    /// The controller cluster: status and membership.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Contexts in tbctl's config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a shell completion script.
    Completion(CompletionArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    /// Apply for real.
    None,
    /// Check the objects locally; contact no server.
    Client,
    /// Let the server compute the outcome without storing anything.
    Server,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A YAML file, a directory of them, or `-` for stdin; may be repeated.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", required = true)]
    pub files: Vec<String>,
    /// `--dry-run` alone means `--dry-run=server`.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true,
          default_value_t = DryRun::None, default_missing_value = "server")]
    pub dry_run: DryRun,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// A YAML file, a directory of them, or `-` for stdin; may be repeated.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", required = true)]
    pub files: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Kind (or alias: isvc, tj, ...).
    pub kind: String,
    /// Names; none lists every object of the kind.
    pub names: Vec<String>,
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
    /// Label selector, e.g. `app=chat,tier!=dev`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// After listing, print changes as they happen.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Read from the answering controller's copy, which may lag the leader.
    #[arg(long)]
    pub stale: bool,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    pub kind: String,
    #[arg(required = true)]
    pub names: Vec<String>,
    /// Read from the answering controller's copy, which may lag the leader.
    #[arg(long)]
    pub stale: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["kind", "files"])))]
pub struct DeleteArgs {
    /// Kind (or alias) of the objects to delete.
    #[arg(requires = "names")]
    pub kind: Option<String>,
    pub names: Vec<String>,
    /// Delete the objects defined in these files.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", conflicts_with_all = ["kind", "names"])]
    pub files: Vec<String>,
    /// Treat an object that does not exist as deleted.
    #[arg(long)]
    pub ignore_not_found: bool,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// KIND or KIND.field.path, e.g. `isvc.spec.nodes`.
    #[arg(value_name = "KIND[.FIELD]")]
    pub target: String,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Members, their roles and Raft progress.
    Status {
        #[arg(short = 'o', long, value_enum)]
        output: Option<ClusterOutput>,
    },
    /// Add a controller (it joins as a learner, then becomes a voter).
    AddMember {
        /// The new controller's id (its --id).
        id: u64,
        /// The address it serves on, HOST:PORT.
        address: String,
    },
    /// Remove a controller from the cluster.
    RemoveMember { id: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClusterOutput {
    Json,
    Wide,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Make a context the current one.
    UseContext { name: String },
    /// Create or change a context; its servers come from --server, its namespace from -n.
    SetContext { name: String },
    /// List contexts; `*` marks the current one.
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `10s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration such as 10s, 500ms or 2m"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use ms, s, m or h")),
    };
    if !(secs > 0.0 && secs < 1e9) {
        return Err(format!("{s:?}: expected a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "0s", "-1s", "10x", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = Cli::try_parse_from(["tbctl", "get", "isvc", "-n", "team", "--server", "a:1", "-o", "json"])
            .expect("parse");
        assert_eq!(cli.global.namespace.as_deref(), Some("team"));
        assert_eq!(cli.global.server.as_deref(), Some("a:1"));
    }

    #[test]
    fn dry_run_forms() {
        let dry = |args: &[&str]| match Cli::try_parse_from(args).expect("parse").command {
            Command::Apply(a) => a.dry_run,
            _ => unreachable!("apply"),
        };
        assert_eq!(dry(&["tbctl", "apply", "-f", "x"]), DryRun::None);
        assert_eq!(dry(&["tbctl", "apply", "-f", "x", "--dry-run"]), DryRun::Server);
        assert_eq!(dry(&["tbctl", "apply", "--dry-run=client", "-f", "x"]), DryRun::Client);
    }

    #[test]
    fn delete_needs_names_or_files() {
        assert!(Cli::try_parse_from(["tbctl", "delete"]).is_err());
        assert!(Cli::try_parse_from(["tbctl", "delete", "isvc"]).is_err());
        assert!(Cli::try_parse_from(["tbctl", "delete", "isvc", "a", "-f", "x"]).is_err());
        assert!(Cli::try_parse_from(["tbctl", "delete", "isvc", "a", "b"]).is_ok());
        assert!(Cli::try_parse_from(["tbctl", "delete", "-f", "x.yaml"]).is_ok());
    }
}
