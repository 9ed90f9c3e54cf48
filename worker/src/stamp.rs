//! A cached file's metadata stamp (size, inode, modification and change
//! times), taken when its bytes were last verified. A file whose stamp
//! differs was changed on disk since (edited in place, replaced), so the
//! cache re-hashes it before a task uses it; an unchanged stamp spares
//! re-hashing every file for every task.

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    /// The change time cannot be set back by a user (unlike the
    /// modification time), so an edit that restores the mtime still shows.
    ctime_ns: i128,
}

impl Stamp {
    /// The stamp of the file at `path` now, `None` when it cannot be read.
    pub fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(Stamp {
            len: m.len(),
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether two paths name the same file (a job folder's hard link to a
    /// cached blob).
    pub fn same_file(a: &Path, b: &Path) -> bool {
        match (Stamp::of(a), Stamp::of(b)) {
            (Some(a), Some(b)) => (a.dev, a.ino) == (b.dev, b.ino),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_in_place_keeping_the_size_changes_the_stamp() {
        let dir = std::env::temp_dir().join(format!("tessera-stamp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"abcdef").unwrap();
        let before = Stamp::of(&path).unwrap();
        assert_eq!(Stamp::of(&path), Some(before));
        // Same size, same inode, and the mtime set back to what it was.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"abcdeF").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_ne!(Stamp::of(&path), Some(before));
        let link = dir.join("link");
        std::fs::hard_link(&path, &link).unwrap();
        assert!(Stamp::same_file(&path, &link));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
