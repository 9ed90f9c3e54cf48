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
    /// From a farm scan: what this machine must check (`file`,
    /// `sequence`, `dir`, `optional`); see [`check_on_disk`].
    #[serde(default)]
    pub check: Option<String>,
}

/// The most files a farm scan may list, and the longest path or text in it:
/// what a worker sends back is not trusted.
pub const MAX_FARM_FILES: usize = 100_000;
pub const MAX_FARM_TEXT: usize = 4096;
/// The most libraries a farm scan follows, and how deep.
pub const MAX_FARM_LIBRARIES: usize = 256;
pub const MAX_LIBRARY_DEPTH: usize = 16;

/// The Blender that lists a file's dependencies: one that can read it, never
/// one older than the file. This machine's own Blender when its version is
/// the file's; else the `bpy` interpreter named by `--blender-python` or
/// `TESSERA_BLENDER_PYTHON` (when it is not older than the file); else this
/// machine's Blender when it is newer than the file. `None` when none of
/// those can read it: a worker scans it for the farm ([`farm_scan_failed`]
/// says why when no worker can either).
pub fn scanner(
    blend: &Path,
    saved: BlenderVersion,
    python: Option<&Path>,
) -> anyhow::Result<Option<Runtime>> {
    let version_of = blender_runtime::version;
    let local = blender::detect().map(|(exe, _)| Runtime::Executable(exe));
    let local_version = local.as_ref().and_then(|r| version_of(r).ok());
    let name = |v: Option<BlenderVersion>| v.map_or("none".to_string(), |v| v.to_string());
    if let (Some(r), Some(v)) = (&local, local_version) {
        if v.series() == saved.series() {
            return Ok(Some(r.clone()));
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
        return Ok(Some(r));
    }
    if let (Some(r), Some(v)) = (local, local_version) {
        if v.series() > saved.series() {
            return Ok(Some(r));
        }
    }
    tracing::info!(local = %name(local_version), "no Blender here reads `{}`: scanning it on the farm", blend.display());
    Ok(None)
}

/// The error when neither this machine nor the farm could scan `blend`.
pub fn farm_scan_failed(blend: &Path, saved: BlenderVersion, farm: &str) -> anyhow::Error {
    let local = blender::detect()
        .and_then(|(exe, _)| blender_runtime::version(&Runtime::Executable(exe)).ok())
        .map_or("none".to_string(), |v| v.to_string());
    anyhow::anyhow!(
        "`{}` was saved by Blender {}; this machine's Blender is {local}, which cannot read it, and the farm could not scan it: {farm}; nothing was submitted. Start a worker with Blender {} or newer, or pass --blender-python PATH (or set TESSERA_BLENDER_PYTHON) to a Python where `import bpy` is Blender {} or newer",
        blend.display(),
        saved.short(),
        saved.short(),
        saved.short()
    )
}

/// Reads a farm scan's JSON of `blend`, bounded (a worker is not trusted):
/// only files the `.blend` itself mentions are kept (see [`mentioned`]),
/// then checked against this machine's disk.
pub fn from_farm(json: &str, blend: &Path) -> anyhow::Result<Scan> {
    if json.len() > tessera_protocol::messages::MAX_SCAN_JSON {
        bail!("the farm's scan is {} bytes, more than allowed", json.len());
    }
    let mut s: Scan = serde_json::from_str(json).context("the farm's scan is unreadable")?;
    if s.files.len() > MAX_FARM_FILES || s.warnings.len() > MAX_FARM_FILES {
        bail!(
            "the farm's scan lists {} files and {} warnings; at most {MAX_FARM_FILES} are accepted",
            s.files.len(),
            s.warnings.len()
        );
    }
    for f in &s.files {
        let long = [&f.path, &f.kind, &f.user]
            .iter()
            .any(|t| t.len() > MAX_FARM_TEXT);
        if long || !f.path.starts_with('/') {
            bail!("the farm's scan names a path that is not absolute or is too long");
        }
    }
    for w in &mut s.warnings {
        tessera_protocol::text::truncate_in_place(w, MAX_FARM_TEXT);
    }
    let blend_dir = blend.parent().unwrap_or(Path::new("/"));
    let needles: Vec<Vec<Vec<u8>>> = (s.files.iter())
        .map(|f| needles(Path::new(&f.path), blend_dir))
        .collect();
    let all: Vec<&[u8]> = needles.iter().flatten().map(Vec::as_slice).collect();
    let found = mentioned(blend, &all)?;
    let mut k = 0;
    let mut keep = Vec::with_capacity(s.files.len());
    for (f, n) in std::mem::take(&mut s.files).into_iter().zip(&needles) {
        let ok = !n.is_empty() && found[k..k + n.len()].iter().all(|&x| x);
        k += n.len();
        if ok {
            keep.push(f);
        } else {
            s.warnings.push(format!(
                "the farm's scan named {}, which `{}` does not mention: not uploaded",
                f.path,
                blend.display()
            ));
        }
    }
    s.files = keep;
    check_on_disk(&mut s);
    Ok(s)
}

/// What a `.blend` must contain for a file a farm scan names to be believed:
/// the file's name up to its first digit or `<` (a sequence's frame number
/// or a UDIM token may differ from the stored one), and the name of its
/// folder unless that is the `.blend`'s own. Blender stores every path it
/// references as text, so a worker cannot make the client upload a file
/// (`~/.ssh/id_rsa`, say) the scene never named.
fn needles(path: &Path, blend_dir: &Path) -> Vec<Vec<u8>> {
    let text = |o: &std::ffi::OsStr| o.as_encoded_bytes().to_vec();
    let mut n = Vec::new();
    if let Some(name) = path.file_name().and_then(|s| s.to_str()) {
        let cut = name.find(|c: char| c.is_ascii_digit() || c == '<');
        let stem = &name[..cut.unwrap_or(name.len())];
        if stem.len() >= 2 {
            n.push(stem.as_bytes().to_vec());
        } else if let Some(ext) = path.extension() {
            n.push([b".".as_slice(), ext.as_encoded_bytes()].concat());
        }
    }
    if let Some(parent) = path.parent().filter(|p| *p != blend_dir) {
        n.extend(parent.file_name().map(text));
    }
    n
}

/// Which of `needles` occur in `blend` as Blender reads it (decompressed),
/// read in blocks with an overlap, so memory stays bounded whatever the
/// file's size.
fn mentioned(blend: &Path, needles: &[&[u8]]) -> anyhow::Result<Vec<bool>> {
    use std::io::Read;
    const BLOCK: usize = 4 << 20;
    let mut found = vec![false; needles.len()];
    let overlap = needles.iter().map(|n| n.len()).max().unwrap_or(1).max(1) - 1;
    let finders: Vec<memchr::memmem::Finder> =
        needles.iter().map(memchr::memmem::Finder::new).collect();
    let mut r = blender_runtime::open_blend(blend)?;
    let mut buf = vec![0u8; BLOCK + overlap];
    let mut kept = 0;
    loop {
        let n = r
            .read(&mut buf[kept..])
            .with_context(|| format!("cannot read {}", blend.display()))?;
        let len = kept + n;
        for (hit, f) in found.iter_mut().zip(&finders) {
            *hit = *hit || f.find(&buf[..len]).is_some();
        }
        if n == 0 || found.iter().all(|&x| x) {
            return Ok(found);
        }
        kept = overlap.min(len);
        buf.copy_within(len - kept..len, 0);
    }
}

/// What the local scan does on the disk, for a farm scan's list: whether
/// each file exists, every member of a numbered sequence, every file under
/// a cache folder, and files `bpy.utils.blend_paths` found.
pub fn check_on_disk(s: &mut Scan) {
    let mut files: Vec<Dependency> = Vec::new();
    let mut warnings = Vec::new();
    let entry = |path: &Path, d: &Dependency| Dependency {
        path: path.to_string_lossy().into_owned(),
        kind: d.kind.clone(),
        user: d.user.clone(),
        exists: path.is_file(),
        check: None,
    };
    for d in std::mem::take(&mut s.files) {
        let path = PathBuf::from(&d.path);
        if crate::share::blender_own(&path) {
            continue; // the worker's own Blender has it
        }
        match d.check.as_deref() {
            Some("sequence") => {
                let members = sequence_members(&path);
                if members.is_empty() {
                    files.push(entry(&path, &d));
                }
                files.extend(members.iter().map(|m| entry(m, &d)));
            }
            Some("dir") if path.is_dir() => {
                let mut found = Vec::new();
                walk(&path, &mut found, MAX_FARM_FILES);
                found.sort();
                files.extend(found.iter().map(|m| entry(m, &d)));
            }
            Some("dir") => warnings.push(format!(
                "{}: fluid cache directory {} not found",
                d.user, d.path
            )),
            Some("optional") if path.is_file() => files.push(entry(&path, &d)),
            Some("optional") if !path.is_dir() => {
                warnings.push(format!("referenced path not found: {}", d.path))
            }
            Some("optional") => {}
            _ => files.push(entry(&path, &d)),
        }
    }
    for f in files.iter().filter(|f| f.kind == "library" && !f.exists) {
        warnings.push(format!(
            "library {} is missing: data it links in (and its own libraries) cannot be scanned",
            f.path
        ));
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.path.clone()));
    files.sort_by(|a, b| a.path.cmp(&b.path));
    s.files = files;
    s.warnings.extend(warnings);
}

/// Adds a library's farm scan to its file's: the files it uses that are
/// not listed yet, and its warnings.
pub fn merge(into: &mut Scan, library: Scan) {
    let known: std::collections::HashSet<String> =
        into.files.iter().map(|f| f.path.clone()).collect();
    (into.files).extend(
        library
            .files
            .into_iter()
            .filter(|f| !known.contains(&f.path)),
    );
    into.files.sort_by(|a, b| a.path.cmp(&b.path));
    into.warnings.extend(library.warnings);
}

/// Every file of the numbered sequence `one` is a member of: same folder,
/// same text around its last run of digits (as the local scan finds them).
fn sequence_members(one: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(base)) = (one.parent(), one.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let Some(end) = base.rfind(|c: char| c.is_ascii_digit()).map(|i| i + 1) else {
        return Vec::new();
    };
    let start = base[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let (head, tail) = (&base[..start], &base[end..]);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                let mid = n.strip_prefix(head).and_then(|m| m.strip_suffix(tail));
                n.len() > head.len() + tail.len()
                    && mid.is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

/// Every file under `dir`, at most `max`.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, max: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        if out.len() >= max {
            return;
        }
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out, max),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
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

    /// A farm scan's list is checked on this machine's disk as the local
    /// scan checks it: existence, sequences, cache folders, blend_paths'
    /// finds; and what a worker sends is bounded.
    #[test]
    fn a_farm_scan_is_checked_on_this_disk_and_bounded() {
        let dir = std::env::temp_dir().join(format!("tessera-farm-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("seq")).unwrap();
        std::fs::create_dir_all(dir.join("cache/sub")).unwrap();
        for f in [
            "rel.png",
            "seq/s_0001.png",
            "seq/s_0002.png",
            "seq/s_x.png",
            "seq/t_0001.png",
        ] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        std::fs::write(dir.join("cache/sub/a.vdb"), b"x").unwrap();
        let d = dir.display();
        let json = format!(
            r#"{{"blender_version": "4.5.4", "render_engine": "CYCLES", "frame_start": 1,
            "frame_end": 1, "resolution": [4, 4], "samples": 1, "file_format": "PNG",
            "time_limit": false, "compressed": null, "warnings": [],
            "files": [
             {{"path": "{d}/rel.png", "kind": "image", "user": "Image 'a'", "exists": false, "check": "file"}},
             {{"path": "{d}/nope.png", "kind": "image", "user": "Image 'b'", "exists": true, "check": "file"}},
             {{"path": "{d}/seq/s_0007.png", "kind": "image", "user": "Image 's'", "exists": false, "check": "sequence"}},
             {{"path": "{d}/cache", "kind": "cache", "user": "Fluid", "exists": false, "check": "dir"}},
             {{"path": "{d}/gone.blend", "kind": "library", "user": "Library 'g'", "exists": true, "check": "file"}},
             {{"path": "{d}/seq", "kind": "other", "user": "unknown", "exists": false, "check": "optional"}},
             {{"path": "{d}/lost.abc", "kind": "other", "user": "unknown", "exists": false, "check": "optional"}}
            ]}}"#
        );
        // What the file itself names, as Blender stores paths.
        let blend = dir.join("scene.blend");
        std::fs::write(
            &blend,
            b"BLENDER-v405 //rel.png\0//nope.png\0//seq/s_0001.png\0//cache\0//gone.blend\0//lost.abc\0",
        )
        .unwrap();
        let s = from_farm(&json, &blend).unwrap();
        let got: Vec<(String, bool)> = (s.files.iter())
            .map(|f| {
                (
                    f.path.strip_prefix(&*d.to_string()).unwrap().to_string(),
                    f.exists,
                )
            })
            .collect();
        let want = [
            ("/cache/sub/a.vdb", true),
            ("/gone.blend", false),
            ("/nope.png", false),
            ("/rel.png", true),
            ("/seq/s_0001.png", true),
            ("/seq/s_0002.png", true),
        ];
        let want: Vec<(String, bool)> = want.iter().map(|(p, e)| (p.to_string(), *e)).collect();
        assert_eq!(got, want, "the worker's `exists` is never believed");
        assert!(s
            .warnings
            .iter()
            .any(|w| w.contains("library") && w.contains("gone.blend")));
        assert!(s
            .warnings
            .iter()
            .any(|w| w.contains("referenced path not found") && w.contains("lost.abc")));
        // A relative path or an over-long one is refused.
        let bad = json.replace(&format!("{d}/rel.png"), "rel.png");
        assert!(from_farm(&bad, &blend).is_err());
        let long = json.replace(
            &format!("{d}/rel.png"),
            &format!("/{}", "a".repeat(MAX_FARM_TEXT)),
        );
        assert!(from_farm(&long, &blend).is_err());
        // A file the .blend never names is not believed, nor is `/`: a
        // worker cannot make the client upload what the scene does not use.
        std::fs::create_dir_all(dir.join("secret")).unwrap();
        std::fs::write(dir.join("secret/id_rsa"), b"key").unwrap();
        for planted in [format!("{d}/secret/id_rsa"), "/".to_string()] {
            let json = json.replace(&format!("{d}/rel.png"), &planted);
            let s = from_farm(&json, &blend).unwrap();
            assert!(s
                .files
                .iter()
                .all(|f| !f.path.contains("id_rsa") && f.path != "/"));
            assert!(
                s.warnings
                    .iter()
                    .any(|w| w.contains(&planted) && w.contains("does not mention")),
                "{:?}",
                s.warnings
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
