//! Facts about the machine the numbers were taken on: CPU count and model, load average,
//! memory, date; and `/proc` parsing for process memory.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total: String,
    pub kernel: String,
}

impl Machine {
    pub fn describe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into()),
            mem_total: parse_kib_field(&meminfo, "MemTotal")
                .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "unknown".into()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn mem_total_bytes() -> Option<u64> {
    parse_kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal")
}

/// `/proc/loadavg`'s three averages, as written there ("0.52 0.31 0.20").
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// The value of the first `key: value` line in a `/proc` text file.
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// A `Key:   1234 kB` line, in bytes.
fn parse_kib_field(text: &str, key: &str) -> Option<u64> {
    let value = field(text, key)?;
    let kib: u64 = value.strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// Resident set size in bytes from the text of `/proc/PID/status`.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    parse_kib_field(status, "VmRSS")
}

/// Peak resident set size in bytes ("high water mark") from the text of `/proc/PID/status`.
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    parse_kib_field(status, "VmHWM")
}

/// Milliseconds with one decimal, for tables.
pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_from_proc_status() {
        let status =
            "Name:\ttb-controller\nVmPeak:\t  200000 kB\nVmRSS:\t   51200 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(status), Some(51200 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_hwm("VmHWM:\t  200 kB\n"), Some(200 * 1024));
    }

    #[test]
    fn cpu_model_field() {
        let info = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n";
        assert_eq!(field(info, "model name").as_deref(), Some("AMD EPYC 7B13"));
    }
}
