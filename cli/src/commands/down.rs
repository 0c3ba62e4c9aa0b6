//! `tbctl down`: stop the local cluster `tbctl up` started from the same data directory:
//! SIGTERM each process in its pids file, wait up to 10 s, SIGKILL what remains, remove the
//! pids file. `--purge` then deletes the data directory (objects, nodelet identities, logs),
//! after checking that it is one. A pid that now belongs to an unrelated process is left
//! alone. Output: one line per process (`node-1 (pid 41213) stopped|killed|not running`).

use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::args::DownArgs;
use crate::local::{self, Proc, Stopped};
use crate::output::emit;

/// How long the processes get to shut down cleanly before SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

pub fn report_line(p: &Proc, how: Stopped) -> String {
    let how = match how {
        Stopped::Terminated => "stopped",
        Stopped::Killed => "killed (did not stop within 10s)",
        Stopped::NotRunning => "not running",
    };
    format!("{} (pid {}) {how}\n", p.name, p.pid)
}

pub async fn run(args: &DownArgs) -> Result<()> {
    let dir = local::data_dir(args.data_dir.as_deref())?;
    match local::read_pids(&dir)? {
        None => emit(&format!(
            "no local cluster is running from {}\n",
            dir.display()
        ))?,
        Some(procs) => {
            let outcome = local::stop(&procs, GRACE).await;
            let text: String = outcome
                .iter()
                .map(|(p, how)| report_line(p, *how))
                .collect();
            emit(&text)?;
            local::remove_pids(&dir)?;
        }
    }
    if args.purge && dir.exists() {
        local::check_purgeable(&dir)?;
        std::fs::remove_dir_all(&dir).with_context(|| format!("deleting {}", dir.display()))?;
        emit(&format!("deleted {}\n", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines() {
        let p = Proc {
            name: "node-1".into(),
            pid: 41213,
        };
        assert_eq!(
            report_line(&p, Stopped::Terminated),
            "node-1 (pid 41213) stopped\n"
        );
        assert_eq!(
            report_line(&p, Stopped::NotRunning),
            "node-1 (pid 41213) not running\n"
        );
    }

    #[tokio::test]
    async fn stops_a_detached_process_and_skips_dead_ones() {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: setsid only, as `up` does.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().expect("sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        assert!(local::is_ours(pid));
        // A child of this test is reaped by waiting on it; `down` stops processes it did not
        // start, which their parent (init) reaps.
        let reaper = std::thread::spawn(move || child.wait());
        let procs = [
            Proc {
                name: "node-1".into(),
                pid,
            },
            Proc {
                name: "gone".into(),
                pid: i32::MAX,
            },
        ];
        let outcome = local::stop(&procs, Duration::from_secs(5)).await;
        assert_eq!(outcome[0], (procs[0].clone(), Stopped::Terminated));
        assert_eq!(outcome[1], (procs[1].clone(), Stopped::NotRunning));
        assert!(reaper.join().expect("join").is_ok());
    }
}
