//! Unpacks the archives `blender add` takes (a `bpy` wheel, which is a zip,
//! and a Linux `.tar.xz`) into a folder. Nothing in an archive is trusted:
//! every path is checked like a job path, sizes and counts are capped as
//! they are written, and links and special files are refused.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{bail, Context};
use tessera_protocol::build::{MAX_BUILD_BYTES, MAX_BUILD_FILES};
use tessera_protocol::job::sanitize_manifest_path;

/// Counts what has been written, against the build caps.
#[derive(Default)]
struct Budget {
    files: usize,
    bytes: u64,
}

impl Budget {
    /// Writes one file of at most what is left of the byte budget.
    fn write(
        &mut self,
        dir: &Path,
        path: &str,
        mode: u32,
        mut from: impl Read,
    ) -> anyhow::Result<()> {
        sanitize_manifest_path(path)?;
        self.files += 1;
        if self.files > MAX_BUILD_FILES {
            bail!("more than {MAX_BUILD_FILES} files: not a Blender build");
        }
        let dest = dir.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&dest)
            .with_context(|| format!("`{path}` is in the archive twice, or cannot be written"))?;
        let left = MAX_BUILD_BYTES - self.bytes;
        let written = std::io::copy(&mut (&mut from).take(left + 1), &mut file)?;
        if written > left {
            bail!("more than {MAX_BUILD_BYTES} bytes unpacked: not a Blender build");
        }
        self.bytes += written;
        file.flush()?;
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o755))?;
        Ok(())
    }
}

/// Unpacks a zip (a wheel) into `dir`.
pub fn zip(file: std::fs::File, dir: &Path) -> anyhow::Result<()> {
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file))?;
    let mut budget = Budget::default();
    for i in 0..archive.len() {
        let entry = archive.by_index(i)?;
        let name = entry.name()?.to_string();
        if entry.is_dir() {
            continue;
        }
        if entry.is_symlink() {
            bail!("`{name}` is a symbolic link; builds with links are not supported");
        }
        let mode = entry.unix_mode().unwrap_or(0o644);
        budget.write(dir, &name, mode, entry)?;
    }
    Ok(())
}

/// Unpacks a tar stream (already decompressed) into `dir`.
pub fn tar(stream: impl Read, dir: &Path) -> anyhow::Result<()> {
    let mut archive = tar::Archive::new(stream);
    let mut budget = Budget::default();
    for entry in archive.entries()? {
        let entry = entry?;
        let kind = entry.header().entry_type();
        let path = entry.path()?;
        let name = path
            .to_str()
            .with_context(|| format!("{}: a path that is not UTF-8", path.display()))?
            .trim_start_matches("./")
            .to_string();
        if kind.is_dir() || name.is_empty() {
            continue;
        }
        if !kind.is_file() {
            bail!("`{name}` is a link or a special file; builds with links are not supported");
        }
        let mode = entry.header().mode()?;
        budget.write(dir, &name, mode, entry)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tessera-unpack-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn tarball(entries: &[(&str, &[u8], tar::EntryType)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data, kind) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            // `set_path` refuses `..`; write the name as a hostile archive would.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn wheel(path: &Path, entries: &[(&str, &[u8], u32)]) -> std::fs::File {
        use zip::write::SimpleFileOptions;
        let mut w = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for (name, data, mode) in entries {
            let options = SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated)
                .unix_permissions(*mode);
            w.start_file(*name, options).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap();
        std::fs::File::open(path).unwrap()
    }

    #[test]
    fn wheels_unpack_with_their_modes_and_hostile_ones_are_refused() {
        let dir = tempdir("zip");
        let file = wheel(
            &dir.join("bpy.whl"),
            &[
                ("bpy/__init__.so", b"\x7fELF", 0o755),
                ("bpy/4.5/a.py", b"print()", 0o644),
            ],
        );
        let out = dir.join("out");
        zip(file, &out).unwrap();
        assert_eq!(std::fs::read(out.join("bpy/4.5/a.py")).unwrap(), b"print()");
        let mode = |p: &str| std::fs::metadata(out.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode("bpy/__init__.so"), mode("bpy/4.5/a.py")),
            (0o755, 0o644)
        );
        let bad = wheel(&dir.join("bad.whl"), &[("../evil", b"x", 0o644)]);
        let err = format!("{:#}", zip(bad, &dir.join("bad")).unwrap_err());
        assert!(err.contains("..") || err.contains("bad path"), "{err}");
        assert!(!dir.join("evil").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tarballs_unpack_with_their_modes_and_hostile_ones_are_refused() {
        let dir = tempdir("tar");
        let good = tarball(&[
            ("b-4.5/blender", b"#!", tar::EntryType::Regular),
            ("b-4.5/4.5/a.py", b"print()", tar::EntryType::Regular),
        ]);
        tar(&good[..], &dir).unwrap();
        assert_eq!(
            std::fs::read(dir.join("b-4.5/4.5/a.py")).unwrap(),
            b"print()"
        );
        let mode = std::fs::metadata(dir.join("b-4.5/blender"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        for (bad, why) in [
            (
                tarball(&[("../evil", b"x", tar::EntryType::Regular)]),
                "bad path",
            ),
            (tarball(&[("b/link", b"", tar::EntryType::Symlink)]), "link"),
            (
                tarball(&[
                    ("b/twice", b"x", tar::EntryType::Regular),
                    ("b/twice", b"y", tar::EntryType::Regular),
                ]),
                "twice",
            ),
        ] {
            let d = tempdir("tar-bad");
            let err = format!("{:#}", tar(&bad[..], &d).unwrap_err());
            assert!(err.contains(why) || err.contains(".."), "{err}");
            assert!(!d.parent().unwrap().join("evil").exists());
            std::fs::remove_dir_all(d).unwrap();
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
