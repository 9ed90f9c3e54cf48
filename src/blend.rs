//! Submitting `.blend` files: Blender itself lists everything the file needs
//! (images, sequences, UDIM tiles, linked libraries recursively, fonts,
//! sounds, clips, volumes, caches), run safely on the submitting machine. Each
//! file gets a path in the job folder: its path relative to the .blend's
//! folder when it lies inside it, `_abs/<absolute path>` otherwise. Workers
//! remap the references from the artist's paths to those.

use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context};
use serde::Deserialize;
use tessera_protocol::blender::BlenderVersion;
use tessera_scan::blender;
use tessera_scan::blender_runtime::{self, Runtime};

#[derive(Debug, Deserialize)]
pub struct Scan {
    pub blender_version: String,
    pub render_engine: String,
    pub frame_start: u32,
    pub frame_end: u32,
    pub resolution: (u32, u32),
    pub samples: u32,
    pub file_format: String,
    /// The frame-name template (`sh010_####.exr`).
    #[serde(default)]
    pub output_name: Option<String>,
    #[serde(default)]
    pub use_denoising: bool,
    #[serde(default)]
    pub use_adaptive_sampling: bool,
    #[serde(default)]
    pub use_osl: bool,
    #[serde(default)]
    pub denoiser: Option<String>,
    #[serde(default)]
    pub sampling_pattern: Option<String>,
    pub time_limit: bool,
    #[serde(default)]
    pub layer_sample_overrides: Vec<String>,
    #[serde(default)]
    pub compositing: bool,
    #[serde(default)]
    pub stamp_burn_in: bool,
    #[serde(default)]
    pub is_movie: bool,
    pub compressed: Option<String>,
    pub files: Vec<Dependency>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Dependency {
    pub path: String,
    pub kind: String,
    pub user: String,
    pub exists: bool,
}

/// The Blender that lists a file's dependencies: one that can read it, never
/// one older than the file. This machine's own Blender when its version is
/// the file's; else the `bpy` interpreter named by `--blender-python` or
/// `TESSERA_BLENDER_PYTHON` (when it is not older than the file); else this
/// machine's Blender when it is newer than the file.
pub fn scanner(
    blend: &Path,
    saved: BlenderVersion,
    python: Option<&Path>,
) -> anyhow::Result<Runtime> {
    let version_of = blender_runtime::version;
    let local = blender::detect().map(|(exe, _)| Runtime::Executable(exe));
    let local_version = local.as_ref().and_then(|r| version_of(r).ok());
    let name = |v: Option<BlenderVersion>| v.map_or("none".to_string(), |v| v.to_string());
    if let (Some(r), Some(v)) = (&local, local_version) {
        if v.series() == saved.series() {
            return Ok(r.clone());
        }
    }
    if let Some(py) = python {
        let r = Runtime::Module(py.to_path_buf());
        let v = version_of(&r)
            .with_context(|| format!("--blender-python {}: not a Python with bpy", py.display()))?;
        if v.series() < saved.series() {
            bail!(
                "`{}` was saved by Blender {}; the bpy at {} is Blender {v}, which cannot read it",
                blend.display(),
                saved.short(),
                py.display()
            );
        }
        return Ok(r);
    }
    if let (Some(r), Some(v)) = (local, local_version) {
        if v.series() > saved.series() {
            return Ok(r);
        }
    }
    bail!(
        "`{}` was saved by Blender {}; this machine's Blender is {}, which cannot read it: pass --blender-python PATH (or set TESSERA_BLENDER_PYTHON) to a Python where `import bpy` is Blender {} or newer",
        blend.display(),
        saved.short(),
        name(local_version),
        saved.short()
    )
}

/// Runs the dependency scan on `blend` in `runtime`.
pub fn scan(blend: &Path, runtime: &Runtime) -> anyhow::Result<Scan> {
    let out_dir = std::env::temp_dir().join(format!("tessera-scan-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir)?;
    let out_json = out_dir.join("scan.json");
    let _ = std::fs::remove_file(&out_json);
    let output = runtime
        .command(Some(blend), blender::SCAN_PY, &[&out_json], 0)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", runtime.path().display()))?;
    let result = std::fs::read(&out_json);
    let _ = std::fs::remove_dir_all(&out_dir);
    match result {
        Ok(bytes) if output.status.success() => {
            serde_json::from_slice(&bytes).context("the dependency scan wrote unreadable JSON")
        }
        _ => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            let reason = text
                .lines()
                .find(|l| l.starts_with("Error:") || l.contains("Error:"))
                .map(|l| l.trim().trim_start_matches("Error:").trim().to_string())
                .unwrap_or_else(|| format!("blender exited with {}", output.status));
            bail!(
                "`{}` is not a readable .blend file: {reason}",
                blend.display()
            )
        }
    }
}

/// The job-folder path of `file`, given the folder of the main .blend.
pub fn job_path(project: &Path, file: &Path) -> anyhow::Result<String> {
    let rel = match file.strip_prefix(project) {
        Ok(rel) => rel.to_path_buf(),
        Err(_) => Path::new("_abs").join(file.strip_prefix("/").unwrap_or(file)),
    };
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(
                p.to_str()
                    .with_context(|| format!("`{}` is not UTF-8", file.display()))?,
            ),
            _ => bail!("cannot place `{}` in the job folder", file.display()),
        }
    }
    Ok(parts.join("/"))
}

/// Absolute, normalised (no `.`/`..`) form of `path`.
pub fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::path::absolute(path)?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_inside_the_project_keep_their_place_and_others_go_under_abs() {
        let project = Path::new("/home/artist/proj");
        assert_eq!(
            job_path(project, Path::new("/home/artist/proj/textures/a.png")).unwrap(),
            "textures/a.png"
        );
        assert_eq!(
            job_path(project, Path::new("/home/artist/lib/wood.png")).unwrap(),
            "_abs/home/artist/lib/wood.png"
        );
        assert_eq!(
            absolute(Path::new("/a/b/../c/./d.png")).unwrap(),
            PathBuf::from("/a/c/d.png")
        );
    }
}
