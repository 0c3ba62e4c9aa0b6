//! The macOS process table, from libproc: `proc_listallpids`, then `proc_pidinfo`
//! (`PROC_PIDTBSDINFO`) for each process's parent, real uid, state and start time
//! (microseconds since the epoch). macOS shows no other process's environment cheaply and has
//! no child subreaper, so here containment rests on the process tree and the job account.

use nix::libc;

use super::ProcInfo;

/// Every process now; processes that vanish while being read are skipped.
pub fn processes() -> Vec<ProcInfo> {
    // SAFETY: a NULL buffer asks only for the number of pids.
    let count = unsafe { libc::proc_listallpids(std::ptr::null_mut(), 0) };
    if count <= 0 {
        return Vec::new();
    }
    // Room for processes started since the count.
    let mut pids = vec![0 as libc::pid_t; count as usize + 64];
    let bytes = (pids.len() * std::mem::size_of::<libc::pid_t>()) as libc::c_int;
    // SAFETY: the buffer holds `bytes` bytes of pid_t.
    let filled = unsafe { libc::proc_listallpids(pids.as_mut_ptr().cast(), bytes) };
    if filled <= 0 {
        return Vec::new();
    }
    pids.truncate(filled as usize);
    pids.into_iter()
        .filter(|&p| p > 0)
        .filter_map(read)
        .collect()
}

/// One process, if it exists (and this process may look at it).
pub fn read(pid: i32) -> Option<ProcInfo> {
    // SAFETY: proc_bsdinfo is plain old data; all zeroes is a valid value.
    let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_bsdinfo>() as libc::c_int;
    // SAFETY: the buffer is a proc_bsdinfo of `size` bytes, as PROC_PIDTBSDINFO fills.
    let got = unsafe {
        libc::proc_pidinfo(
            pid,
            libc::PROC_PIDTBSDINFO,
            0,
            (&mut info as *mut libc::proc_bsdinfo).cast(),
            size,
        )
    };
    if got != size {
        return None;
    }
    Some(ProcInfo {
        pid,
        ppid: info.pbi_ppid as i32,
        uid: info.pbi_ruid,
        start: info.pbi_start_tvsec * 1_000_000 + info.pbi_start_tvusec,
        zombie: info.pbi_status == libc::SZOMB,
        // Only used to tell adopted orphans apart, and macOS adopts none.
        sid: 0,
    })
}

/// The start time of `pid` (microseconds since the epoch), if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    read(pid).map(|p| p.start)
}

/// macOS does not let the sweep read another process's environment cheaply: no marker.
pub fn has_env(_pid: i32, _entry: &str) -> bool {
    false
}

/// macOS has no child subreaper: orphans go to launchd.
pub fn become_subreaper() -> Result<(), String> {
    Err("macOS has no child subreaper; escaped processes are found by account".into())
}
