//! What a job asks of the machine that runs it ([`HostNeeds`], an OpenJD
//! template's `hostRequirements`), and what a worker says of its machine
//! when it joins ([`HostFacts`]). The scheduler gives a job's tasks only to
//! workers whose facts meet its needs; a worker that reports none (an older
//! release) gets no job that has needs.

use serde::{Deserialize, Serialize};

/// An inclusive range of an amount; `max` `None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Amount {
    pub min: u64,
    pub max: Option<u64>,
}

impl Amount {
    pub fn holds(&self, n: u64) -> bool {
        n >= self.min && self.max.is_none_or(|m| n <= m)
    }

    fn shown(&self, unit: &str) -> String {
        match self.max {
            Some(m) if m == self.min => format!("{m}{unit}"),
            Some(m) => format!("{}–{m}{unit}", self.min),
            None => format!("at least {}{unit}", self.min),
        }
    }
}

/// What a job needs of a worker's machine. Each `None` asks nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostNeeds {
    /// GPUs (`amount.worker.gpu`).
    pub gpus: Option<Amount>,
    /// Memory of the smallest GPU, MiB (`amount.worker.gpu.memory`).
    pub gpu_memory_mib: Option<Amount>,
    /// CPU cores (`amount.worker.vcpu`).
    pub cpus: Option<Amount>,
    /// Memory, MiB (`amount.worker.memory`).
    pub memory_mib: Option<Amount>,
    /// Operating systems, any of (`attr.worker.os.family`: `linux`,
    /// `windows`, `macos`).
    pub os: Vec<String>,
    /// CPU architectures, any of (`attr.worker.cpu.arch`: `x86_64`,
    /// `arm64`).
    pub arch: Vec<String>,
}

/// The most names [`HostNeeds::os`] or [`HostNeeds::arch`] may list.
pub const MAX_NAMES: usize = 8;

/// What a worker's machine has, as it says when it joins.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostFacts {
    pub gpus: u64,
    /// Memory of its smallest GPU, MiB (0 without GPUs).
    pub gpu_memory_mib: u64,
    pub cpus: u64,
    pub memory_mib: u64,
    /// `linux`, `windows` or `macos`, as OpenJD names them.
    pub os: String,
    /// `x86_64` or `arm64`, as OpenJD names them.
    pub arch: String,
}

impl HostFacts {
    /// OpenJD's name of this build's operating system and architecture.
    pub fn this_build() -> (String, String) {
        // Rust's names for these are OpenJD's.
        let os = std::env::consts::OS;
        let arch = match std::env::consts::ARCH {
            "aarch64" => "arm64",
            other => other,
        };
        (os.to_string(), arch.to_string())
    }
}

impl HostNeeds {
    /// Whether it asks anything at all.
    pub fn is_empty(&self) -> bool {
        *self == HostNeeds::default()
    }

    /// Checks its bounds (names listed, each short).
    pub fn check(&self) -> Result<(), String> {
        for (what, names) in [("os", &self.os), ("arch", &self.arch)] {
            if names.len() > MAX_NAMES || names.iter().any(|n| n.is_empty() || n.len() > 32) {
                return Err(format!(
                    "host needs: `{what}` lists at most {MAX_NAMES} names of 1 to 32 characters"
                ));
            }
        }
        Ok(())
    }

    /// Why a machine with `facts` does not meet these needs; `None` when
    /// it does.
    pub fn unmet(&self, facts: &HostFacts) -> Option<String> {
        let amounts = [
            (self.gpus, facts.gpus, "GPUs", ""),
            (
                self.gpu_memory_mib,
                facts.gpu_memory_mib,
                "GPU memory",
                " MiB",
            ),
            (self.cpus, facts.cpus, "CPU cores", ""),
            (self.memory_mib, facts.memory_mib, "memory", " MiB"),
        ];
        for (need, has, what, unit) in amounts {
            if let Some(n) = need.filter(|n| !n.holds(has)) {
                return Some(format!("needs {} {what}; has {has}{unit}", n.shown(unit)));
            }
        }
        for (names, has, what) in [
            (&self.os, &facts.os, "OS"),
            (&self.arch, &facts.arch, "CPU"),
        ] {
            if !names.is_empty() && !names.contains(has) {
                return Some(format!("needs a {} {what}; has {has}", names.join(" or ")));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_meet_facts_or_say_what_is_missing() {
        let facts = HostFacts {
            gpus: 2,
            gpu_memory_mib: 24_000,
            cpus: 16,
            memory_mib: 64_000,
            os: "linux".into(),
            arch: "x86_64".into(),
        };
        assert_eq!(HostNeeds::default().unmet(&facts), None);
        let gpus = |min, max| HostNeeds {
            gpus: Some(Amount { min, max }),
            ..HostNeeds::default()
        };
        assert_eq!(gpus(1, None).unmet(&facts), None);
        assert_eq!(
            gpus(4, None).unmet(&facts).as_deref(),
            Some("needs at least 4 GPUs; has 2")
        );
        assert_eq!(
            gpus(0, Some(0)).unmet(&facts).as_deref(),
            Some("needs 0 GPUs; has 2")
        );
        let windows = HostNeeds {
            os: vec!["windows".into()],
            memory_mib: Some(Amount {
                min: 8192,
                max: None,
            }),
            ..HostNeeds::default()
        };
        assert_eq!(
            windows.unmet(&facts).as_deref(),
            Some("needs a windows OS; has linux")
        );
    }
}
