//! Blender builds shipped through the farm (`tessera blender add`): a build
//! is stored as a manifest of its files (path, mode, digest, size), each file
//! a blob like any scene file (large ones chunked), never as the tarball or
//! wheel it came in. A compressed archive changes throughout when one file
//! in it changes; its files mostly do not, so the next point release uploads
//! only the chunks that changed.

use serde::{Deserialize, Serialize};

use crate::blender::{BlenderOffer, BlenderVersion};
use crate::codec::{self, CodecError};
use crate::job::sanitize_manifest_path;
use crate::Digest;

/// The most files one build may list (an official 4.5 build has about 3,100
/// in its `bpy` wheel and about 4,000 in its Linux tarball).
pub const MAX_BUILD_FILES: usize = 200_000;

/// The most bytes one build may hold, unpacked.
pub const MAX_BUILD_BYTES: u64 = 16 << 30;

/// How a build runs Blender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BuildKind {
    /// The `bpy` module (a wheel): `bpy/__init__.so` under a Python 3.11.
    Module,
    /// An official Linux tarball: the `blender` executable at its top.
    Executable,
}

impl BuildKind {
    pub fn name(self) -> &'static str {
        match self {
            BuildKind::Module => "bpy",
            BuildKind::Executable => "executable",
        }
    }

    /// The file that makes a folder a build of this kind.
    pub fn marker(self) -> &'static str {
        match self {
            BuildKind::Module => "bpy/__init__.so",
            BuildKind::Executable => "blender",
        }
    }
}

/// One file of a build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildFile {
    /// Relative, `/`-separated, inside the build (checked like a job path).
    pub path: String,
    /// Permission bits (`0o755` for an executable file).
    pub mode: u32,
    pub digest: Digest,
    pub size: u64,
}

/// What `blender add` stores: the build's files, and the version its
/// contents say it is. The manifest is itself a blob; its digest names the
/// build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildManifest {
    pub version: BlenderVersion,
    pub kind: BuildKind,
    pub files: Vec<BuildFile>,
}

/// A build the coordinator holds, as `blender list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildInfo {
    /// The manifest's digest.
    pub digest: Digest,
    pub version: BlenderVersion,
    pub kind: BuildKind,
    /// Bytes of all its files, unpacked.
    pub size: u64,
    pub files: u64,
    /// Libraries found among its files (`OpenImageDenoise`, `OSL`).
    pub features: Vec<String>,
    pub added_unix_ms: u64,
    /// The connected workers whose caches hold every file of it (filled in
    /// by `blender list`; empty as stored).
    #[serde(default)]
    pub holders: Vec<String>,
}

impl BuildInfo {
    /// What a worker started with `--blender auto` offers with this build
    /// before it has fetched it: its version, and the capabilities its
    /// files show (`features`, recorded at `blender add`). Eevee needs a
    /// GPU context that only a probe on the worker can confirm, so a stored
    /// build never offers it. The coordinator schedules on this and the
    /// worker picks the build it fetches with it, so both agree.
    pub fn offer(&self) -> BlenderOffer {
        let has = |f: &str| self.features.iter().any(|x| x == f);
        BlenderOffer {
            version: self.version,
            name: format!(
                "Blender {} ({}, stored build {})",
                self.version,
                self.kind.name(),
                &self.digest.to_hex()[..12]
            ),
            device_types: Vec::new(),
            devices: Vec::new(),
            render_device: "CPU".into(),
            oidn: has("OpenImageDenoise"),
            osl: has("OSL"),
            eevee: false,
        }
    }
}

/// Why a build manifest is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    #[error("the build lists no files")]
    Empty,
    #[error("the build lists {0} files; at most {MAX_BUILD_FILES} are allowed")]
    TooManyFiles(usize),
    #[error("the build holds more than {MAX_BUILD_BYTES} bytes")]
    TooLarge,
    #[error("bad path in the build: {0}")]
    Path(String),
    #[error("`{0}` is listed twice")]
    Duplicate(String),
    #[error("`{path}` has mode {mode:o}; only permission bits are allowed")]
    Mode { path: String, mode: u32 },
    #[error("no `{0}`: this is not a {1} build")]
    NoMarker(&'static str, &'static str),
    #[error("the build says it is Blender {0} but has no `{1}` folder of that version")]
    VersionFolder(BlenderVersion, String),
}

impl BuildManifest {
    /// The manifest as stored: one codec frame, so it is capped at
    /// `MAX_FRAME` like any message.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode(self)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<BuildManifest, CodecError> {
        codec::decode_frame(bytes)
    }

    /// Checks what a peer sent before anything trusts it: the number of
    /// files, their total size, every path, each mode, and that the files
    /// are a build of the kind and version the manifest claims (its marker
    /// file, and Blender's `X.Y/` folder of that version next to it).
    pub fn validate(&self) -> Result<u64, BuildError> {
        if self.files.is_empty() {
            return Err(BuildError::Empty);
        }
        if self.files.len() > MAX_BUILD_FILES {
            return Err(BuildError::TooManyFiles(self.files.len()));
        }
        let mut total: u64 = 0;
        let mut seen = std::collections::HashSet::new();
        for f in &self.files {
            sanitize_manifest_path(&f.path).map_err(|e| BuildError::Path(e.to_string()))?;
            if f.mode & !0o777 != 0 {
                return Err(BuildError::Mode {
                    path: f.path.clone(),
                    mode: f.mode,
                });
            }
            if !seen.insert(f.path.as_str()) {
                return Err(BuildError::Duplicate(f.path.clone()));
            }
            total = total
                .checked_add(f.size)
                .filter(|t| *t <= MAX_BUILD_BYTES)
                .ok_or(BuildError::TooLarge)?;
        }
        let marker = self.kind.marker();
        if !seen.contains(marker) {
            return Err(BuildError::NoMarker(marker, self.kind.name()));
        }
        let folder = match self.kind {
            BuildKind::Module => format!("bpy/{}/", self.version.short()),
            BuildKind::Executable => format!("{}/", self.version.short()),
        };
        if !self.files.iter().any(|f| f.path.starts_with(&folder)) {
            return Err(BuildError::VersionFolder(self.version, folder));
        }
        Ok(total)
    }

    /// Libraries among the files that decide what the build can render.
    pub fn features(&self) -> Vec<String> {
        let has = |needle: &str| {
            self.files.iter().any(|f| {
                f.path
                    .rsplit('/')
                    .next()
                    .is_some_and(|name| name.starts_with(needle))
            })
        };
        [
            ("libOpenImageDenoise", "OpenImageDenoise"),
            ("liboslexec", "OSL"),
        ]
        .into_iter()
        .filter(|(lib, _)| has(lib))
        .map(|(_, name)| name.to_string())
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> BuildFile {
        BuildFile {
            path: path.into(),
            mode: 0o644,
            digest: Digest::of(path.as_bytes()),
            size,
        }
    }

    fn module(files: Vec<BuildFile>) -> BuildManifest {
        BuildManifest {
            version: BlenderVersion::new(4, 5, 4),
            kind: BuildKind::Module,
            files,
        }
    }

    #[test]
    fn a_build_is_checked_before_it_is_trusted() {
        let good = module(vec![
            file("bpy/__init__.so", 10),
            file("bpy/4.5/scripts/startup/x.py", 5),
            file("bpy/lib/libOpenImageDenoise_core.so.2.3.3", 7),
        ]);
        assert_eq!(good.validate(), Ok(22));
        assert_eq!(good.features(), vec!["OpenImageDenoise".to_string()]);
        let check = |files: Vec<BuildFile>, want: &str| {
            let err = module(files).validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err} lacks {want}");
        };
        check(vec![], "no files");
        check(
            vec![file("bpy/__init__.so", 1), file("../etc/passwd", 1)],
            "bad path",
        );
        check(
            vec![file("bpy/__init__.so", 1), file("bpy/__init__.so", 1)],
            "listed twice",
        );
        check(
            vec![file("bpy/__init__.so", u64::MAX), file("bpy/4.5/a", 2)],
            "more than",
        );
        check(
            vec![file("blender", 1), file("4.5/a", 1)],
            "no `bpy/__init__.so`",
        );
        check(
            vec![file("bpy/__init__.so", 1), file("bpy/4.2/a", 1)],
            "no `bpy/4.5/` folder",
        );
        let mut setuid = module(vec![file("bpy/__init__.so", 1), file("bpy/4.5/a", 1)]);
        setuid.files[0].mode = 0o4755;
        assert!(setuid.validate().unwrap_err().to_string().contains("mode"));
        let exe = BuildManifest {
            version: BlenderVersion::new(4, 5, 4),
            kind: BuildKind::Executable,
            files: vec![file("blender", 1), file("4.5/scripts/a.py", 1)],
        };
        assert_eq!(exe.validate(), Ok(2));
        let bytes = exe.to_bytes().unwrap();
        assert_eq!(BuildManifest::from_bytes(&bytes).unwrap(), exe);
        assert!(BuildManifest::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    }
}
