//! The Linux process table, read from `/proc`: each process's parent, real uid, state and start
//! time (clock ticks since boot, `/proc/PID/stat` field 22), and whether its environment holds
//! a given `NAME=value` (`/proc/PID/environ`, readable by root for every process).

use std::path::Path;

use super::ProcInfo;

/// Every process now; processes that vanish while being read are skipped.
pub fn processes() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read)
        .collect()
}

/// One process, if it exists.
pub fn read(pid: i32) -> Option<ProcInfo> {
    let dir = Path::new("/proc").join(pid.to_string());
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let (ppid, zombie, start) = parse_stat(&stat)?;
    Some(ProcInfo {
        pid,
        ppid,
        uid: parse_real_uid(&status)?,
        start,
        zombie,
        sid: parse_session(&stat).unwrap_or(0),
    })
}

/// The start time of `pid` (clock ticks since boot), if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, _, start)| start)
}

/// Whether the environment of `pid` holds exactly `entry` (`NAME=value`).
pub fn has_env(pid: i32, entry: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| environ_has(&env, entry.as_bytes()))
}

/// Whether a NUL-separated environment block holds exactly `entry`.
pub fn environ_has(environ: &[u8], entry: &[u8]) -> bool {
    environ.split(|b| *b == 0).any(|kv| kv == entry)
}

/// (parent pid, zombie, start time) from `/proc/PID/stat`. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses: fields are counted after the last
/// `)`.
pub fn parse_stat(stat: &str) -> Option<(i32, bool, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): field N is fields[N - 3].
    let state = *fields.first()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(22 - 3)?.parse().ok()?;
    Some((ppid, state == "Z" || state == "X", start))
}

/// The session id (field 6) from `/proc/PID/stat`.
pub fn parse_session(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(6 - 3)?.parse().ok()
}

/// The real uid from `/proc/PID/status` (`Uid:\treal\teffective\tsaved\tfs`).
pub fn parse_real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Makes this process the reaper of every orphan among its descendants, so an escaped
/// (`setsid`, double-forked) process stays in reach of the sweep instead of moving to init.
pub fn become_subreaper() -> Result<(), String> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("PR_SET_CHILD_SUBREAPER: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Field 22 (start time) is 9186534 here; the name holds spaces and a ')'.
    const STAT: &str = "4242 (evil) name) S 17 4242 4242 0 -1 4194560 150 0 0 0 0 0 0 0 20 0 1 0 9186534 2510848 230 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn stat_fields_count_after_the_last_parenthesis() {
        assert_eq!(parse_stat(STAT), Some((17, false, 9186534)));
        let zombie = STAT.replace(") S 17", ") Z 17");
        assert_eq!(parse_stat(&zombie), Some((17, true, 9186534)));
        assert_eq!(parse_session(STAT), Some(4242));
        assert_eq!(parse_stat("4242 (x) S 1 2"), None, "too short");
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_real_uid_is_the_first_of_four() {
        let status = "Name:\tsleep\nState:\tS (sleeping)\nPPid:\t1\nUid:\t61184\t0\t0\t0\nGid:\t61184\t61184\t61184\t61184\n";
        assert_eq!(parse_real_uid(status), Some(61184));
        assert_eq!(parse_real_uid("Name:\tx\n"), None);
    }

    #[test]
    fn an_environment_entry_matches_whole() {
        let env = b"PATH=/bin\0TB_ALLOCATION=default/a/u1\0HOME=/x\0";
        assert!(environ_has(env, b"TB_ALLOCATION=default/a/u1"));
        assert!(!environ_has(env, b"TB_ALLOCATION=default/a/u"));
        assert!(!environ_has(env, b"TB_ALLOCATION=default/a/u10"));
        assert!(!environ_has(b"", b"TB_ALLOCATION=default/a/u1"));
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id() as i32;
        let info = read(me).expect("own /proc entry");
        assert_eq!(info.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(info.uid, nix::unistd::getuid().as_raw());
        assert!(!info.zombie);
        assert_eq!(start_time(me), Some(info.start));
        assert!(processes().iter().any(|p| p.pid == me));
    }
}
