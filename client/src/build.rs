//! `tessera blender add` and `blender list`: an official Blender build — an
//! unpacked folder, a `bpy` wheel, or a Linux `.tar.xz` — goes into the
//! coordinator's store as a manifest of its files, each file uploaded like a
//! scene file (large ones as chunks, only those the coordinator lacks).
//! Archives are unpacked here first: a compressed archive changes throughout
//! when one file in it changes, its files mostly do not, so the next point
//! release uploads only the chunks that changed.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tessera_protocol::blender::BlenderVersion;
use tessera_protocol::build::{
    BuildFile, BuildInfo, BuildKind, BuildManifest, MAX_BUILD_BYTES, MAX_BUILD_FILES,
};
use tessera_protocol::job::sanitize_manifest_path;
use tessera_protocol::messages::{ClientRequest, ClientResponse};
use tessera_scan::blender_runtime::{self, Runtime};

use crate::client::{hash_files, send_missing, Client, SceneFile};

/// What one `blender add` did.
pub struct Added {
    pub info: BuildInfo,
    /// Bytes of file blobs and chunks sent (what the coordinator lacked).
    pub uploaded: u64,
    /// Bytes of the manifest blob sent (0 when the build was known).
    pub manifest: u64,
}

/// Uploads the build at `path` and records it.
pub async fn add(client: &mut Client, path: &Path, progress: bool) -> anyhow::Result<Added> {
    let unpacked = Unpacked::open(path)?;
    let top = find_top(unpacked.root())
        .with_context(|| format!("{} is not an official Blender build", path.display()))?;
    let (kind, version) = identify(&top)?;
    let files = walk(&top)?;
    let scene_files: Vec<SceneFile> = files
        .iter()
        .map(|(rel, on_disk, _)| SceneFile {
            job_path: rel.clone(),
            on_disk: on_disk.clone(),
            origin: None,
        })
        .collect();
    let mut hashed = hash_files(&scene_files).await?;
    let uploaded = send_missing(client, &mut hashed, progress).await?;
    let manifest = BuildManifest {
        version,
        kind,
        files: hashed
            .iter()
            .zip(&files)
            .map(|(h, (_, _, mode))| BuildFile {
                path: h.entry.path.clone(),
                mode: *mode,
                digest: h.entry.digest,
                size: h.entry.size,
            })
            .collect(),
    };
    manifest.validate()?;
    let bytes = manifest.to_bytes()?;
    let digest = tessera_protocol::Digest::of(&bytes);
    let manifest_sent = client.put_blob(bytes).await?;
    match client.call(&ClientRequest::AddBuild(digest)).await? {
        ClientResponse::BuildAdded(info) => Ok(Added {
            info,
            uploaded,
            manifest: manifest_sent,
        }),
        ClientResponse::Error(e) => bail!("the coordinator refused the build: {e}"),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// The builds the coordinator holds.
pub async fn list(client: &mut Client) -> anyhow::Result<Vec<BuildInfo>> {
    match client.call(&ClientRequest::Builds).await? {
        ClientResponse::Builds(b) => Ok(b),
        ClientResponse::Error(e) => bail!("{e}"),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// A build's files on disk: the folder given, or an archive unpacked into a
/// temporary folder that is removed when this is dropped.
struct Unpacked {
    root: PathBuf,
    temporary: bool,
}

impl Unpacked {
    fn open(path: &Path) -> anyhow::Result<Unpacked> {
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            return Ok(Unpacked {
                root: path.to_path_buf(),
                temporary: false,
            });
        }
        let name = path
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().to_ascii_lowercase());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let root = std::env::temp_dir().join(format!(
            "tessera-blender-add-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        let unpacked = Unpacked {
            root,
            temporary: true,
        };
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let result = if name.ends_with(".whl") || name.ends_with(".zip") {
            crate::unpack::zip(file, &unpacked.root)
        } else if name.ends_with(".tar.xz") || name.ends_with(".txz") {
            crate::unpack::tar(
                xz2::read::XzDecoder::new(std::io::BufReader::new(file)),
                &unpacked.root,
            )
        } else {
            bail!(
                "{}: expected a folder, a bpy wheel (.whl) or a Linux tarball (.tar.xz)",
                path.display()
            );
        };
        result.with_context(|| format!("cannot unpack {}", path.display()))?;
        Ok(unpacked)
    }

    fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The folder holding the build: `root` itself (a wheel, or a folder given
/// as it is), or its only subfolder (a tarball's `blender-4.5.4-linux-x64/`).
fn find_top(root: &Path) -> anyhow::Result<PathBuf> {
    let is_build = |dir: &Path| {
        [BuildKind::Module, BuildKind::Executable]
            .iter()
            .any(|k| dir.join(k.marker()).is_file())
    };
    if is_build(root) {
        return Ok(root.to_path_buf());
    }
    let subdirs: Vec<PathBuf> = std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    match subdirs.as_slice() {
        [only] if is_build(only) => Ok(only.clone()),
        _ => bail!("it has no `bpy/__init__.so` (a bpy wheel) and no `blender` executable"),
    }
}

/// The build's kind and version, from its contents: Blender's `X.Y/` data
/// folder, and the patch level from the wheel's metadata or the tarball's
/// folder name, else from running the build's own `blender --version`.
fn identify(top: &Path) -> anyhow::Result<(BuildKind, BlenderVersion)> {
    if top.join(BuildKind::Module.marker()).is_file() {
        let (major, minor) = series_folder(&top.join("bpy"))?;
        let patch = wheel_version(top)
            .filter(|v| v.series() == (major, minor))
            .map(|v| v.patch)
            .context("no `bpy-X.Y.Z.dist-info/METADATA` of this series says the patch level")?;
        return Ok((BuildKind::Module, BlenderVersion::new(major, minor, patch)));
    }
    let (major, minor) = series_folder(top)?;
    let named = top
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("blender-"))
        .and_then(|rest| parse_version(rest.split('-').next().unwrap_or("")))
        .filter(|v| v.series() == (major, minor));
    let version = match named {
        Some(v) => v,
        None => blender_runtime::version(&Runtime::executable(&top.join("blender")))
            .context("cannot run the build's blender to ask its version")?,
    };
    if version.series() != (major, minor) {
        bail!("the build's blender says {version} but its data folder is {major}.{minor}");
    }
    Ok((BuildKind::Executable, version))
}

/// The one `X.Y` folder in `dir` (Blender's data files).
fn series_folder(dir: &Path) -> anyhow::Result<(u16, u16)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)?.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((a, b)) = name.split_once('.') {
            if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                if entry.path().is_dir() {
                    found.push((a, b));
                }
            }
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => bail!("no `X.Y` data folder in {}", dir.display()),
        _ => bail!("several `X.Y` data folders in {}", dir.display()),
    }
}

/// `Version: 4.5.4` from the wheel's `bpy-*.dist-info/METADATA`.
fn wheel_version(top: &Path) -> Option<BlenderVersion> {
    std::fs::read_dir(top)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("bpy-") && n.ends_with(".dist-info")
        })
        .find_map(|e| {
            let mut text = String::new();
            std::fs::File::open(e.path().join("METADATA"))
                .ok()?
                .take(1 << 20)
                .read_to_string(&mut text)
                .ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("Version:"))
                .and_then(|v| parse_version(v.trim()))
        })
}

fn parse_version(s: &str) -> Option<BlenderVersion> {
    let mut parts = s.split('.').map(|p| p.parse::<u16>());
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c)), None) => Some(BlenderVersion::new(a, b, c)),
        _ => None,
    }
}

/// Every file under `top`: (path inside the build, path here, mode), in
/// path order. A symbolic link is refused, not followed out of the build.
fn walk(top: &Path) -> anyhow::Result<Vec<(String, PathBuf, u32)>> {
    let mut out = Vec::new();
    let mut total: u64 = 0;
    let mut stack = vec![(top.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().into_string().map_err(|n| {
                anyhow::anyhow!("{}: a file name that is not UTF-8", dir.join(n).display())
            })?;
            let rel = format!("{prefix}{name}");
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push((entry.path(), format!("{rel}/")));
            } else if meta.is_file() {
                sanitize_manifest_path(&rel)?;
                total = total.saturating_add(meta.len());
                out.push((rel, entry.path(), meta.permissions().mode() & 0o777));
            } else {
                bail!(
                    "{}: builds with symbolic links or special files are not supported",
                    entry.path().display()
                );
            }
            if out.len() > MAX_BUILD_FILES || total > MAX_BUILD_BYTES {
                bail!("more than {MAX_BUILD_FILES} files or {MAX_BUILD_BYTES} bytes: not a Blender build");
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("tessera-build-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    #[test]
    fn a_build_says_its_kind_and_version() {
        let wheel = tempdir("wheel");
        touch(&wheel.join("bpy/__init__.so"));
        touch(&wheel.join("bpy/4.5/scripts/a.py"));
        std::fs::create_dir_all(wheel.join("bpy-4.5.4.dist-info")).unwrap();
        std::fs::write(
            wheel.join("bpy-4.5.4.dist-info/METADATA"),
            "Metadata-Version: 2.4\nName: bpy\nVersion: 4.5.4\n",
        )
        .unwrap();
        assert_eq!(find_top(&wheel).unwrap(), wheel);
        assert_eq!(
            identify(&wheel).unwrap(),
            (BuildKind::Module, BlenderVersion::new(4, 5, 4))
        );
        let paths: Vec<String> = walk(&wheel).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(
            paths,
            [
                "bpy-4.5.4.dist-info/METADATA",
                "bpy/4.5/scripts/a.py",
                "bpy/__init__.so"
            ]
        );

        let tarball = tempdir("tarball");
        let top = tarball.join("blender-4.2.9-linux-x64");
        touch(&top.join("blender"));
        touch(&top.join("4.2/scripts/a.py"));
        assert_eq!(find_top(&tarball).unwrap(), top);
        assert_eq!(
            identify(&top).unwrap(),
            (BuildKind::Executable, BlenderVersion::new(4, 2, 9))
        );

        let neither = tempdir("neither");
        touch(&neither.join("a/readme.txt"));
        assert!(find_top(&neither)
            .unwrap_err()
            .to_string()
            .contains("no `bpy/__init__.so`"));
        std::os::unix::fs::symlink("/etc/passwd", wheel.join("bpy/evil")).unwrap();
        assert!(walk(&wheel)
            .unwrap_err()
            .to_string()
            .contains("symbolic links"));
        for d in [wheel, tarball, neither] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
