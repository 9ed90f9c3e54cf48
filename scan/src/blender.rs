//! Blender on the submitting machine: finding it, the arguments every
//! invocation starts with, and the dependency scan it runs on a `.blend`
//! (`scan.py`: Blender itself lists every file the scene uses).

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The dependency scan, run on the submitting machine.
pub const SCAN_PY: &str = include_str!("blender/scan.py");
/// What every Blender invocation starts with: a submitted file's Python
/// never runs.
pub const SAFE_ARGS: [&str; 3] = ["-b", "--factory-startup", "--disable-autoexec"];

/// Finds Blender: `$TESSERA_BLENDER`, else `blender` on the PATH. Returns the
/// executable and its version line, or `None` when it cannot run.
pub fn detect() -> Option<(PathBuf, String)> {
    let exe =
        std::env::var_os("TESSERA_BLENDER").map_or_else(|| PathBuf::from("blender"), PathBuf::from);
    let out = Command::new(&exe)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find(|l| l.starts_with("Blender "))?
        .trim()
        .to_string();
    out.status.success().then_some((exe, version))
}
