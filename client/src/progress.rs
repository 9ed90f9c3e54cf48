//! A one-line progress bar on stderr, drawn only when stderr is a terminal:
//! done/total, percentage, rate and ETA.

use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    label: &'static str,
    unit: &'static str,
    started: Instant,
    enabled: bool,
}

impl Progress {
    pub fn new(label: &'static str, unit: &'static str) -> Progress {
        Progress {
            label,
            unit,
            started: Instant::now(),
            enabled: std::io::stderr().is_terminal(),
        }
    }

    pub fn update(&mut self, done: u64, total: u64) {
        if !self.enabled {
            return;
        }
        let frac = if total == 0 {
            1.0
        } else {
            done as f64 / total as f64
        };
        let width = 30;
        let filled = (frac * width as f64).round() as usize;
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = done as f64 / secs;
        let eta = if done > 0 && done < total {
            format!(" ETA {:.0}s", (total - done) as f64 / rate)
        } else {
            String::new()
        };
        let (d, t, r) = if self.unit == "bytes" {
            (
                human_bytes(done),
                human_bytes(total),
                format!("{}/s", human_bytes(rate as u64)),
            )
        } else {
            (
                done.to_string(),
                total.to_string(),
                format!("{rate:.1} {}/s", self.unit),
            )
        };
        let _ = write!(
            std::io::stderr(),
            "\r{} [{}{}] {d}/{t} {:>3.0}% {r}{eta}\x1b[K",
            self.label,
            "#".repeat(filled),
            "-".repeat(width - filled.min(width)),
            frac * 100.0
        );
    }

    pub fn finish(&mut self) {
        if self.enabled {
            let _ = writeln!(std::io::stderr());
            self.enabled = false;
        }
    }
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}
