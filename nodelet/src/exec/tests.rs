//! Tests of the exec executor with real processes (`sh`, `sleep`): exit statuses, signals,
//! stopping a group that ignores SIGTERM, spawn errors, and output reaching the logs.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::*;

fn sh(script: &str, dir: &Path) -> Spec {
    Spec::new(
        vec!["sh".into(), "-c".into(), script.into()],
        dir,
        dir.join("logs"),
    )
}

/// Whether a process is gone: no /proc entry, or a zombie (dead, only waiting for its new
/// parent, init, to reap it). Polls for up to 5 s.
#[cfg(target_os = "linux")]
fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return true;
        };
        // The state is the first field after the parenthesised command name.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("Z") {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn output_lands_in_the_logs_and_the_exit_code_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = spawn(sh(
        "echo hello; echo oops >&2; echo bye; exit 3",
        dir.path(),
    ))
    .expect("spawn");
    assert!(running.pid() > 0);
    let status = running.wait().await.expect("wait");
    assert_eq!(
        status,
        ExitStatus {
            code: Some(3),
            signal: None
        }
    );
    assert!(!status.success());
    assert_eq!(status.to_string(), "exit code 3");
    // Waiting again returns the same status.
    assert_eq!(running.wait().await.expect("wait again"), status);

    let logs = dir.path().join("logs");
    assert_eq!(
        read_tail(&logs, LogStream::Stdout, None).expect("stdout"),
        ["hello", "bye"]
    );
    assert_eq!(
        read_tail(&logs, LogStream::Stderr, None).expect("stderr"),
        ["oops"]
    );
    assert_eq!(
        read_tail(&logs, LogStream::Both, Some(1)).expect("both"),
        ["bye", "oops"]
    );
}

#[tokio::test]
async fn death_by_signal_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = spawn(sh("kill -9 $$", dir.path())).expect("spawn");
    let status = running.wait().await.expect("wait");
    assert_eq!(
        status,
        ExitStatus {
            code: None,
            signal: Some(9)
        }
    );
    assert_eq!(status.to_string(), "killed by signal 9 (SIGKILL)");
}

#[tokio::test]
async fn environment_is_clean_plus_inherited_plus_spec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = sh("env | sort", dir.path());
    spec.env.insert("TB_RANK".into(), "2".into());
    spec.env.insert("HOME".into(), "/nonexistent-home".into());
    let mut running = spawn(spec).expect("spawn");
    running.wait().await.expect("wait");
    let env = read_tail(&dir.path().join("logs"), LogStream::Stdout, None).expect("stdout");
    assert!(env.contains(&"TB_RANK=2".to_string()), "{env:?}");
    assert!(
        env.contains(&"HOME=/nonexistent-home".to_string()),
        "{env:?}"
    );
    assert!(env.iter().any(|l| l.starts_with("PATH=")), "{env:?}");
    // Nothing but PATH/HOME/LANG/TMPDIR, the spec's variables and what sh sets itself.
    let allowed = [
        "PATH", "HOME", "LANG", "TMPDIR", "TB_RANK", "PWD", "SHLVL", "_", "OLDPWD",
    ];
    for line in &env {
        let name = line.split('=').next().unwrap_or_default();
        assert!(
            allowed.contains(&name),
            "unexpected variable {line:?} in {env:?}"
        );
    }
}

#[tokio::test]
async fn working_dir_is_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = spawn(sh("pwd", dir.path())).expect("spawn");
    running.wait().await.expect("wait");
    let pwd = read_tail(&dir.path().join("logs"), LogStream::Stdout, None).expect("stdout");
    let want = dir.path().canonicalize().expect("canonicalize");
    assert_eq!(pwd, [want.display().to_string()]);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn stop_kills_a_group_that_ignores_sigterm_after_the_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    // sh ignores TERM and so does its child, which inherits the ignored disposition.
    let mut running = spawn(sh(
        r#"trap "" TERM; sleep 30 & echo "$!"; wait"#,
        dir.path(),
    ))
    .expect("spawn");
    let logs = dir.path().join("logs");
    let mut lines = Box::pin(follow(&logs, LogStream::Stdout, FollowFrom::Tail(1)).await);
    let child: u32 = tokio::time::timeout(Duration::from_secs(10), lines.next())
        .await
        .expect("child pid printed in time")
        .and_then(|l| l.trim().parse().ok())
        .expect("child pid");
    assert!(Path::new(&format!("/proc/{child}")).exists());

    let started = Instant::now();
    let grace = Duration::from_millis(500);
    let status = running.stop(grace).await.expect("stop");
    let took = started.elapsed();
    assert_eq!(status.signal, Some(9), "{status}");
    assert!(took >= grace, "killed before the grace ran out: {took:?}");
    assert!(took < Duration::from_secs(10), "stop took {took:?}");

    // The leader is ours to reap, so it must be fully gone; its child is init's to reap.
    let leader = format!("/proc/{}", running.pid());
    assert!(!Path::new(&leader).exists(), "{leader} still exists");
    assert!(gone(child), "child sleep {child} survived its group");
    // Further stops and kills are no-ops that report the same status.
    assert_eq!(running.stop(grace).await.expect("stop again"), status);
    running.kill_group_now().expect("kill after exit");
}

#[tokio::test]
async fn stop_lets_a_cooperative_process_exit_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"trap "echo bye; exit 0" TERM; echo ready; while :; do sleep 0.05; done"#;
    let mut running = spawn(sh(script, dir.path())).expect("spawn");
    // Stop only once the trap is installed.
    let mut lines = Box::pin(
        follow(
            dir.path().join("logs"),
            LogStream::Stdout,
            FollowFrom::Tail(1),
        )
        .await,
    );
    let ready = tokio::time::timeout(Duration::from_secs(10), lines.next())
        .await
        .expect("ready in time");
    assert_eq!(ready.as_deref(), Some("ready"));
    let started = Instant::now();
    let status = running.stop(Duration::from_secs(20)).await.expect("stop");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code, Some(0), "{status}");
    let out = read_tail(&dir.path().join("logs"), LogStream::Stdout, None).expect("stdout");
    assert_eq!(out, ["ready", "bye"]);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn leftovers_are_killed_when_the_leader_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = spawn(sh(r#"sleep 30 & echo "$!"; exit 0"#, dir.path())).expect("spawn");
    let status = running.wait().await.expect("wait");
    assert!(status.success());
    let out = read_tail(&dir.path().join("logs"), LogStream::Stdout, None).expect("stdout");
    let child: u32 = out
        .first()
        .and_then(|l| l.trim().parse().ok())
        .expect("child pid");
    assert!(gone(child), "background sleep {child} outlived its leader");
}

#[tokio::test]
async fn kill_group_now_then_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = spawn(sh("sleep 30", dir.path())).expect("spawn");
    running.kill_group_now().expect("kill");
    let status = tokio::time::timeout(Duration::from_secs(10), running.wait())
        .await
        .expect("exits promptly")
        .expect("wait");
    assert_eq!(status.signal, Some(9));
}

#[tokio::test]
async fn spawn_errors_are_classified() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = dir.path().join("logs");

    let spec = Spec::new(vec!["tb-no-such-command-xyz".into()], dir.path(), &logs);
    let err = spawn(spec).expect_err("not found");
    assert!(
        matches!(err, ExecError::NotFound { ref command, .. } if command == "tb-no-such-command-xyz"),
        "{err:?}"
    );
    assert_eq!(err.reason(), "ExecNotFound");

    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write script");
    let spec = Spec::new(vec![script.display().to_string()], dir.path(), &logs);
    let err = spawn(spec).expect_err("permission denied");
    assert!(matches!(err, ExecError::PermissionDenied { .. }), "{err:?}");
    assert_eq!(err.reason(), "ExecPermissionDenied");

    let spec = Spec::new(vec!["sh".into()], dir.path().join("missing"), &logs);
    let err = spawn(spec).expect_err("bad working dir");
    assert!(matches!(err, ExecError::WorkingDir { .. }), "{err:?}");
    assert!(err.to_string().contains("missing"), "{err}");

    let err = spawn(Spec::new(vec![], dir.path(), &logs)).expect_err("empty command");
    assert!(matches!(err, ExecError::InvalidSpec { .. }), "{err:?}");

    let mut spec = sh("true", dir.path());
    spec.env.insert("A=B".into(), "x".into());
    assert!(matches!(spawn(spec), Err(ExecError::InvalidSpec { .. })));
}

#[tokio::test]
async fn logs_rotate_while_a_process_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = sh(
        r#"i=0; while [ $i -lt 300 ]; do echo "line $i"; i=$((i+1)); done"#,
        dir.path(),
    );
    spec.log_max_bytes = 512;
    spec.log_keep = 2;
    let mut running = spawn(spec).expect("spawn");
    assert!(running.wait().await.expect("wait").success());
    let logs = dir.path().join("logs");
    let mut names: Vec<String> = std::fs::read_dir(&logs)
        .expect("read logs")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("stdout"))
        .collect();
    names.sort();
    assert_eq!(names, ["stdout.log", "stdout.log.1", "stdout.log.2"]);
    let tail = read_tail(&logs, LogStream::Stdout, Some(3)).expect("tail");
    assert_eq!(tail, ["line 297", "line 298", "line 299"]);
    // What survives is a contiguous run ending at the last line.
    let all = read_tail(&logs, LogStream::Stdout, None).expect("all");
    let first: usize = all[0].trim_start_matches("line ").parse().expect("number");
    let want: Vec<String> = (first..300).map(|i| format!("line {i}")).collect();
    assert_eq!(all, want);
}

#[tokio::test]
async fn follow_sees_a_running_process_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running =
        spawn(sh("sleep 0.5; echo one; sleep 0.3; echo two", dir.path())).expect("spawn");
    // Tail as well as new lines: the result must not depend on how soon follow starts.
    let stream = follow(
        dir.path().join("logs"),
        LogStream::Stdout,
        FollowFrom::Tail(10),
    )
    .await;
    let got: Vec<String> = tokio::time::timeout(Duration::from_secs(10), stream.take(2).collect())
        .await
        .expect("two lines in time");
    assert_eq!(got, ["one", "two"]);
    running.wait().await.expect("wait");
}

#[tokio::test]
async fn dropping_a_running_process_kills_its_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let running = spawn(sh("sleep 30", dir.path())).expect("spawn");
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(running.pid()).expect("pid"));
    drop(running);
    let deadline = Instant::now() + Duration::from_secs(10);
    // killpg with no signal probes the group; it fails once every member is gone (reaped or
    // a zombie awaiting tokio's reaper counts as still there, hence the loop).
    while nix::sys::signal::killpg(pgid, None).is_ok() {
        assert!(Instant::now() < deadline, "group {pgid} still alive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// As root, a process drops to the given uid and gid, with no supplementary groups, before
/// exec. (Elsewhere there is nothing to drop to: skipped, saying why.)
#[tokio::test]
async fn a_process_runs_as_the_given_account() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: switching accounts needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // The work dir must be the account's to enter.
    std::os::unix::fs::chown(dir.path(), Some(61999), Some(61999)).expect("chown");
    let mut spec = sh("id -u; id -g; id -G", dir.path());
    spec.log_dir = tempfile::tempdir().expect("logs").keep();
    spec.run_as = Some(RunAs {
        uid: 61999,
        gid: 61999,
    });
    let mut running = spawn(spec.clone()).expect("spawn");
    assert!(running.wait().await.expect("wait").success());
    assert_eq!(
        read_tail(&spec.log_dir, LogStream::Stdout, None).expect("stdout"),
        ["61999", "61999", "61999"]
    );
}

/// What leaves the group (`setsid`) and carries the scope's marker is killed when the leader
/// exits, before the logs are drained (an escape holding stdout would otherwise delay that).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_escape_from_the_group_ends_with_the_leader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = format!("test/escape/{}", std::process::id());
    // The leader exits only once the escape has its own session (it writes its pid after
    // setsid), so the group kill cannot reach it.
    let mut spec = sh(
        "setsid sh -c 'echo $$ > escaped.tmp; mv escaped.tmp escaped; exec sleep 30' &\n\
         while [ ! -e escaped ]; do sleep 0.01; done; cat escaped",
        dir.path(),
    );
    spec.env.insert(contain::MARKER_ENV.into(), id.clone());
    spec.scope = Some(contain::Scope::new(id));
    let mut running = spawn(spec).expect("spawn");
    assert!(running.wait().await.expect("wait").success());
    let logs = dir.path().join("logs");
    let pid: u32 = read_tail(&logs, LogStream::Stdout, None).expect("stdout")[0]
        .parse()
        .expect("a pid");
    assert!(gone(pid), "the escaped sleep {pid} is still running");
}
