//! What this worker's machine looks like right now, for heartbeats: each
//! NVIDIA GPU as NVML reads it, and the host's CPU model, load and memory from
//! `/proc`. A machine without an NVIDIA driver is an expected case, not an
//! error: it gets host readings and a `gpu_note` saying why there are no GPUs.
//! NVML calls are kept apart from the pure functions that turn readings into
//! the wire's `Telemetry`, so the mapping is tested with recorded values.

use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{MemoryInfo, Utilization};
use nvml_wrapper::{Device, Nvml};
use tessera_protocol::telemetry::{GpuTelemetry, HostTelemetry, Telemetry};

/// The NVML library names tried in order: the versioned name the driver
/// always installs, then the unversioned one only development packages add.
#[cfg(target_os = "linux")]
const NVML_LIBS: &[&str] = &["libnvidia-ml.so.1", "libnvidia-ml.so"];
#[cfg(not(target_os = "linux"))]
const NVML_LIBS: &[&str] = &["nvml.dll"];

/// Takes telemetry samples. NVML is initialised once, in `new`; where it
/// cannot be, every sample carries the reason instead of GPU readings.
pub struct Sampler {
    nvml: Result<Nvml, String>,
}

impl Sampler {
    pub fn new() -> Sampler {
        let nvml = init_nvml(NVML_LIBS);
        if let Err(note) = &nvml {
            tracing::info!("no GPU telemetry: {note}");
        }
        Sampler { nvml }
    }

    /// Reads the host and every GPU. Never fails: what cannot be read is 0.
    pub fn sample(&mut self) -> Telemetry {
        let (gpus, gpu_note) = match &self.nvml {
            Ok(nvml) => sample_gpus(nvml),
            Err(note) => (Vec::new(), Some(note.clone())),
        };
        Telemetry {
            host: sample_host(),
            gpus,
            gpu_note,
        }
    }
}

impl Default for Sampler {
    fn default() -> Sampler {
        Sampler::new()
    }
}

/// What this machine has, as a worker says when it joins (for jobs with
/// host needs): its GPUs as NVML finds them (none without a driver), the
/// memory of the smallest, its cores, memory, OS and architecture.
pub fn host_facts() -> tessera_protocol::host::HostFacts {
    let t = Sampler::new().sample();
    let mib = |bytes: u64| bytes >> 20;
    let (os, arch) = tessera_protocol::host::HostFacts::this_build();
    tessera_protocol::host::HostFacts {
        gpus: t.gpus.len() as u64,
        gpu_memory_mib: (t.gpus.iter())
            .map(|g| mib(g.memory_total_bytes))
            .min()
            .unwrap_or(0),
        cpus: u64::from(t.host.cores),
        memory_mib: mib(t.host.memory_total_bytes),
        os,
        arch,
    }
}

/// How many GPUs NVML finds, or why none (`--slots auto`).
pub fn gpu_count() -> Result<u32, String> {
    let nvml = init_nvml(NVML_LIBS)?;
    nvml.device_count().map_err(|e| format!("NVML failed: {e}"))
}

/// Loads NVML, or says why not: "no NVIDIA driver" when no library loads,
/// "NVML failed: …" when one loads but will not initialise.
fn init_nvml(libs: &[&str]) -> Result<Nvml, String> {
    let mut init_error = None;
    for lib in libs {
        match Nvml::builder().lib_path(OsStr::new(lib)).init() {
            Ok(nvml) => return Ok(nvml),
            Err(NvmlError::LibloadingError(_)) => {}
            Err(e) => init_error = init_error.or(Some(e)),
        }
    }
    Err(match init_error {
        Some(e) => format!("NVML failed: {e}"),
        None => "no NVIDIA driver".to_string(),
    })
}

fn sample_gpus(nvml: &Nvml) -> (Vec<GpuTelemetry>, Option<String>) {
    let count = match nvml.device_count() {
        Ok(count) => count,
        Err(e) => return (Vec::new(), Some(format!("NVML failed: {e}"))),
    };
    let mut gpus = Vec::new();
    let mut notes = Vec::new();
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => gpus.push(gpu_from_readings(index, read_gpu(&device))),
            Err(e) => notes.push(format!("GPU {index}: NVML failed: {e}")),
        }
    }
    let note = if count == 0 {
        Some("no NVIDIA GPU".to_string())
    } else if notes.is_empty() {
        None
    } else {
        Some(notes.join("; "))
    };
    (gpus, note)
}

/// One GPU's NVML answers, as NVML gives them; `None` where a query failed
/// (power readings are not supported on every board, for instance).
#[derive(Debug, Clone, Default)]
struct RawGpuReadings {
    name: Option<String>,
    utilization: Option<Utilization>,
    memory: Option<MemoryInfo>,
    temperature_c: Option<u32>,
    power_usage_mw: Option<u32>,
    power_limit_mw: Option<u32>,
    sm_clock_mhz: Option<u32>,
    memory_clock_mhz: Option<u32>,
}

fn read_gpu(device: &Device<'_>) -> RawGpuReadings {
    RawGpuReadings {
        name: device.name().ok(),
        utilization: device.utilization_rates().ok(),
        memory: device.memory_info().ok(),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        power_usage_mw: device.power_usage().ok(),
        power_limit_mw: device.enforced_power_limit().ok(),
        sm_clock_mhz: device.clock_info(Clock::SM).ok(),
        memory_clock_mhz: device.clock_info(Clock::Memory).ok(),
    }
}

fn gpu_from_readings(index: u32, raw: RawGpuReadings) -> GpuTelemetry {
    let watts = |mw: Option<u32>| mw.unwrap_or(0) as f32 / 1000.0;
    GpuTelemetry {
        index,
        name: raw.name.unwrap_or_else(|| format!("NVIDIA GPU {index}")),
        utilization_pct: raw.utilization.map_or(0, |u| u.gpu),
        memory_used_bytes: raw.memory.as_ref().map_or(0, |m| m.used),
        memory_total_bytes: raw.memory.as_ref().map_or(0, |m| m.total),
        temperature_c: raw.temperature_c.unwrap_or(0),
        power_draw_w: watts(raw.power_usage_mw),
        power_limit_w: watts(raw.power_limit_mw),
        sm_clock_mhz: raw.sm_clock_mhz.unwrap_or(0),
        memory_clock_mhz: raw.memory_clock_mhz.unwrap_or(0),
    }
}

/// Reads `/proc`; a file that is missing (not Linux) reads as zeros.
fn sample_host() -> HostTelemetry {
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    let memory = parse_meminfo(&read("/proc/meminfo"));
    HostTelemetry {
        cpu_model: parse_cpu_model(&read("/proc/cpuinfo")),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        load_1m: parse_loadavg(&read("/proc/loadavg")),
        memory_used_bytes: memory.used,
        memory_total_bytes: memory.total,
    }
}

#[derive(Debug, PartialEq)]
struct MemoryBytes {
    used: u64,
    total: u64,
}

/// `MemTotal − MemAvailable`; kernels before 3.14 lack `MemAvailable`, and
/// there `MemFree` stands in (an overestimate of what is used).
fn parse_meminfo(meminfo: &str) -> MemoryBytes {
    let field = |name: &str| {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    let total = field("MemTotal").unwrap_or(0);
    let available = field("MemAvailable")
        .or_else(|| field("MemFree"))
        .unwrap_or(0);
    MemoryBytes {
        used: total.saturating_sub(available),
        total,
    }
}

fn parse_loadavg(loadavg: &str) -> f32 {
    loadavg
        .split_whitespace()
        .next()
        .and_then(|load| load.parse().ok())
        .unwrap_or(0.0)
}

fn parse_cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "model name" && !value.trim().is_empty()).then(|| value.trim())
        })
        .unwrap_or("unknown CPU")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn memory(used: u64, total: u64) -> Option<MemoryInfo> {
        Some(MemoryInfo {
            free: total - used,
            reserved: 0,
            total,
            used,
            version: 0x0200_0028,
        })
    }

    fn utilization(gpu: u32, memory: u32) -> Option<Utilization> {
        Some(Utilization { gpu, memory })
    }

    fn check(raw: RawGpuReadings, expected: GpuTelemetry) {
        assert_eq!(gpu_from_readings(expected.index, raw), expected);
    }

    #[test]
    fn rtx_4090_rendering() {
        check(
            RawGpuReadings {
                name: Some("NVIDIA GeForce RTX 4090".into()),
                utilization: utilization(98, 41),
                memory: memory(19_327_352_832, 25_757_220_864),
                temperature_c: Some(71),
                power_usage_mw: Some(350_000),
                power_limit_mw: Some(450_000),
                sm_clock_mhz: Some(2_520),
                memory_clock_mhz: Some(10_501),
            },
            GpuTelemetry {
                index: 0,
                name: "NVIDIA GeForce RTX 4090".into(),
                utilization_pct: 98,
                memory_used_bytes: 18 * GIB,
                memory_total_bytes: 25_757_220_864, // 24564 MiB
                temperature_c: 71,
                power_draw_w: 350.0,
                power_limit_w: 450.0,
                sm_clock_mhz: 2_520,
                memory_clock_mhz: 10_501,
            },
        );
    }

    #[test]
    fn a100_idle_second_gpu() {
        check(
            RawGpuReadings {
                name: Some("NVIDIA A100-SXM4-80GB".into()),
                utilization: utilization(0, 0),
                memory: memory(4_718_592, 80 * GIB),
                temperature_c: Some(34),
                power_usage_mw: Some(61_250),
                power_limit_mw: Some(400_000),
                sm_clock_mhz: Some(210),
                memory_clock_mhz: Some(1_593),
            },
            GpuTelemetry {
                index: 1,
                name: "NVIDIA A100-SXM4-80GB".into(),
                utilization_pct: 0,
                memory_used_bytes: 4_718_592,
                memory_total_bytes: 85_899_345_920,
                temperature_c: 34,
                power_draw_w: 61.25,
                power_limit_w: 400.0,
                sm_clock_mhz: 210,
                memory_clock_mhz: 1_593,
            },
        );
    }

    #[test]
    fn unsupported_readings_are_zero_not_a_missing_gpu() {
        check(
            RawGpuReadings {
                memory: memory(512 << 20, 8 * GIB),
                ..RawGpuReadings::default()
            },
            GpuTelemetry {
                index: 2,
                name: "NVIDIA GPU 2".into(),
                utilization_pct: 0,
                memory_used_bytes: 512 << 20,
                memory_total_bytes: 8 * GIB,
                temperature_c: 0,
                power_draw_w: 0.0,
                power_limit_w: 0.0,
                sm_clock_mhz: 0,
                memory_clock_mhz: 0,
            },
        );
    }

    #[test]
    fn meminfo() {
        let recorded = "MemTotal:       24684092 kB\nMemFree:        23257836 kB\n\
                        MemAvailable:   23777680 kB\nBuffers:            7612 kB\n";
        let expected = MemoryBytes {
            used: (24_684_092 - 23_777_680) * 1024,
            total: 24_684_092 * 1024,
        };
        assert_eq!(parse_meminfo(recorded), expected);
        let old_kernel = "MemTotal:  1000 kB\nMemFree:  400 kB\n";
        let expected = MemoryBytes {
            used: 600 * 1024,
            total: 1000 * 1024,
        };
        assert_eq!(parse_meminfo(old_kernel), expected);
        assert_eq!(parse_meminfo(""), MemoryBytes { used: 0, total: 0 });
    }

    #[test]
    fn loadavg() {
        assert_eq!(parse_loadavg("0.55 0.32 0.77 3/121 19360\n"), 0.55);
        assert_eq!(parse_loadavg("12.04 9.87 8.10 17/1045 88211\n"), 12.04);
        assert_eq!(parse_loadavg(""), 0.0);
    }

    #[test]
    fn cpu_model() {
        let epyc = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\
                    model\t\t: 1\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n\
                    processor\t: 1\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n";
        assert_eq!(parse_cpu_model(epyc), "AMD EPYC 7B13 64-Core Processor");
        // aarch64 kernels print no model name.
        let arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n";
        assert_eq!(parse_cpu_model(arm), "unknown CPU");
        assert_eq!(parse_cpu_model(""), "unknown CPU");
    }

    #[test]
    fn no_library_is_no_driver() {
        let absent = init_nvml(&["libnvidia-ml-absent.so.9", "/nonexistent/libnvidia-ml.so"]);
        assert_eq!(absent.err().as_deref(), Some("no NVIDIA driver"));
    }

    #[test]
    fn sampler_is_send() {
        fn send<T: Send>() {}
        send::<Sampler>();
    }

    /// This machine has no NVIDIA driver; on one that has, it must report GPUs.
    #[test]
    fn samples_this_machine() {
        let telemetry = Sampler::new().sample();
        let host = &telemetry.host;
        assert!(!host.cpu_model.is_empty());
        assert!(host.cores >= 1);
        assert!(host.memory_total_bytes > 0);
        assert!(host.memory_used_bytes <= host.memory_total_bytes);
        if telemetry.gpus.is_empty() {
            let note = telemetry.gpu_note.expect("a reason for no GPUs");
            let known = ["no NVIDIA driver", "NVML failed: ", "no NVIDIA GPU"];
            assert!(known.iter().any(|k| note.starts_with(k)), "{note}");
        } else {
            assert!(telemetry.gpus.iter().all(|gpu| gpu.memory_total_bytes > 0));
        }
    }
}
