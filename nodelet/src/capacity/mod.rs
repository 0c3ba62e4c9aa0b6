//! What this machine has: memory, CPU, GPU and how much memory is free right now, read from the
//! operating system. The nodelet reports it in its Node's status and the scheduler places work
//! by it.
//!
//! Each OS has its own module of pure parsers (tested on Linux with recorded fixtures) plus one
//! thin function that gathers the raw text; [`read`] dispatches to the one for this OS.

pub mod linux;
pub mod macos;

use serde::{Deserialize, Serialize};

/// One GiB in bytes.
const GIB: u64 = 1024 * 1024 * 1024;

/// A machine's resources as the nodelet reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// Physical memory (unified memory on Apple silicon), bytes.
    pub memory_bytes: u64,
    /// Memory that work may be placed into: `memory_bytes` minus the reserve for the OS.
    pub allocatable_bytes: u64,
    /// CPU model as the OS names it ("Apple M3 Ultra", "AMD EPYC 7B13").
    pub cpu_model: String,
    /// Logical CPUs.
    pub cpu_cores: u32,
    /// GPU cores (Apple silicon only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_cores: Option<u32>,
    /// The chip ("Apple M3 Ultra"), or the CPU model on Linux.
    pub chip: String,
    /// Hardware model identifier ("Mac15,14"), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_model: Option<String>,
    /// Operating system and version ("macOS 26.2 (25C56)").
    pub os: String,
    /// How hard the OS is pressed for memory right now.
    pub memory_pressure: MemoryPressure,
    /// Memory the OS could hand out now without swapping, bytes (an estimate).
    pub free_bytes: u64,
}

/// Memory pressure, on macOS as the kernel reports it, on Linux derived from MemAvailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum MemoryPressure {
    #[default]
    Normal,
    Warning,
    Critical,
}

impl MemoryPressure {
    /// Pressure from the share of memory still available: under 10 % is critical, under 20 %
    /// a warning. Used on Linux, and on macOS when the kernel's own level cannot be read.
    pub fn from_available(available_bytes: u64, total_bytes: u64) -> Self {
        if total_bytes == 0 {
            return Self::Normal;
        }
        // Integer math: available/total < 10 %  <=>  available*10 < total.
        let available = u128::from(available_bytes);
        let total = u128::from(total_bytes);
        if available * 10 < total {
            Self::Critical
        } else if available * 5 < total {
            Self::Warning
        } else {
            Self::Normal
        }
    }
}

/// Why the capacity could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("cannot read {source_name}: {source}")]
    Io {
        source_name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{command}`: {message}")]
    Command { command: String, message: String },
    #[error("cannot parse {source_name}: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("reading capacity is not supported on {os}")]
    Unsupported { os: String },
}

impl CapacityError {
    pub(crate) fn parse(source_name: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Parse {
            source_name: source_name.into(),
            message: message.into(),
        }
    }
}

/// The memory kept back for the OS and the nodelet when none is configured: 4 GiB or 10 % of
/// total memory, whichever is smaller (so a 16 GB Mac keeps 1.6 GB, a 512 GB Mac keeps 4 GiB).
pub const fn default_reserve(total_bytes: u64) -> u64 {
    let tenth = total_bytes / 10;
    if tenth < 4 * GIB { tenth } else { 4 * GIB }
}

/// Memory that work may use: total minus the reserve (never below zero).
pub const fn allocatable(total_bytes: u64, reserved_bytes: u64) -> u64 {
    total_bytes.saturating_sub(reserved_bytes)
}

/// Reads this machine's capacity, keeping `reserved_bytes` back from what work may use.
pub fn read(reserved_bytes: u64) -> Result<Capacity, CapacityError> {
    read_os(Some(reserved_bytes))
}

/// Reads this machine's capacity with the [`default_reserve`].
pub fn read_with_default_reserve() -> Result<Capacity, CapacityError> {
    read_os(None)
}

#[cfg(target_os = "linux")]
fn read_os(reserved_bytes: Option<u64>) -> Result<Capacity, CapacityError> {
    linux::read(reserved_bytes)
}

#[cfg(target_os = "macos")]
fn read_os(reserved_bytes: Option<u64>) -> Result<Capacity, CapacityError> {
    macos::read(reserved_bytes)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn read_os(_reserved_bytes: Option<u64>) -> Result<Capacity, CapacityError> {
    Err(CapacityError::Unsupported {
        os: std::env::consts::OS.to_string(),
    })
}

/// The reserve to apply: the configured one, or the default for this much memory.
pub(crate) fn reserve_for(total_bytes: u64, reserved_bytes: Option<u64>) -> u64 {
    reserved_bytes.unwrap_or_else(|| default_reserve(total_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_reserve_is_the_smaller_of_4gib_and_a_tenth() {
        assert_eq!(default_reserve(16 * GIB), 16 * GIB / 10);
        assert_eq!(default_reserve(40 * GIB), 4 * GIB);
        assert_eq!(default_reserve(512 * GIB), 4 * GIB);
        assert_eq!(default_reserve(0), 0);
    }

    #[test]
    fn allocatable_never_underflows() {
        assert_eq!(allocatable(64 * GIB, 4 * GIB), 60 * GIB);
        assert_eq!(allocatable(GIB, 4 * GIB), 0);
        assert_eq!(reserve_for(64 * GIB, None), 4 * GIB);
        assert_eq!(reserve_for(64 * GIB, Some(GIB)), GIB);
    }

    #[test]
    fn pressure_thresholds() {
        assert_eq!(
            MemoryPressure::from_available(50, 100),
            MemoryPressure::Normal
        );
        assert_eq!(
            MemoryPressure::from_available(20, 100),
            MemoryPressure::Normal
        );
        assert_eq!(
            MemoryPressure::from_available(19, 100),
            MemoryPressure::Warning
        );
        assert_eq!(
            MemoryPressure::from_available(10, 100),
            MemoryPressure::Warning
        );
        assert_eq!(
            MemoryPressure::from_available(9, 100),
            MemoryPressure::Critical
        );
        assert_eq!(MemoryPressure::from_available(0, 0), MemoryPressure::Normal);
    }

    #[test]
    fn serializes_camel_case() {
        let cap = Capacity {
            memory_bytes: 64 * GIB,
            allocatable_bytes: 60 * GIB,
            cpu_model: "Apple M4 Pro".into(),
            cpu_cores: 14,
            gpu_cores: Some(20),
            chip: "Apple M4 Pro".into(),
            hardware_model: Some("Mac16,11".into()),
            os: "macOS 26.2 (25C56)".into(),
            memory_pressure: MemoryPressure::Warning,
            free_bytes: GIB,
        };
        let json = serde_json::to_value(&cap).expect("serialize");
        assert_eq!(json["memoryBytes"], 64 * GIB);
        assert_eq!(json["allocatableBytes"], 60 * GIB);
        assert_eq!(json["gpuCores"], 20);
        assert_eq!(json["hardwareModel"], "Mac16,11");
        assert_eq!(json["memoryPressure"], "Warning");
        assert_eq!(json["freeBytes"], GIB);
        let back: Capacity = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back, cap);
    }
}
