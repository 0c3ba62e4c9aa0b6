//! Capacity on macOS: pure parsers for the output of `sysctl`, `system_profiler
//! SPDisplaysDataType -json`, `vm_stat` and `sw_vers`, an [`assemble`] step that turns those
//! outputs into a [`Capacity`], and (on macOS only) the thin function that runs the commands.
//!
//! Only total memory is essential: any other command that fails or prints something unexpected
//! leaves its field vaguer (and is logged) instead of failing the whole read.

use serde::Deserialize;

use super::{Capacity, CapacityError, MemoryPressure};

/// The raw standard output of each command; `None` where the command could not be run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MacOutputs {
    /// `sysctl -n hw.memsize`
    pub memsize: Option<String>,
    /// `sysctl -n machdep.cpu.brand_string`
    pub brand_string: Option<String>,
    /// `sysctl -n hw.model`
    pub hw_model: Option<String>,
    /// `sysctl -n hw.ncpu`
    pub ncpu: Option<String>,
    /// `system_profiler SPDisplaysDataType -json`
    pub displays_json: Option<String>,
    /// `vm_stat`
    pub vm_stat: Option<String>,
    /// `sysctl -n kern.memorystatus_vm_pressure_level`
    pub pressure_level: Option<String>,
    /// `sw_vers`
    pub sw_vers: Option<String>,
}

/// The GPU as system_profiler describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuInfo {
    /// `sppci_model`, e.g. "Apple M3 Ultra".
    pub model: Option<String>,
    /// `sppci_cores`, e.g. 80.
    pub cores: Option<u32>,
}

/// The page counts tb needs from `vm_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmStat {
    pub page_size: u64,
    pub free: u64,
    pub active: u64,
    pub inactive: u64,
    pub speculative: u64,
    pub wired: u64,
    pub compressor: u64,
}

impl VmStat {
    /// Memory the kernel can hand out without compressing or swapping: free pages plus the
    /// inactive and speculative ones it reclaims first. (Purgeable pages are already counted in
    /// active/inactive, so they are not added again.)
    pub fn available_bytes(&self) -> u64 {
        self.free
            .saturating_add(self.inactive)
            .saturating_add(self.speculative)
            .saturating_mul(self.page_size)
    }
}

/// Parses `sysctl -n hw.memsize`: total memory in bytes.
pub fn parse_memsize(text: &str) -> Result<u64, CapacityError> {
    let text = text.trim();
    match text.parse::<u64>() {
        Ok(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(CapacityError::parse(
            "sysctl hw.memsize",
            format!("{text:?} is not a positive number of bytes"),
        )),
    }
}

/// Parses `sysctl -n machdep.cpu.brand_string`, e.g. "Apple M3 Ultra".
pub fn parse_brand_string(text: &str) -> Option<String> {
    non_empty(text)
}

/// Parses `sysctl -n hw.model`, e.g. "Mac15,14".
pub fn parse_hw_model(text: &str) -> Option<String> {
    non_empty(text)
}

/// Parses `sysctl -n hw.ncpu`: the number of logical CPUs.
pub fn parse_ncpu(text: &str) -> Result<u32, CapacityError> {
    let text = text.trim();
    match text.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CapacityError::parse(
            "sysctl hw.ncpu",
            format!("{text:?} is not a positive CPU count"),
        )),
    }
}

/// The part of system_profiler's JSON that tb reads.
#[derive(Deserialize)]
struct DisplaysReport {
    #[serde(rename = "SPDisplaysDataType", default)]
    gpus: Vec<DisplaysEntry>,
}

#[derive(Deserialize)]
struct DisplaysEntry {
    sppci_model: Option<String>,
    sppci_cores: Option<String>,
}

/// Parses `system_profiler SPDisplaysDataType -json`: the GPU model and core count. Apple
/// silicon has one GPU entry; when there are several, the first that states a core count wins.
pub fn parse_displays(json: &str) -> Result<GpuInfo, CapacityError> {
    const SOURCE: &str = "system_profiler SPDisplaysDataType";
    let report: DisplaysReport =
        serde_json::from_str(json).map_err(|err| CapacityError::parse(SOURCE, err.to_string()))?;
    let entry = report
        .gpus
        .iter()
        .find(|gpu| gpu.sppci_cores.is_some())
        .or_else(|| report.gpus.first())
        .ok_or_else(|| CapacityError::parse(SOURCE, "SPDisplaysDataType lists no GPU"))?;
    let cores = match entry.sppci_cores.as_deref().map(str::trim) {
        None => None,
        Some(text) => Some(text.parse::<u32>().map_err(|_| {
            CapacityError::parse(SOURCE, format!("sppci_cores {text:?} is not a number"))
        })?),
    };
    Ok(GpuInfo {
        model: entry.sppci_model.as_deref().and_then(non_empty),
        cores,
    })
}

/// Parses `vm_stat`: the page size from its header and the page counts tb needs.
pub fn parse_vm_stat(text: &str) -> Result<VmStat, CapacityError> {
    const SOURCE: &str = "vm_stat";
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let page_size = header
        .split_once("page size of ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            CapacityError::parse(
                SOURCE,
                format!("header {header:?} does not state the page size"),
            )
        })?;

    let (mut free, mut active, mut inactive) = (None, None, None);
    let (mut speculative, mut wired, mut compressor) = (None, None, None);
    for line in lines {
        let Some((label, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match label.trim() {
            "Pages free" => &mut free,
            "Pages active" => &mut active,
            "Pages inactive" => &mut inactive,
            "Pages speculative" => &mut speculative,
            "Pages wired down" => &mut wired,
            "Pages occupied by compressor" => &mut compressor,
            _ => continue,
        };
        let number = value.trim().trim_end_matches('.');
        *slot = Some(number.parse::<u64>().map_err(|_| {
            CapacityError::parse(
                SOURCE,
                format!("{}: {number:?} is not a page count", label.trim()),
            )
        })?);
    }
    let need = |value: Option<u64>, label: &str| {
        value.ok_or_else(|| CapacityError::parse(SOURCE, format!("no \"{label}:\" line")))
    };
    Ok(VmStat {
        page_size,
        free: need(free, "Pages free")?,
        active: need(active, "Pages active")?,
        inactive: need(inactive, "Pages inactive")?,
        speculative: need(speculative, "Pages speculative")?,
        wired: need(wired, "Pages wired down")?,
        compressor: need(compressor, "Pages occupied by compressor")?,
    })
}

/// Parses `sysctl -n kern.memorystatus_vm_pressure_level`: 1 normal, 2 warn, 4 critical.
pub fn parse_pressure_level(text: &str) -> Result<MemoryPressure, CapacityError> {
    match text.trim() {
        "1" => Ok(MemoryPressure::Normal),
        "2" => Ok(MemoryPressure::Warning),
        "4" => Ok(MemoryPressure::Critical),
        other => Err(CapacityError::parse(
            "sysctl kern.memorystatus_vm_pressure_level",
            format!("{other:?} is not a known level (1, 2 or 4)"),
        )),
    }
}

/// Parses `sw_vers` into "macOS 26.2 (25C56)".
pub fn parse_sw_vers(text: &str) -> Option<String> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name)
                .then(|| value.trim().to_string())
                .filter(|v| !v.is_empty())
        })
    };
    let name = field("ProductName").unwrap_or_else(|| "macOS".to_string());
    let version = field("ProductVersion")?;
    Some(match field("BuildVersion") {
        Some(build) => format!("{name} {version} ({build})"),
        None => format!("{name} {version}"),
    })
}

/// Builds the capacity from the commands' outputs. Fails only when total memory is unknown:
/// a Node without it could not be scheduled onto sensibly. Every other field degrades.
pub fn assemble(out: &MacOutputs, reserved_bytes: Option<u64>) -> Result<Capacity, CapacityError> {
    let memory_bytes = match out.memsize.as_deref() {
        Some(text) => parse_memsize(text)?,
        None => {
            return Err(CapacityError::Command {
                command: "sysctl -n hw.memsize".into(),
                message: "no output".into(),
            });
        }
    };

    let gpu = out.displays_json.as_deref().and_then(|json| {
        parse_displays(json)
            .map_err(|err| tracing::warn!(%err, "GPU cores unknown"))
            .ok()
    });
    let brand = out.brand_string.as_deref().and_then(parse_brand_string);
    let chip = brand
        .clone()
        .or_else(|| gpu.as_ref().and_then(|g| g.model.clone()))
        .unwrap_or_else(|| "unknown Apple chip".to_string());
    let cpu_cores = out
        .ncpu
        .as_deref()
        .and_then(|text| {
            parse_ncpu(text)
                .map_err(|err| tracing::warn!(%err, "CPU count unknown"))
                .ok()
        })
        .unwrap_or(0);

    let vm = out.vm_stat.as_deref().and_then(|text| {
        parse_vm_stat(text)
            .map_err(|err| tracing::warn!(%err, "free memory unknown"))
            .ok()
    });
    // Nothing known to be free is the safe guess: the scheduler then places nothing new here.
    let free_bytes = vm.map_or(0, |vm| vm.available_bytes().min(memory_bytes));
    let kernel_pressure = out.pressure_level.as_deref().and_then(|text| {
        parse_pressure_level(text)
            .map_err(|err| tracing::warn!(%err, "kernel memory pressure unknown"))
            .ok()
    });
    let memory_pressure = match (kernel_pressure, vm) {
        (Some(level), _) => level,
        (None, Some(_)) => MemoryPressure::from_available(free_bytes, memory_bytes),
        (None, None) => MemoryPressure::Normal,
    };

    let reserve = super::reserve_for(memory_bytes, reserved_bytes);
    Ok(Capacity {
        memory_bytes,
        allocatable_bytes: super::allocatable(memory_bytes, reserve),
        cpu_model: brand.unwrap_or_else(|| chip.clone()),
        cpu_cores,
        gpu_cores: gpu.and_then(|g| g.cores),
        chip,
        hardware_model: out.hw_model.as_deref().and_then(parse_hw_model),
        os: out
            .sw_vers
            .as_deref()
            .and_then(parse_sw_vers)
            .unwrap_or_else(|| "macOS".to_string()),
        memory_pressure,
        free_bytes,
    })
}

fn non_empty(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// Runs the commands and assembles the capacity of this Mac.
#[cfg(target_os = "macos")]
pub(crate) fn read(reserved_bytes: Option<u64>) -> Result<Capacity, CapacityError> {
    let sysctl = |name: &str| run("sysctl", &["-n", name]);
    let outputs = MacOutputs {
        memsize: sysctl("hw.memsize"),
        brand_string: sysctl("machdep.cpu.brand_string"),
        hw_model: sysctl("hw.model"),
        ncpu: sysctl("hw.ncpu"),
        displays_json: run("system_profiler", &["SPDisplaysDataType", "-json"]),
        vm_stat: run("vm_stat", &[]),
        pressure_level: sysctl("kern.memorystatus_vm_pressure_level"),
        sw_vers: run("sw_vers", &[]),
    };
    assemble(&outputs, reserved_bytes)
}

/// Runs one command and returns its standard output, or logs why it could not and returns None.
#[cfg(target_os = "macos")]
fn run(program: &str, args: &[&str]) -> Option<String> {
    let command = || format!("{program} {}", args.join(" "));
    match std::process::Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => match String::from_utf8(out.stdout) {
            Ok(text) => Some(text),
            Err(err) => {
                tracing::warn!(command = %command(), %err, "output is not UTF-8");
                None
            }
        },
        Ok(out) => {
            tracing::warn!(
                command = %command(),
                status = %out.status,
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "command failed"
            );
            None
        }
        Err(err) => {
            tracing::warn!(command = %command(), %err, "cannot run command");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One recorded command output of one machine.
    macro_rules! fixture {
        ($dir:literal, $file:literal) => {
            Some(include_str!(concat!("../../tests/fixtures/macos/", $dir, "/", $file)).to_string())
        };
    }

    /// The recorded outputs of one machine's commands.
    macro_rules! machine {
        ($dir:literal) => {
            MacOutputs {
                memsize: fixture!($dir, "sysctl-hw.memsize.txt"),
                brand_string: fixture!($dir, "sysctl-machdep.cpu.brand_string.txt"),
                hw_model: fixture!($dir, "sysctl-hw.model.txt"),
                ncpu: fixture!($dir, "sysctl-hw.ncpu.txt"),
                displays_json: fixture!($dir, "SPDisplaysDataType.json"),
                vm_stat: fixture!($dir, "vm_stat.txt"),
                pressure_level: fixture!($dir, "sysctl-kern.memorystatus_vm_pressure_level.txt"),
                sw_vers: fixture!($dir, "sw_vers.txt"),
            }
        };
    }

    const GIB: u64 = 1024 * 1024 * 1024;

    fn studio() -> MacOutputs {
        machine!("mac-studio-m3-ultra-512g")
    }
    fn mini() -> MacOutputs {
        machine!("mac-mini-m4-pro-64g")
    }
    fn macbook() -> MacOutputs {
        machine!("macbook-pro-m4-max-128g")
    }

    #[test]
    fn mac_studio_m3_ultra() {
        let cap = assemble(&studio(), None).expect("assemble");
        assert_eq!(cap.memory_bytes, 512 * GIB);
        assert_eq!(cap.allocatable_bytes, 508 * GIB);
        assert_eq!(cap.chip, "Apple M3 Ultra");
        assert_eq!(cap.cpu_model, "Apple M3 Ultra");
        assert_eq!(cap.cpu_cores, 32);
        assert_eq!(cap.gpu_cores, Some(80));
        assert_eq!(cap.hardware_model.as_deref(), Some("Mac15,14"));
        assert_eq!(cap.os, "macOS 26.2 (25C56)");
        assert_eq!(cap.memory_pressure, MemoryPressure::Normal);
        assert_eq!(cap.free_bytes, (21_000_000 + 3_900_000 + 310_000) * 16384);
    }

    #[test]
    fn mac_mini_m4_pro() {
        let cap = assemble(&mini(), Some(8 * GIB)).expect("assemble");
        assert_eq!(cap.memory_bytes, 64 * GIB);
        assert_eq!(cap.allocatable_bytes, 56 * GIB);
        assert_eq!(cap.chip, "Apple M4 Pro");
        assert_eq!(cap.cpu_cores, 14);
        assert_eq!(cap.gpu_cores, Some(20));
        assert_eq!(cap.hardware_model.as_deref(), Some("Mac16,11"));
        assert_eq!(cap.memory_pressure, MemoryPressure::Normal);
    }

    #[test]
    fn macbook_pro_m4_max_under_pressure() {
        let cap = assemble(&macbook(), None).expect("assemble");
        assert_eq!(cap.memory_bytes, 128 * GIB);
        assert_eq!(cap.allocatable_bytes, 124 * GIB);
        assert_eq!(cap.chip, "Apple M4 Max");
        assert_eq!(cap.cpu_cores, 16);
        assert_eq!(cap.gpu_cores, Some(40));
        assert_eq!(cap.hardware_model.as_deref(), Some("Mac16,5"));
        assert_eq!(cap.os, "macOS 26.1 (25B78)");
        assert_eq!(cap.memory_pressure, MemoryPressure::Warning);
        assert_eq!(cap.free_bytes, (42_187 + 1_201_330 + 8_120) * 16384);
    }

    #[test]
    fn vm_stat_fields() {
        let vm = parse_vm_stat(&macbook().vm_stat.unwrap_or_default()).expect("parse");
        assert_eq!(
            vm,
            VmStat {
                page_size: 16384,
                free: 42_187,
                active: 3_912_455,
                inactive: 1_201_330,
                speculative: 8_120,
                wired: 1_734_902,
                compressor: 1_310_004,
            }
        );
    }

    #[test]
    fn vm_stat_errors_name_the_line() {
        let err = parse_vm_stat("Pages free: 1.\n").expect_err("no header");
        assert!(err.to_string().contains("page size"), "{err}");
        let text = "Mach Virtual Memory Statistics: (page size of 4096 bytes)\nPages free: 1.\n";
        let err = parse_vm_stat(text).expect_err("missing lines");
        assert!(err.to_string().contains("Pages active"), "{err}");
        let text = "Mach Virtual Memory Statistics: (page size of 4096 bytes)\nPages free: many.\n";
        let err = parse_vm_stat(text).expect_err("bad count");
        assert!(err.to_string().contains("\"many\""), "{err}");
    }

    #[test]
    fn displays_json() {
        let gpu = parse_displays(&studio().displays_json.unwrap_or_default()).expect("parse");
        assert_eq!(
            gpu,
            GpuInfo {
                model: Some("Apple M3 Ultra".into()),
                cores: Some(80)
            }
        );
        // A headless Mac mini has no display list but still its GPU entry.
        let gpu = parse_displays(&mini().displays_json.unwrap_or_default()).expect("parse");
        assert_eq!(gpu.cores, Some(20));
        assert!(parse_displays(r#"{"SPDisplaysDataType": []}"#).is_err());
        assert!(parse_displays("not json").is_err());
        let err = parse_displays(r#"{"SPDisplaysDataType": [{"sppci_cores": "eighty"}]}"#)
            .expect_err("bad cores");
        assert!(err.to_string().contains("eighty"), "{err}");
    }

    #[test]
    fn scalar_parsers() {
        assert_eq!(parse_memsize("68719476736\n").expect("memsize"), 64 * GIB);
        assert!(parse_memsize("").is_err());
        assert!(parse_memsize("0").is_err());
        assert_eq!(parse_ncpu("14\n").expect("ncpu"), 14);
        assert!(parse_ncpu("-1").is_err());
        assert_eq!(
            parse_brand_string("Apple M4 Max\n").as_deref(),
            Some("Apple M4 Max")
        );
        assert_eq!(parse_hw_model("  \n"), None);
        assert_eq!(
            parse_pressure_level("1\n").expect("1"),
            MemoryPressure::Normal
        );
        assert_eq!(
            parse_pressure_level("2").expect("2"),
            MemoryPressure::Warning
        );
        assert_eq!(
            parse_pressure_level("4").expect("4"),
            MemoryPressure::Critical
        );
        assert!(parse_pressure_level("3").is_err());
        assert_eq!(
            parse_sw_vers("ProductVersion: 15.5\n").as_deref(),
            Some("macOS 15.5")
        );
        assert_eq!(parse_sw_vers("garbage"), None);
    }

    #[test]
    fn failed_commands_degrade_their_fields_only() {
        let out = MacOutputs {
            memsize: studio().memsize,
            vm_stat: studio().vm_stat,
            ..MacOutputs::default()
        };
        let cap = assemble(&out, None).expect("memsize alone is enough");
        assert_eq!(cap.memory_bytes, 512 * GIB);
        assert_eq!(cap.chip, "unknown Apple chip");
        assert_eq!(cap.cpu_cores, 0);
        assert_eq!(cap.gpu_cores, None);
        assert_eq!(cap.hardware_model, None);
        assert_eq!(cap.os, "macOS");
        // Without the kernel's level, pressure comes from vm_stat's free share (~75 % here).
        assert_eq!(cap.memory_pressure, MemoryPressure::Normal);

        // The chip falls back to the GPU's model name when the brand string is missing.
        let out = MacOutputs {
            brand_string: None,
            ..mini()
        };
        assert_eq!(assemble(&out, None).expect("assemble").chip, "Apple M4 Pro");

        // Garbage in one output is logged and ignored.
        let out = MacOutputs {
            vm_stat: Some("oops".into()),
            pressure_level: Some("9".into()),
            ..mini()
        };
        let cap = assemble(&out, None).expect("assemble");
        assert_eq!(cap.free_bytes, 0);
        assert_eq!(cap.memory_pressure, MemoryPressure::Normal);
    }

    #[test]
    fn memsize_is_essential() {
        let err = assemble(
            &MacOutputs {
                memsize: None,
                ..studio()
            },
            None,
        )
        .expect_err("no memsize");
        assert!(err.to_string().contains("hw.memsize"), "{err}");
        let err = assemble(
            &MacOutputs {
                memsize: Some("x".into()),
                ..studio()
            },
            None,
        )
        .expect_err("bad memsize");
        assert!(err.to_string().contains("\"x\""), "{err}");
    }
}
