//! What a worker reports about its machine: per-GPU readings where an NVIDIA
//! driver is present, and the host's CPU, load and memory always. Sent with
//! heartbeats at a modest rate.

use serde::{Deserialize, Serialize};

/// One GPU, as NVML reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    pub index: u32,
    pub name: String,
    /// GPU busy time over the last sample period, percent.
    pub utilization_pct: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub temperature_c: u32,
    pub power_draw_w: f32,
    pub power_limit_w: f32,
    pub sm_clock_mhz: u32,
    pub memory_clock_mhz: u32,
}

/// The host, always available.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTelemetry {
    pub cpu_model: String,
    pub cores: u32,
    /// 1-minute load average.
    pub load_1m: f32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    pub host: HostTelemetry,
    pub gpus: Vec<GpuTelemetry>,
    /// Why there are no GPU readings, e.g. "no NVIDIA driver".
    pub gpu_note: Option<String>,
}
