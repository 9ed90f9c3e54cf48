//! How a coordinator runs: addresses, heartbeat and lease timing, retries,
//! stragglers, cache affinity and retention.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// The address written into tickets, when it differs from `listen`
    /// (a public address in front of `0.0.0.0`).
    pub advertise: Option<SocketAddr>,
    pub heartbeat_ms: u64,
    pub lease_ms: u64,
    pub max_attempts: u32,
    /// The wait before a failed task's first retry; doubles with each
    /// further failure.
    pub retry_backoff_ms: u64,
    /// A task running this many percent of its job's mean task time, when
    /// the job has nothing left to hand out, is started again on an idle
    /// worker (0: never).
    pub straggler_percent: u32,
    /// Prefer workers whose cache holds a task's assets.
    pub cache_affinity: bool,
    /// How long a finished job's assets and frames are kept.
    pub retention: Duration,
}

impl Config {
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> Config {
        Config {
            data_dir,
            listen,
            advertise: None,
            heartbeat_ms: 1000,
            lease_ms: 2500,
            max_attempts: 3,
            retry_backoff_ms: 1000,
            straggler_percent: 300,
            cache_affinity: true,
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}
