//! Runs one discovery command with a deadline: its standard output, or `None` (logged at debug)
//! when the command is missing, fails, prints something that is not UTF-8, or overruns.
//!
//! The output is read on a helper thread while the caller waits, so a command that prints more
//! than a pipe holds cannot stall; at most [`MAX_OUTPUT`] bytes are kept. A command that overruns
//! its deadline is killed.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Output beyond this is dropped (system_profiler's Thunderbolt report is a few KiB).
pub const MAX_OUTPUT: u64 = 8 << 20;

/// How often the caller checks whether the command has ended.
const POLL: Duration = Duration::from_millis(20);

/// Runs `program args..` and returns its standard output when it exits 0 within `timeout`.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Option<String> {
    let shown = || format!("{program} {}", args.join(" ")).trim().to_string();
    let mut child = match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(command = %shown(), "cannot run: {e}");
            return None;
        }
    };
    let Some(stdout) = child.stdout.take() else {
        tracing::debug!(command = %shown(), "no standard output to read");
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.take(MAX_OUTPUT).read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                tracing::debug!(command = %shown(), ?timeout, "timed out; killed");
                let _ = child.kill();
                let _ = child.wait();
                // The reader ends when the pipe closes; it is not waited for, in case a
                // grandchild still holds the pipe open.
                return None;
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => {
                tracing::debug!(command = %shown(), "cannot wait: {e}");
                let _ = child.kill();
                return None;
            }
        }
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        tracing::debug!(command = %shown(), %status, "failed");
        return None;
    }
    match String::from_utf8(out) {
        Ok(text) => Some(text),
        Err(_) => {
            tracing::debug!(command = %shown(), "output is not UTF-8");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_of_a_command_that_succeeds() {
        let out = run("sh", &["-c", "echo hello"], Duration::from_secs(5));
        assert_eq!(out.as_deref(), Some("hello\n"));
    }

    #[test]
    fn missing_failing_and_slow_commands_give_nothing() {
        assert_eq!(run("tb-no-such-command", &[], Duration::from_secs(5)), None);
        assert_eq!(run("sh", &["-c", "exit 3"], Duration::from_secs(5)), None);
        let started = Instant::now();
        assert_eq!(
            run("sh", &["-c", "exec sleep 30"], Duration::from_millis(200)),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn large_output_does_not_stall() {
        let out = run(
            "sh",
            &["-c", "head -c 300000 /dev/zero | tr '\\0' x"],
            Duration::from_secs(10),
        )
        .expect("runs");
        assert_eq!(out.len(), 300_000);
    }
}
