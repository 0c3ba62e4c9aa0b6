//! Capacity on Linux: pure parsers for `/proc/meminfo`, `/proc/cpuinfo` and `/etc/os-release`,
//! and the function that reads those files. (Linux boxes join a tb cluster as build and test
//! machines; the parsers run everywhere and are tested with recorded fixtures.)

use super::{Capacity, CapacityError, MemoryPressure};

/// The memory figures tb needs from `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub total_bytes: u64,
    /// MemAvailable: what can be allocated without swapping. On kernels older than 3.14, which
    /// lack it, MemFree + Buffers + Cached stands in.
    pub available_bytes: u64,
}

/// The CPU figures tb needs from `/proc/cpuinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    /// "model name" on x86; a description built from the implementer and part on ARM, whose
    /// kernels don't print a model name.
    pub model: String,
    /// Logical CPUs: the number of `processor` entries.
    pub cores: u32,
}

/// Parses `/proc/meminfo` (values in kB).
pub fn parse_meminfo(text: &str) -> Result<MemInfo, CapacityError> {
    let mut total = None;
    let mut available = None;
    let (mut free, mut buffers, mut cached) = (None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key.trim() {
            "MemTotal" => &mut total,
            "MemAvailable" => &mut available,
            "MemFree" => &mut free,
            "Buffers" => &mut buffers,
            "Cached" => &mut cached,
            _ => continue,
        };
        *slot = Some(parse_kb(key.trim(), value)?);
    }
    let total_bytes =
        total.ok_or_else(|| CapacityError::parse("/proc/meminfo", "no MemTotal line"))?;
    let available_bytes = match (available, free) {
        (Some(available), _) => available,
        (None, Some(free)) => free + buffers.unwrap_or(0) + cached.unwrap_or(0),
        (None, None) => {
            return Err(CapacityError::parse(
                "/proc/meminfo",
                "neither MemAvailable nor MemFree is present",
            ));
        }
    };
    Ok(MemInfo {
        total_bytes,
        // Never report more available than exists (the fallback sum can overshoot).
        available_bytes: available_bytes.min(total_bytes),
    })
}

/// Parses a meminfo value like "  24683568 kB" into bytes.
fn parse_kb(key: &str, value: &str) -> Result<u64, CapacityError> {
    let mut parts = value.split_whitespace();
    let number = parts.next().unwrap_or_default();
    let kb: u64 = number.parse().map_err(|_| {
        CapacityError::parse(
            "/proc/meminfo",
            format!("{key}: {number:?} is not a number of kB"),
        )
    })?;
    match parts.next() {
        Some("kB") | None => kb.checked_mul(1024).ok_or_else(|| {
            CapacityError::parse("/proc/meminfo", format!("{key}: {kb} kB overflows"))
        }),
        Some(unit) => Err(CapacityError::parse(
            "/proc/meminfo",
            format!("{key}: unexpected unit {unit:?}, expected kB"),
        )),
    }
}

/// Parses `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> Result<CpuInfo, CapacityError> {
    let mut cores: u32 = 0;
    let mut model_name = None;
    let mut hardware = None;
    let mut implementer = None;
    let mut part = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            // "Processor" (capital P) is a model line on old ARM kernels, not an index.
            "processor" => cores += 1,
            "model name" | "Processor" if model_name.is_none() && !value.is_empty() => {
                model_name = Some(value.to_string());
            }
            "Hardware" if hardware.is_none() && !value.is_empty() => {
                hardware = Some(value.to_string())
            }
            "CPU implementer" if implementer.is_none() => implementer = Some(value.to_string()),
            "CPU part" if part.is_none() => part = Some(value.to_string()),
            _ => {}
        }
    }
    if cores == 0 {
        return Err(CapacityError::parse(
            "/proc/cpuinfo",
            "no `processor` entries",
        ));
    }
    let model = model_name
        .or(hardware)
        .or_else(|| match (implementer, part) {
            (Some(implementer), Some(part)) => {
                Some(format!("ARM CPU (implementer {implementer}, part {part})"))
            }
            _ => None,
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    Ok(CpuInfo { model, cores })
}

/// The PRETTY_NAME of `/etc/os-release`, unquoted.
pub fn parse_os_release(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix("PRETTY_NAME=")?.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value)
            .trim();
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// A one-line OS description from os-release's name and the kernel release.
pub fn describe_os(pretty_name: Option<&str>, kernel_release: Option<&str>) -> String {
    let kernel = kernel_release.map(str::trim).filter(|k| !k.is_empty());
    match (pretty_name, kernel) {
        (Some(name), Some(kernel)) => format!("{name}, Linux {kernel}"),
        (Some(name), None) => name.to_string(),
        (None, Some(kernel)) => format!("Linux {kernel}"),
        (None, None) => "Linux".to_string(),
    }
}

/// A hardware model from DMI `product_name` or the device tree's `model` (NUL-terminated).
pub fn parse_hardware_model(text: &str) -> Option<String> {
    let model = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    (!model.is_empty()).then(|| model.to_string())
}

/// Builds the capacity from the parsed pieces.
pub fn assemble(
    mem: MemInfo,
    cpu: CpuInfo,
    os: String,
    hardware_model: Option<String>,
    reserved_bytes: Option<u64>,
) -> Capacity {
    let reserve = super::reserve_for(mem.total_bytes, reserved_bytes);
    Capacity {
        memory_bytes: mem.total_bytes,
        allocatable_bytes: super::allocatable(mem.total_bytes, reserve),
        chip: cpu.model.clone(),
        cpu_model: cpu.model,
        cpu_cores: cpu.cores,
        gpu_cores: None,
        hardware_model,
        os,
        memory_pressure: MemoryPressure::from_available(mem.available_bytes, mem.total_bytes),
        free_bytes: mem.available_bytes,
    }
}

/// Reads this Linux machine's capacity from /proc, /etc and /sys.
#[cfg(target_os = "linux")]
pub(crate) fn read(reserved_bytes: Option<u64>) -> Result<Capacity, CapacityError> {
    let read_file = |path: &str| {
        std::fs::read_to_string(path).map_err(|source| CapacityError::Io {
            source_name: path.to_string(),
            source,
        })
    };
    // Best-effort extras: their absence (containers, VMs) only leaves a field vaguer.
    let optional = |path: &str| match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(err) => {
            tracing::debug!(path, %err, "optional capacity source not readable");
            None
        }
    };

    let mem = parse_meminfo(&read_file("/proc/meminfo")?)?;
    let cpu = parse_cpuinfo(&read_file("/proc/cpuinfo")?)?;
    let pretty = optional("/etc/os-release")
        .as_deref()
        .and_then(parse_os_release);
    let kernel = optional("/proc/sys/kernel/osrelease");
    let os = describe_os(pretty.as_deref(), kernel.as_deref());
    let hardware_model = optional("/sys/devices/virtual/dmi/id/product_name")
        .or_else(|| optional("/proc/device-tree/model"))
        .as_deref()
        .and_then(parse_hardware_model);
    Ok(assemble(mem, cpu, os, hardware_model, reserved_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = include_str!("../../tests/fixtures/linux/meminfo-x86_64-24g.txt");
    const MEMINFO_PRESSURED: &str =
        include_str!("../../tests/fixtures/linux/meminfo-pressured.txt");
    const MEMINFO_OLD: &str =
        include_str!("../../tests/fixtures/linux/meminfo-no-memavailable.txt");
    const CPUINFO_X86: &str = include_str!("../../tests/fixtures/linux/cpuinfo-x86_64-epyc.txt");
    const CPUINFO_ARM: &str = include_str!("../../tests/fixtures/linux/cpuinfo-aarch64.txt");
    const OS_RELEASE: &str = include_str!("../../tests/fixtures/linux/os-release-debian12.txt");

    #[test]
    fn meminfo_total_and_available() {
        let mem = parse_meminfo(MEMINFO).expect("parse");
        assert_eq!(mem.total_bytes, 24_683_568 * 1024);
        assert_eq!(mem.available_bytes, 23_395_684 * 1024);
    }

    #[test]
    fn meminfo_without_memavailable_falls_back_to_free_buffers_cached() {
        let mem = parse_meminfo(MEMINFO_OLD).expect("parse");
        assert_eq!(
            mem.available_bytes,
            (19_092_800 + 12_864 + 4_433_076) * 1024
        );
    }

    #[test]
    fn meminfo_errors_name_the_problem() {
        let err = parse_meminfo("MemFree: 10 kB\n").expect_err("no total");
        assert!(err.to_string().contains("MemTotal"), "{err}");
        let err = parse_meminfo("MemTotal: lots kB\nMemAvailable: 1 kB\n").expect_err("bad number");
        assert!(err.to_string().contains("\"lots\""), "{err}");
        let err = parse_meminfo("MemTotal: 10 MB\n").expect_err("bad unit");
        assert!(err.to_string().contains("unit"), "{err}");
    }

    #[test]
    fn cpuinfo_x86_model_and_count() {
        let cpu = parse_cpuinfo(CPUINFO_X86).expect("parse");
        assert_eq!(
            cpu,
            CpuInfo {
                model: "AMD EPYC".into(),
                cores: 2
            }
        );
    }

    #[test]
    fn cpuinfo_arm_has_no_model_name() {
        let cpu = parse_cpuinfo(CPUINFO_ARM).expect("parse");
        assert_eq!(cpu.cores, 4);
        assert_eq!(cpu.model, "ARM CPU (implementer 0x41, part 0xd0c)");
        assert!(parse_cpuinfo("").is_err());
    }

    #[test]
    fn os_description() {
        let pretty = parse_os_release(OS_RELEASE);
        assert_eq!(pretty.as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(
            describe_os(pretty.as_deref(), Some("6.18.44\n")),
            "Debian GNU/Linux 12 (bookworm), Linux 6.18.44"
        );
        assert_eq!(describe_os(None, None), "Linux");
        assert_eq!(
            parse_hardware_model("Raspberry Pi 5 Model B Rev 1.0\0"),
            Some("Raspberry Pi 5 Model B Rev 1.0".into())
        );
        assert_eq!(parse_hardware_model(" \n"), None);
    }

    #[test]
    fn assembled_capacity() {
        let cap = assemble(
            parse_meminfo(MEMINFO).expect("meminfo"),
            parse_cpuinfo(CPUINFO_X86).expect("cpuinfo"),
            "Linux".into(),
            None,
            None,
        );
        let total = 24_683_568 * 1024;
        assert_eq!(cap.memory_bytes, total);
        // 10 % of 23.5 GiB is less than 4 GiB, so the default reserve is the 10 %.
        assert_eq!(cap.allocatable_bytes, total - total / 10);
        assert_eq!(cap.chip, "AMD EPYC");
        assert_eq!(cap.cpu_cores, 2);
        assert_eq!(cap.gpu_cores, None);
        assert_eq!(cap.memory_pressure, MemoryPressure::Normal);

        let pressured = assemble(
            parse_meminfo(MEMINFO_PRESSURED).expect("meminfo"),
            parse_cpuinfo(CPUINFO_X86).expect("cpuinfo"),
            "Linux".into(),
            None,
            Some(1024),
        );
        assert_eq!(pressured.memory_pressure, MemoryPressure::Critical);
        assert_eq!(pressured.allocatable_bytes, total - 1024);
        assert_eq!(pressured.free_bytes, 1_480_992 * 1024);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_machine() {
        let cap = super::super::read(0).expect("read /proc");
        assert!(cap.memory_bytes > 0);
        assert_eq!(cap.allocatable_bytes, cap.memory_bytes);
        assert!(cap.cpu_cores > 0);
        assert!(cap.free_bytes <= cap.memory_bytes);
    }
}
