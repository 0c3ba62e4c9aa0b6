//! tbctl's command line: global flags, verbs and their flags (clap derive).

use std::path::PathBuf;
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
                  (tbctl config set-context), else 127.0.0.1:7400. `tbctl up` starts a cluster on \
                  this machine and makes the context `local` current."
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
    /// The context to use instead of the current one (for `up`: the context it writes and
    /// makes current, default `local`).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NS")]
    pub namespace: Option<String>,
    /// How long one request may take, retries and failovers included (e.g. 10s, 500ms, 2m;
    /// default 10s). For `wait` and `drain`: how long to wait in all (default 60s and 5m).
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// The bearer token to call with (default: $TB_TOKEN, then the context's, from
    /// `tbctl login`). Visible to other users of this machine in the process list: prefer
    /// TB_TOKEN or `tbctl login`.
    #[arg(long, global = true, value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The cluster CA's certificate (a controller's DATA_DIR/ca.pem): speak TLS and verify the
    /// controllers with it (default: $TB_CA_CERT, then the context's, from `tbctl login
    /// --ca-cert` or `tbctl up`; without any, plain TCP, for controllers run with --insecure).
    #[arg(long, global = true, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Send the token over plain TCP when no CA is configured (to a controller run with
    /// --insecure): the token then crosses the network in clear text. Without it tbctl refuses
    /// to send a token without TLS. `tbctl login --insecure` keeps it in the context.
    #[arg(long, global = true)]
    pub insecure: bool,
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
    /// Print the output of a job's ranks: JOB is NAME (a TrainingJob) or KIND/NAME.
    Logs(LogsArgs),
    /// List events, oldest first, and optionally keep printing new ones.
    Events(EventsArgs),
    /// Wait until an object meets a condition, reaches a phase, or is deleted.
    Wait(WaitArgs),
    /// Document a kind or one of its fields: KIND[.field.path].
    Explain(ExplainArgs),
    /// Model files on this machine: `model inspect FILE|DIR` prints a Model manifest for a GGUF
    /// file or a Hugging Face / MLX model directory.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Memory use of the cluster's Macs, or of each queue.
    #[command(subcommand)]
    Top(TopCommand),
    /// Memory·hours and Mac·hours per user, namespace or queue.
    Usage(UsageArgs),
    /// Print an mlx.launch hostfile for a job's current placement.
    Hostfile(HostfileArgs),
    /// Where a job's model would go (Macs, order, layers, memory, tokens/s): a dry run, on the
    /// live cluster or on a described one (--cluster).
    Plan(PlanArgs),
    /// The Macs and the cables between them, with measured bandwidth and latency.
    Topology(TopologyArgs),
    /// Ask an InferenceService through its OpenAI-compatible endpoint; the answer streams out.
    Chat(ChatArgs),
    /// Create an object from another: `create job --from schedule/NAME` runs a Schedule now.
    #[command(subcommand)]
    Create(CreateCommand),
    /// Mark a Node unschedulable: running work stays, no new work is placed on it.
    Cordon(NodeArgs),
    /// Make a Node schedulable again (undoes cordon and drain).
    Uncordon(NodeArgs),
    /// Cordon a Node, ask tb to move its work away, and wait until nothing runs there.
    Drain(NodeArgs),
    /// Join tokens for nodelets.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Start a local cluster on this machine: one controller and N nodelets.
    Up(UpArgs),
    /// Stop the local cluster started by `up`.
    Down(DownArgs),
    /// The controller cluster: status and membership.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Backups of the whole cluster: `snapshot save FILE` (restore with `tb-controller restore`).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Contexts in tbctl's config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a shell completion script.
    Completion(CompletionArgs),
    /// Install tb-controller or tb-nodelet as a service that starts at boot (launchd on macOS,
    /// systemd on Linux); the daemon's flags follow `--`.
    Install(InstallArgs),
    /// Stop and remove a service `tbctl install` made.
    Uninstall(UninstallArgs),
    /// Keep a bearer token (read from --token-file, else stdin) in the current context; with
    /// --ca-cert FILE also the cluster CA (only the CA when --token-file is not given).
    Login(LoginArgs),
    /// Who the server takes you for.
    Whoami,
    /// Ask the server what you may do.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Users and their tokens (admins).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// The audit log of mutations (admins).
    Audit(AuditArgs),
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// A file holding the token (e.g. a controller's admin.token); `-` or absent: stdin.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Whether you may do VERB on KIND: prints yes or no, exits 0 or 1.
    CanI {
        /// get, list, watch, apply, delete, update-status, record-event, create.
        verb: String,
        /// A kind (trainingjob, tj, node, ...) or User, Token, JoinToken, AuditLog,
        /// ClusterMember.
        kind: String,
        /// An object's name, when it matters.
        name: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Users.
    #[command(subcommand)]
    User(AdminUserCommand),
    /// Users' bearer tokens.
    #[command(subcommand)]
    Token(AdminTokenCommand),
}

#[derive(Debug, Subcommand)]
pub enum AdminUserCommand {
    /// Create a user; its first token alone is printed on stdout (shown once).
    Create {
        /// The user's name (lower-case letters, digits, '-' and '.').
        name: String,
        /// admin (everything), member (read all, write jobs in its namespaces), viewer (read).
        #[arg(long, value_parser = ["admin", "member", "viewer"])]
        role: String,
        /// Namespaces a member may write jobs in (besides the one of -n/--namespace, which
        /// may also list several: `--namespace vision,nlp`).
        #[arg(long = "namespaces", value_name = "NS[,NS...]", value_delimiter = ',')]
        namespaces: Vec<String>,
        /// How long the token lives, e.g. 12h, 30d.
        #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_seconds)]
        ttl: u64,
    },
    /// List users and their live tokens (ids and expiry, never the tokens).
    List {
        /// json or yaml instead of the table.
        #[arg(short = 'o', long, value_enum)]
        output: Option<OutputFormat>,
    },
    /// Delete a user and every token it has.
    Delete {
        /// The user to delete.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminTokenCommand {
    /// Another token for a user; it alone is printed on stdout.
    Create {
        /// The user the token speaks for.
        #[arg(long, value_name = "NAME")]
        user: String,
        /// How long the token lives, e.g. 12h, 30d.
        #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_seconds)]
        ttl: u64,
        /// A note kept with the token (where it is used), shown by `admin user list`.
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
    },
    /// Revoke a token by its id (`tbctl admin user list` shows them).
    Revoke {
        /// The token's id (not the token itself).
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this user's records.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Only records this recent, e.g. 1h, 7d.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    pub since: Option<u64>,
    /// json or yaml instead of the table.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
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
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR|-",
        required = true
    )]
    pub files: Vec<String>,
    /// `--dry-run` alone means `--dry-run=server`.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true,
          default_value_t = DryRun::None, default_missing_value = "server")]
    pub dry_run: DryRun,
    /// Then wait until every InferenceService applied is Ready and every TrainingJob runs
    /// (or finished), showing model staging as a progress bar (--timeout, default 10m).
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// A YAML file, a directory of them, or `-` for stdin; may be repeated.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR|-",
        required = true
    )]
    pub files: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Kind (or alias: isvc, tj, ...).
    pub kind: String,
    /// Names; none lists every object of the kind.
    pub names: Vec<String>,
    /// yaml or json (the whole objects), wide (more columns), name (`kind/name` lines);
    /// default: a table.
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
    /// Kind (or alias: isvc, tj, node, ...); `tbctl explain` lists them.
    pub kind: String,
    /// One or more names of objects of that kind, in the namespace of -n.
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
    /// Names of the objects of that kind to delete.
    pub names: Vec<String>,
    /// Delete the objects defined in these files.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-", conflicts_with_all = ["kind", "names"])]
    pub files: Vec<String>,
    /// Treat an object that does not exist as deleted.
    #[arg(long)]
    pub ignore_not_found: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogStream {
    Stdout,
    Stderr,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// NAME (a TrainingJob), or KIND/NAME: tj/NAME, isvc/NAME, trainingjob/NAME, ...
    #[arg(value_name = "JOB")]
    pub job: String,
    /// Only this rank (default: every rank, each line prefixed `[rank N] `).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=i64::from(i32::MAX)))]
    pub rank: Option<u32>,
    /// Keep printing lines as they are written.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// The last N lines of each rank (default: all that are kept).
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub tail: i64,
    /// Only lines newer than this, e.g. 30s, 10m, 1h.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    pub since: Option<u64>,
    /// Only this stream (default: both, stderr lines printed to stdout too).
    #[arg(long, value_enum, value_name = "STREAM")]
    pub stream: Option<LogStream>,
    /// Print each line's time (RFC 3339 UTC, milliseconds) before it.
    #[arg(long)]
    pub timestamps: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventsOutput {
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events about this object, KIND/NAME (e.g. tj/train, node/mac1).
    #[arg(long = "for", value_name = "KIND/NAME")]
    pub for_: Option<String>,
    /// After listing, print new events as they happen.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// json or yaml: the Event objects whole (`items: [...]`; with -w one
    /// `{"type", "object"}` line or document per change); default: a table (LAST SEEN, TYPE,
    /// REASON, OBJECT, MESSAGE).
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<EventsOutput>,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The object, KIND/NAME (e.g. tj/train, isvc/chat, node/mac1).
    #[arg(value_name = "KIND/NAME")]
    pub target: String,
    /// `condition=TYPE[=STATUS]` (STATUS defaults to True), `phase=PHASE`, or `delete`.
    #[arg(long = "for", value_name = "CONDITION", required = true, value_parser = crate::commands::wait::parse_wait_for)]
    pub for_: crate::commands::wait::WaitFor,
}

#[derive(Debug, Subcommand)]
pub enum TopCommand {
    /// Memory of each Mac: total, allocatable, allocated to tb's work, free.
    #[command(visible_alias = "node", alias = "no")]
    Nodes,
    /// Each queue: usage against quota, borrowing, pending jobs, fair share.
    #[command(visible_alias = "queue", alias = "q")]
    Queues,
}

/// `tbctl usage`: memory·hours and Mac·hours.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only usage this recent, e.g. 1h, 30d (hourly buckets; 90 days are kept).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    pub since: Option<u64>,
    /// One line per user, namespace or queue.
    #[arg(long, value_enum, default_value_t = UsageBy::User)]
    pub by: UsageBy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageBy {
    User,
    Namespace,
    Queue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostfileFormat {
    /// mlx.launch's JSON hostfile: {"backend", "envs", "hosts": [{"ssh", "ips", "rdma"}]}.
    Mlx,
    /// MLX's ring hostfile (MLX_HOSTFILE): [["ip:port"], ...] in rank order.
    Ring,
}

#[derive(Debug, Args)]
pub struct HostfileArgs {
    /// NAME (a TrainingJob), or KIND/NAME: tj/NAME, isvc/NAME, ...
    #[arg(value_name = "JOB")]
    pub job: String,
    /// Write the hostfile here instead of to stdout.
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Which hostfile: mlx.launch's JSON (mlx) or MLX's ring hostfile (ring).
    #[arg(long, value_enum, default_value_t = HostfileFormat::Mlx)]
    pub format: HostfileFormat,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Read a GGUF file's header (not its weights) and print a Model manifest for it: its
    /// architecture, layers, sizes, heads, context, vocabulary, quantisation and file size,
    /// ready for `tbctl apply -f`. Needs no server.
    Inspect(ModelInspectArgs),
}

#[derive(Debug, Args)]
pub struct ModelInspectArgs {
    /// A .gguf file, a directory holding exactly one, or a Hugging Face / MLX model directory
    /// (config.json, and the .safetensors files when they are there).
    #[arg(value_name = "FILE|DIR")]
    pub target: PathBuf,
    /// The Model's name (default: from the file name, e.g. smollm2-135m-instruct-q4-1).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The path to write as spec.source.path, where the nodes find the file (default: this
    /// file's absolute path; `~/` means the home of the user the nodelet runs as).
    #[arg(long, value_name = "PATH")]
    pub path: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum CreateCommand {
    /// A TrainingJob from a Schedule's template, started now.
    #[command(visible_alias = "trainingjob")]
    Job(CreateJobArgs),
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The InferenceService.
    pub name: String,
    /// What to ask.
    pub prompt: String,
    /// A system message first.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate (the service's default when absent).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// 0 picks the likeliest token every time.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
}

#[derive(Debug, Args)]
pub struct CreateJobArgs {
    /// The job's name (default: SCHEDULE-manual-TIMESTAMP).
    pub name: Option<String>,
    /// schedule/NAME.
    #[arg(long, value_name = "schedule/NAME", required = true)]
    pub from: String,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Files with the job(s) to plan, and their Model(s) unless the cluster has them.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<String>,
    /// Plan against a described lab (Macs, memory, links) instead of the live cluster; needs
    /// no server.
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<String>,
    /// table (for people), json or yaml (the plan as data).
    #[arg(short = 'o', long, value_enum, default_value_t = PlanOutput::Table)]
    pub output: PlanOutput,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanOutput {
    Table,
    /// The ordered Macs with their layers, memory and the prediction.
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct TopologyArgs {
    #[command(subcommand)]
    pub command: Option<TopologyCommand>,
    /// table (Macs, links and a picture), dot (Graphviz) or json.
    #[arg(short = 'o', long, value_enum, default_value_t = TopologyOutput::Table)]
    pub output: TopologyOutput,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopologyOutput {
    /// Tables of Macs and links, and a picture of who is cabled to whom.
    Table,
    /// Graphviz.
    Dot,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// Measure links again (all, or the ones named).
    Probe(ProbeArgs),
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Link names (`tbctl get links`); none means every link.
    pub links: Vec<String>,
    /// Wait for the new measurements (up to --timeout, default 60s) and print them.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The Node's name.
    #[arg(value_name = "NODE")]
    pub node: String,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a join token; it alone is printed on stdout (`tbctl token create > FILE`), to
    /// hand to `tb-nodelet --join-token-file FILE` (or TB_JOIN_TOKEN).
    Create {
        /// How long the token may be used to join, e.g. 30m, 24h, 7d.
        #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_seconds)]
        ttl: u64,
        /// How many nodes may join with it (default: one).
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        uses: u32,
        /// The only node name it joins as. Such a token also replaces the credential of a Node
        /// of that name that already joined (a reinstalled Mac); no other token can.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// A note kept with the token, e.g. who it is for.
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// How many nodelets to start (node-1 .. node-N).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodelets: u32,
    /// Where the processes keep their state and logs (default: $XDG_DATA_HOME/tb, else
    /// ~/.local/share/tb).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The port the controller serves on, on 127.0.0.1 (the nodelets' rank ports stay at
    /// 32323+100·(i-1); --port-range moves them all).
    #[arg(long, value_name = "P", default_value_t = 7400, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Take every port from START-END, so that a second local cluster (with its own
    /// --data-dir and --context) does not collide with the first: the controller gets START,
    /// node-i's endpoint START+i, and the rest is split among the nodelets for ranks and
    /// services' endpoints (up to 100 each, at least 8).
    #[arg(long, value_name = "START-END", conflicts_with = "port", value_parser = crate::portplan::parse_port_range)]
    pub port_range: Option<crate::portplan::PortRange>,
    /// CPU threads each nodelet gives a built-in rank (its `--engine-threads`). Default: the
    /// machine's cores shared among the nodelets (at least 1 each), so that ranks placed side
    /// by side on this one machine do not run more threads than it has cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub engine_threads: Option<u32>,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// The directory given to `up` (same default).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Also delete the directory: the cluster's objects, the nodelets' identities and the logs.
    #[arg(long)]
    pub purge: bool,
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
        /// json (for scripts) or wide (more Raft columns); default: a table.
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
    RemoveMember {
        /// The controller's id (its --id; `tbctl cluster status` lists them).
        id: u64,
    },
    /// Print the controller join token (admins only): a new controller joins with
    /// `tb-controller --id N --listen ADDR --data-dir DIR --join https://MEMBER:PORT
    /// --token-file FILE` (or TB_JOIN_TOKEN). It pins the cluster CA by hash and gets the
    /// joiner the CA key and the cluster secret: keep it like them (a file only you can read).
    JoinToken {
        /// Make a new token first: the old one stops working at once (controllers that joined
        /// with it stay members), and every member's DATA_DIR/join.token is rewritten.
        #[arg(long)]
        rotate: bool,
        /// Write the token to FILE (created mode 0600, replaced if it exists) instead of
        /// printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent copy of every object, user, token hash and schedule, taken on the
    /// leader after every acknowledged write, to FILE (written whole, mode 0600: it holds
    /// credential hashes). Admins only.
    Save {
        /// The file to write (replaced whole if it exists).
        file: std::path::PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClusterOutput {
    Json,
    Wide,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Make a context the current one.
    UseContext {
        /// The context's name (`tbctl config get-contexts` lists them).
        name: String,
    },
    /// Create or change a context; its servers come from --server, its namespace from -n.
    SetContext {
        /// The context's name; created when it does not exist.
        name: String,
    },
    /// List contexts; `*` marks the current one.
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell to complete for (source the output from its startup file).
    #[arg(value_enum)]
    pub shell: Shell,
}

/// One of tb's daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Daemon {
    /// tb-controller.
    Controller,
    /// tb-nodelet.
    Nodelet,
}

/// A service manager's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    /// A launchd LaunchDaemon property list.
    Macos,
    /// A systemd unit.
    Linux,
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Which daemon to install.
    #[arg(value_enum)]
    pub daemon: Daemon,
    /// The daemon's binary (default: the one beside tbctl, else the PATH's).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// The account the daemon runs as (default root; a nodelet must be root to run jobs under
    /// accounts of their own).
    #[arg(long)]
    pub user: Option<String>,
    /// Where launchd writes the daemon's output (systemd keeps it in the journal).
    #[arg(long, default_value = "/var/log/tb")]
    pub log_dir: PathBuf,
    /// Print the file instead of writing and loading it (needs no root).
    #[arg(long)]
    pub dry_run: bool,
    /// Render another system's file (with --dry-run).
    #[arg(long, value_enum)]
    pub platform: Option<Platform>,
    /// The daemon's own flags, after `--` (secrets only as files: --join-token-file).
    #[arg(last = true)]
    pub daemon_args: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Which daemon's service to remove.
    #[arg(value_enum)]
    pub daemon: Daemon,
}

/// `10s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
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

/// A whole number of seconds, positive, as `30s`, `10m`, `1h30m`, `7d` (tb_api's durations).
pub fn parse_seconds(s: &str) -> Result<u64, String> {
    match tb_api::duration::parse_duration(s)? {
        0 => Err(format!("{s:?}: expected a positive duration")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every subcommand and every argument (flag or positional) of `cmd` and below without help
    /// text, as `tbctl SUB.. --flag` paths. clap's own `--help`/`--version` have theirs.
    fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.is_hide_set() || matches!(id, "help" | "version") {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                let name = match (arg.get_long(), arg.get_short()) {
                    (Some(l), _) => format!("--{l}"),
                    (None, Some(s)) => format!("-{s}"),
                    (None, None) => id.to_uppercase(),
                };
                out.push(format!("{path} {name}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() || sub.get_name() == "help" {
                continue;
            }
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                out.push(format!("{sub_path} (the subcommand)"));
            }
            missing_help(sub, &sub_path, out);
        }
    }

    #[test]
    fn every_subcommand_and_argument_has_help() {
        let mut cmd = Cli::command();
        // Global flags are copied into every subcommand when the tree is built.
        cmd.build();
        let mut missing = Vec::new();
        missing_help(&cmd, "tbctl", &mut missing);
        assert!(
            missing.is_empty(),
            "without help text (add a /// doc comment):\n  {}",
            missing.join("\n  ")
        );
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
    fn whole_second_durations() {
        assert_eq!(parse_seconds("30s"), Ok(30));
        assert_eq!(parse_seconds("10m"), Ok(600));
        assert_eq!(parse_seconds("1h"), Ok(3600));
        assert_eq!(parse_seconds("1h30m"), Ok(5400));
        assert_eq!(parse_seconds("7d"), Ok(7 * 86400));
        for bad in ["", "0s", "10", "1.5h", "-1m", "10x", "ten minutes"] {
            assert!(parse_seconds(bad).is_err(), "{bad:?}");
        }
        assert!(parse_seconds("10").expect_err("unitless").contains("30m"));
    }

    #[test]
    fn logs_flags() {
        let logs = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Logs(a)) => Ok(a),
            Ok(_) => unreachable!("logs"),
            Err(e) => Err(e),
        };
        let a = logs(&["tbctl", "logs", "tj/x"]).expect("defaults");
        assert_eq!(
            (a.rank, a.follow, a.tail, a.since, a.stream),
            (None, false, -1, None, None)
        );
        let a = logs(&[
            "tbctl", "logs", "x", "--rank", "2", "-f", "--tail", "50", "--since", "10m",
            "--stream", "stderr",
        ])
        .expect("all flags");
        assert_eq!(
            (a.rank, a.follow, a.tail, a.since, a.stream),
            (Some(2), true, 50, Some(600), Some(LogStream::Stderr))
        );
        assert_eq!(
            logs(&["tbctl", "logs", "x", "--tail", "-1"])
                .expect("tail -1")
                .tail,
            -1
        );
        for bad in [
            &["tbctl", "logs", "x", "--tail", "-2"][..],
            &["tbctl", "logs", "x", "--rank", "-1"],
            &["tbctl", "logs", "x", "--since", "0s"],
            &["tbctl", "logs", "x", "--since", "soon"],
            &["tbctl", "logs", "x", "--stream", "both"],
            &["tbctl", "logs"],
        ] {
            assert!(logs(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timeout_is_optional_so_wait_and_drain_can_default_it() {
        let cli = Cli::try_parse_from(["tbctl", "get", "tj"]).expect("parse");
        assert_eq!(cli.global.timeout, None);
        let cli =
            Cli::try_parse_from(["tbctl", "wait", "tj/x", "--for=delete", "--timeout", "90s"])
                .expect("parse");
        assert_eq!(cli.global.timeout, Some(Duration::from_secs(90)));
        let cli = Cli::try_parse_from(["tbctl", "drain", "mac1", "--timeout=5m"]).expect("parse");
        assert_eq!(cli.global.timeout, Some(Duration::from_secs(300)));
        assert!(
            Cli::try_parse_from(["tbctl", "wait", "tj/x"]).is_err(),
            "--for is required"
        );
    }

    #[test]
    fn token_and_local_cluster_flags() {
        match Cli::try_parse_from(["tbctl", "token", "create"])
            .expect("parse")
            .command
        {
            Command::Token(TokenCommand::Create {
                ttl,
                uses,
                node,
                description,
            }) => {
                assert_eq!((ttl, uses, node, description), (86400, 1, None, None));
            }
            _ => unreachable!("token"),
        }
        match Cli::try_parse_from([
            "tbctl",
            "token",
            "create",
            "--ttl",
            "1h",
            "--description",
            "mac3",
            "--uses",
            "3",
            "--node",
            "mac3",
        ])
        .expect("parse")
        .command
        {
            Command::Token(TokenCommand::Create {
                ttl,
                uses,
                node,
                description,
            }) => {
                assert_eq!(
                    (ttl, uses, node.as_deref(), description.as_deref()),
                    (3600, 3, Some("mac3"), Some("mac3"))
                );
            }
            _ => unreachable!("token"),
        }
        match Cli::try_parse_from(["tbctl", "up"]).expect("parse").command {
            Command::Up(a) => assert_eq!(
                (a.nodelets, a.port, a.data_dir, a.port_range),
                (2, 7400, None, None)
            ),
            _ => unreachable!("up"),
        }
        assert!(Cli::try_parse_from(["tbctl", "token", "create", "--uses", "0"]).is_err());
        assert!(Cli::try_parse_from(["tbctl", "up", "--nodelets", "0"]).is_err());
        assert!(Cli::try_parse_from(["tbctl", "up", "--port", "0"]).is_err());
        assert!(Cli::try_parse_from(["tbctl", "up", "--port-range", "41000-41999"]).is_ok());
        assert!(
            Cli::try_parse_from([
                "tbctl",
                "up",
                "--port",
                "7500",
                "--port-range",
                "41000-41999"
            ])
            .is_err(),
            "--port and --port-range conflict"
        );
        assert!(Cli::try_parse_from(["tbctl", "down", "--purge", "--data-dir", "/tmp/x"]).is_ok());
        assert!(Cli::try_parse_from(["tbctl", "top", "nodes"]).is_ok());
        assert!(Cli::try_parse_from(["tbctl", "top", "no"]).is_ok());
        assert!(
            Cli::try_parse_from(["tbctl", "hostfile", "x", "--format", "ring", "-o", "h.json"])
                .is_ok()
        );
        assert!(Cli::try_parse_from(["tbctl", "hostfile", "x", "--format", "mpi"]).is_err());
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = Cli::try_parse_from([
            "tbctl", "get", "isvc", "-n", "team", "--server", "a:1", "-o", "json",
        ])
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
        assert_eq!(
            dry(&["tbctl", "apply", "-f", "x", "--dry-run"]),
            DryRun::Server
        );
        assert_eq!(
            dry(&["tbctl", "apply", "--dry-run=client", "-f", "x"]),
            DryRun::Client
        );
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
