//! `tessera coordinator backup`: a consistent hot copy of a data dir while
//! its coordinator runs. The database is copied first, from one read
//! transaction (`VACUUM INTO`), so it is exactly some committed state; the
//! blobs are copied after it, so every blob that state refers to is already
//! stored (blobs are immutable and only ever appear whole, by rename). The
//! copy is a data dir: start a coordinator on it to restore.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The files of a data dir besides the database and the blobs.
const IDENTITY_FILES: [&str; 4] = [
    "coordinator.crt.der",
    "coordinator.key.der",
    "worker.ticket",
    "client.ticket",
];

/// What a backup copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub blobs: u64,
    pub bytes: u64,
}

/// Copies the data dir `data` into `dest`, which must not exist or be empty.
pub fn backup(data: &Path, dest: &Path) -> anyhow::Result<Copied> {
    let db = data.join("state.sqlite");
    if !db.exists() {
        bail!(
            "{} holds no coordinator database: pass the coordinator's --data-dir (a coordinator \
             started with --state keeps its state in PostgreSQL: back that up with pg_dump, and \
             copy the data dir's blobs)",
            data.display()
        );
    }
    if dest.exists() && std::fs::read_dir(dest)?.next().is_some() {
        bail!("{} is not empty: back up into a new folder", dest.display());
    }
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    copy_database(&db, &dest.join("state.sqlite"))?;
    for name in IDENTITY_FILES {
        let from = data.join(name);
        if from.exists() {
            // `copy` keeps the owner-only permissions of the key and tickets.
            std::fs::copy(&from, dest.join(name))
                .with_context(|| format!("cannot copy {}", from.display()))?;
        }
    }
    let mut copied = Copied { blobs: 0, bytes: 0 };
    copy_blobs(&data.join("blobs"), &dest.join("blobs"), &mut copied)?;
    Ok(copied)
}

/// `VACUUM INTO` from a connection of its own: a consistent snapshot, taken
/// while the coordinator keeps writing.
fn copy_database(db: &Path, dest: &Path) -> anyhow::Result<()> {
    let dest_str = (dest.to_str()).with_context(|| format!("{} is not UTF-8", dest.display()))?;
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("cannot open {}", db.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.execute("VACUUM INTO ?1", [dest_str])
        .with_context(|| format!("cannot copy the database into {}", dest.display()))?;
    std::fs::File::open(dest)?.sync_all()?;
    Ok(())
}

/// Copies every stored blob (and chunk-list index entry) under `from`,
/// skipping unfinished uploads; each file lands by rename, whole.
fn copy_blobs(from: &Path, to: &Path, copied: &mut Copied) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(from) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", from.display())),
    };
    std::fs::create_dir_all(to)?;
    for entry in entries {
        let entry = entry?;
        let (name, kind) = (entry.file_name(), entry.file_type()?);
        if kind.is_dir() {
            if name != "tmp" {
                copy_blobs(&entry.path(), &to.join(&name), copied)?;
            }
            continue;
        }
        let target = to.join(&name);
        let partial: PathBuf = to.join(format!(".{}.partial", name.to_string_lossy()));
        match std::fs::copy(entry.path(), &partial) {
            Ok(bytes) => {
                std::fs::rename(&partial, &target)?;
                copied.blobs += 1;
                copied.bytes += bytes;
            }
            // Garbage collection removed it meanwhile: only jobs past
            // their retention used it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot copy {}", entry.path().display()))
            }
        }
    }
    Ok(())
}
