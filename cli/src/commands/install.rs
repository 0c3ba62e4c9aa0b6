//! `tbctl install controller|nodelet` and `tbctl uninstall`: tb's daemons as services that start
//! at boot and restart when they die — a launchd LaunchDaemon on macOS
//! (`/Library/LaunchDaemons/dev.tb.NAME.plist`, loaded with `launchctl bootstrap system`), a
//! systemd unit on Linux (`/etc/systemd/system/tb-NAME.service`, `systemctl enable --now`).
//!
//! The files are rendered by pure functions (tested on both platforms' formats whatever the
//! host); writing them and asking the service manager to load them is the thin part. Installing
//! the same thing twice changes nothing; the daemon's own flags follow `--`, and no secret goes
//! into the file: tokens stay in the files the daemons read (`--join-token-file`).

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, Result, bail};

use crate::args::{Daemon, InstallArgs, Platform, UninstallArgs};

/// What one installed service is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub daemon: Daemon,
    /// The daemon's binary, absolute.
    pub program: PathBuf,
    /// Its flags.
    pub args: Vec<String>,
    /// The account it runs as (root when None).
    pub user: Option<String>,
    /// Where its stdout and stderr go (launchd; systemd keeps them in the journal).
    pub log_dir: PathBuf,
}

impl Daemon {
    fn binary(self) -> &'static str {
        match self {
            Daemon::Controller => "tb-controller",
            Daemon::Nodelet => "tb-nodelet",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Daemon::Controller => "controller",
            Daemon::Nodelet => "nodelet",
        }
    }
}

/// launchd's label of a daemon.
pub fn label(daemon: Daemon) -> String {
    format!("dev.tb.{}", daemon.short())
}

/// Where the service file of `daemon` goes on `platform`.
pub fn unit_path(platform: Platform, daemon: Daemon) -> PathBuf {
    match platform {
        Platform::Macos => PathBuf::from(format!("/Library/LaunchDaemons/{}.plist", label(daemon))),
        Platform::Linux => {
            PathBuf::from(format!("/etc/systemd/system/tb-{}.service", daemon.short()))
        }
    }
}

/// The service file for `platform`.
pub fn render(platform: Platform, s: &Service) -> String {
    match platform {
        Platform::Macos => render_plist(s),
        Platform::Linux => render_systemd(s),
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A LaunchDaemon: started at boot (RunAtLoad), restarted whenever it exits (KeepAlive), its
/// output in `log_dir`.
pub fn render_plist(s: &Service) -> String {
    let mut out = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \
         \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n<dict>\n",
    );
    out += &format!(
        "  <key>Label</key>\n  <string>{}</string>\n",
        xml(&label(s.daemon))
    );
    out += "  <key>ProgramArguments</key>\n  <array>\n";
    for a in std::iter::once(s.program.display().to_string()).chain(s.args.iter().cloned()) {
        out += &format!("    <string>{}</string>\n", xml(&a));
    }
    out += "  </array>\n";
    out += "  <key>RunAtLoad</key>\n  <true/>\n  <key>KeepAlive</key>\n  <true/>\n";
    // launchd restarts a crashing daemon at most every 10 s by default; say so explicitly.
    out += "  <key>ThrottleInterval</key>\n  <integer>10</integer>\n";
    if let Some(user) = &s.user {
        out += &format!("  <key>UserName</key>\n  <string>{}</string>\n", xml(user));
    }
    let log = s.log_dir.join(format!("{}.log", s.daemon.binary()));
    let log = xml(&log.display().to_string());
    out += &format!("  <key>StandardOutPath</key>\n  <string>{log}</string>\n");
    out += &format!("  <key>StandardErrorPath</key>\n  <string>{log}</string>\n");
    out += "</dict>\n</plist>\n";
    out
}

/// One word of a systemd command line: quoted when it needs it, `%` and `$` escaped (systemd
/// would expand them).
fn systemd_word(w: &str) -> String {
    let escaped = w
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%")
        .replace('$', "$$");
    if escaped.is_empty()
        || escaped
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == ';')
    {
        format!("\"{escaped}\"")
    } else {
        escaped
    }
}

/// A systemd unit: after the network is up, restarted whenever it exits, enabled for boot.
pub fn render_systemd(s: &Service) -> String {
    let exec: Vec<String> = std::iter::once(s.program.display().to_string())
        .chain(s.args.iter().cloned())
        .map(|w| systemd_word(&w))
        .collect();
    let mut out = format!(
        "[Unit]\nDescription=tb {} (Mac cluster orchestrator)\n\
         Wants=network-online.target\nAfter=network-online.target\n\n\
         [Service]\nExecStart={}\nRestart=always\nRestartSec=2\n",
        s.daemon.short(),
        exec.join(" ")
    );
    if let Some(user) = &s.user {
        out += &format!("User={user}\n");
    }
    // SIGTERM first: both daemons stop cleanly on it (a controller flushes, a nodelet leaves
    // its ranks to the next start).
    out += "KillSignal=SIGTERM\nTimeoutStopSec=30\n\n[Install]\nWantedBy=multi-user.target\n";
    out
}

/// The platform tbctl runs on.
fn host_platform() -> Result<Platform> {
    match std::env::consts::OS {
        "macos" => Ok(Platform::Macos),
        "linux" => Ok(Platform::Linux),
        other => bail!("tbctl install knows launchd (macOS) and systemd (Linux), not {other}"),
    }
}

/// The daemon's binary: `--binary`, else the one beside tbctl, else the first on the PATH.
fn find_program(daemon: Daemon, given: Option<&Path>) -> Result<PathBuf> {
    let name = daemon.binary();
    let candidate = match given {
        Some(p) => p.to_path_buf(),
        None => {
            let beside = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join(name)));
            let on_path = std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(name))
                    .find(|c| c.is_file())
            });
            match beside.filter(|b| b.is_file()).or(on_path) {
                Some(p) => p,
                None => bail!(
                    "{name} is neither beside tbctl nor on the PATH: pass --binary /path/to/{name}"
                ),
            }
        }
    };
    let absolute = std::fs::canonicalize(&candidate)
        .with_context(|| format!("--binary {}: no such file", candidate.display()))?;
    if !absolute.is_file() {
        bail!("--binary {}: not a file", absolute.display());
    }
    Ok(absolute)
}

/// Flags that would put a secret into a file other accounts may read.
fn refuse_secrets(args: &[String]) -> Result<()> {
    for a in args {
        let flag = a.split('=').next().unwrap_or(a);
        if matches!(flag, "--join-token" | "--token" | "--cluster-secret") {
            bail!(
                "{flag} would write a secret into the service file: pass it as a file \
                 (--join-token-file, the data dir's own files) instead"
            );
        }
    }
    Ok(())
}

fn require_root(what: &str) -> Result<()> {
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        bail!(
            "{what} needs root (running as uid {euid}): run it with sudo, or add --dry-run to see \
             the file it would write"
        );
    }
    Ok(())
}

pub fn install(args: &InstallArgs) -> Result<()> {
    refuse_secrets(&args.daemon_args)?;
    let platform = match args.platform {
        Some(p) => p,
        None => host_platform()?,
    };
    let program = if args.dry_run {
        // A dry run renders for another machine too: the path is taken as given.
        args.binary
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/usr/local/bin/{}", args.daemon.binary())))
    } else {
        find_program(args.daemon, args.binary.as_deref())?
    };
    let service = Service {
        daemon: args.daemon,
        program,
        args: args.daemon_args.clone(),
        user: args.user.clone(),
        log_dir: args.log_dir.clone(),
    };
    let text = render(platform, &service);
    let path = unit_path(platform, args.daemon);
    if args.dry_run {
        print!("{text}");
        eprintln!("(dry run: would write {})", path.display());
        return Ok(());
    }
    if Some(platform) != host_platform().ok() {
        bail!("--platform renders another system's file: use it with --dry-run");
    }
    require_root("tbctl install")?;
    let unchanged = std::fs::read_to_string(&path).is_ok_and(|old| old == text);
    if unchanged {
        println!("{} unchanged", path.display());
    } else {
        if platform == Platform::Macos {
            std::fs::create_dir_all(&service.log_dir)
                .with_context(|| format!("creating {}", service.log_dir.display()))?;
        }
        write_service_file(&path, &text)?;
        println!("wrote {}", path.display());
    }
    load(platform, args.daemon, &path, !unchanged)?;
    println!(
        "{} is installed and running",
        label_or_unit(platform, args.daemon)
    );
    Ok(())
}

pub fn uninstall(args: &UninstallArgs) -> Result<()> {
    let platform = host_platform()?;
    require_root("tbctl uninstall")?;
    let path = unit_path(platform, args.daemon);
    if !path.exists() {
        println!(
            "{} is not installed ({} is absent)",
            label_or_unit(platform, args.daemon),
            path.display()
        );
        return Ok(());
    }
    unload(platform, args.daemon)?;
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    if platform == Platform::Linux {
        // systemd forgets the unit only once it reads its directory again.
        run(Process::new("systemctl").arg("daemon-reload"))?;
    }
    println!("removed {}", path.display());
    Ok(())
}

fn label_or_unit(platform: Platform, daemon: Daemon) -> String {
    match platform {
        Platform::Macos => label(daemon),
        Platform::Linux => format!("tb-{}.service", daemon.short()),
    }
}

/// The file whole or not at all (0644: launchd and systemd refuse files others may write).
fn write_service_file(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().context("a service file has a directory")?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn run(cmd: &mut Process) -> Result<()> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Whether launchd has `target` (`system/LABEL`) loaded.
fn launchd_has(target: &str) -> bool {
    Process::new("launchctl")
        .args(["print", target])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Loads the service (again, when its file changed) and starts it.
fn load(platform: Platform, daemon: Daemon, path: &Path, changed: bool) -> Result<()> {
    let unit = label_or_unit(platform, daemon);
    match platform {
        Platform::Macos => {
            let target = format!("system/{unit}");
            let loaded = launchd_has(&target);
            if loaded && !changed {
                return Ok(());
            }
            if loaded {
                run(Process::new("launchctl").args(["bootout", &target]))?;
            }
            run(Process::new("launchctl")
                .arg("bootstrap")
                .arg("system")
                .arg(path))
        }
        Platform::Linux => {
            run(Process::new("systemctl").arg("daemon-reload"))?;
            run(Process::new("systemctl").args(["enable", &unit]))?;
            // A changed unit restarts the daemon; an unchanged one is only started if stopped.
            let verb = if changed { "restart" } else { "start" };
            run(Process::new("systemctl").args([verb, &unit]))
        }
    }
}

/// Stops the service and forgets it (its file is removed by the caller).
fn unload(platform: Platform, daemon: Daemon) -> Result<()> {
    let unit = label_or_unit(platform, daemon);
    match platform {
        Platform::Macos => {
            let target = format!("system/{unit}");
            if launchd_has(&target) {
                run(Process::new("launchctl").args(["bootout", &target]))?;
            }
            Ok(())
        }
        Platform::Linux => run(Process::new("systemctl").args(["disable", "--now", &unit])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodelet() -> Service {
        Service {
            daemon: Daemon::Nodelet,
            program: PathBuf::from("/opt/tb/bin/tb-nodelet"),
            args: vec![
                "--controller".into(),
                "10.0.0.1:7400".into(),
                "--name".into(),
                "mac studio 1".into(),
                "--labels".into(),
                "rack=a&b<c>".into(),
                "--join-token-file".into(),
                "/var/lib/tb/join.token".into(),
            ],
            user: None,
            log_dir: PathBuf::from("/var/log/tb"),
        }
    }

    /// The plist parsed by Python's plistlib, as launchd's reader would parse it.
    fn parse_plist(text: &str) -> Option<serde_json::Value> {
        let script = "import json,plistlib,sys; d=plistlib.loads(sys.stdin.buffer.read()); \
                      print(json.dumps(d))";
        let mut child = Process::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .ok()?;
        use std::io::Write;
        child.stdin.take()?.write_all(text.as_bytes()).ok()?;
        let out = child.wait_with_output().ok()?;
        assert!(out.status.success(), "plistlib refused:\n{text}");
        serde_json::from_slice(&out.stdout).ok()
    }

    #[test]
    fn the_launch_daemon_has_what_launchd_needs() {
        let text = render_plist(&nodelet());
        let Some(d) = parse_plist(&text) else {
            panic!("python3 is needed to check the plist");
        };
        assert_eq!(d["Label"], "dev.tb.nodelet");
        assert_eq!(d["RunAtLoad"], true);
        assert_eq!(d["KeepAlive"], true);
        let argv: Vec<&str> = d["ProgramArguments"]
            .as_array()
            .expect("ProgramArguments")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(argv[0], "/opt/tb/bin/tb-nodelet");
        assert!(argv.contains(&"mac studio 1"), "{argv:?}");
        assert!(
            argv.contains(&"rack=a&b<c>"),
            "XML escaped and read back: {argv:?}"
        );
        assert_eq!(d["StandardErrorPath"], "/var/log/tb/tb-nodelet.log");
        assert!(d.get("UserName").is_none(), "a nodelet runs as root");
        let controller = Service {
            daemon: Daemon::Controller,
            user: Some("_tb".into()),
            ..nodelet()
        };
        let d = parse_plist(&render_plist(&controller)).expect("plist");
        assert_eq!(d["Label"], "dev.tb.controller");
        assert_eq!(d["UserName"], "_tb");
    }

    #[test]
    fn the_systemd_unit_restarts_and_quotes_its_arguments() {
        let unit = render_systemd(&Service {
            args: vec![
                "--name".into(),
                "mac studio 1".into(),
                "100%".into(),
                "$HOME".into(),
            ],
            ..nodelet()
        });
        assert!(
            unit.contains(
                "ExecStart=/opt/tb/bin/tb-nodelet --name \"mac studio 1\" 100%% $$HOME\n"
            ),
            "{unit}"
        );
        for line in [
            "Restart=always",
            "WantedBy=multi-user.target",
            "After=network-online.target",
        ] {
            assert!(unit.lines().any(|l| l == line), "{line} in\n{unit}");
        }
        assert!(!unit.contains("User="), "a nodelet runs as root");
        // Where systemd is installed, its own checker reads the unit too.
        if let Ok(out) = Process::new("systemd-analyze").arg("--version").output()
            && out.status.success()
        {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("tb-nodelet.service");
            let bin = dir.path().join("tb-nodelet");
            std::fs::write(&bin, "#!/bin/sh\n").expect("bin");
            std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod");
            let unit = render_systemd(&Service {
                program: bin,
                ..nodelet()
            });
            std::fs::write(&path, unit).expect("unit");
            let out = Process::new("systemd-analyze")
                .arg("verify")
                .arg(&path)
                .output()
                .expect("systemd-analyze");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !err.contains("tb-nodelet.service:"),
                "systemd-analyze verify complains about the unit: {err}"
            );
        }
    }

    #[test]
    fn secrets_on_the_daemon_command_line_are_refused() {
        for bad in [["--join-token", "tbj-1"], ["--join-token=tbj-1", "x"]] {
            let args: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            let e = refuse_secrets(&args).expect_err("refused");
            assert!(e.to_string().contains("--join-token-file"), "{e}");
        }
        refuse_secrets(&["--join-token-file".into(), "/x".into()]).expect("a file is fine");
    }

    #[test]
    fn the_files_go_where_the_service_managers_look() {
        assert_eq!(
            unit_path(Platform::Macos, Daemon::Controller),
            PathBuf::from("/Library/LaunchDaemons/dev.tb.controller.plist")
        );
        assert_eq!(
            unit_path(Platform::Linux, Daemon::Nodelet),
            PathBuf::from("/etc/systemd/system/tb-nodelet.service")
        );
    }
}
