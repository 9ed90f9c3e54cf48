//! The worker's asset cache: blobs by digest (verified on arrival), and one
//! folder per job built from them with hard links, so a job's files exist on
//! this machine at the paths its manifest names, whatever paths they had on
//! the artist's machine.
//!
//! With a size cap (`--cache-max`) the least recently used blobs are evicted
//! to make room, never one that a running task's job uses (those are
//! pinned). The index is rebuilt on start from the blob folder, re-hashing
//! every blob: a file that does not match its name is removed, never served.
//! After that a file is re-hashed the first time a task uses it after its
//! metadata changed (edited in place, even keeping its size).
//!
//! The cache is a [`BlobStore`](tessera_store::BlobStore) (`store`), like
//! the coordinator's blob folder, with the eviction of its [`Lru`] index
//! behind `put`. Fetching from the coordinator over QUIC is in `fetch`, job
//! and build folders in `layout`; this file holds the state, the index
//! rebuilt on start, reservations under the cap and eviction.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use tessera_protocol::build::BuildManifest;
use tessera_protocol::chunk::{Recipe, CHUNK_THRESHOLD, MAX_CHUNK};
use tessera_protocol::job::{sanitize_manifest_path, ManifestEntry};
use tessera_protocol::messages::{JobInfo, StitchedPasses, MAX_GET_MANY};
use tessera_protocol::Digest;
use tessera_transport::blob::{self, BlobDir};
use tokio::sync::OnceCell;

use crate::stamp::Stamp;

mod fetch;
mod from_store;
mod layout;
mod store;

#[cfg(test)]
use fetch::place_local_chunks;
pub use layout::{BuildFiles, JobFiles};
/// The size-capped LRU index, which lives in the store crate (it does no
/// I/O); named here too, where the cache is.
pub use tessera_store::lru::Lru;

/// Where a chunk of a held file lies: a large file's chunks are not stored
/// apart, so an edited file (or a build sharing bytes with another) takes
/// the chunks it has in common from the files that hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChunkAt {
    file: Digest,
    offset: u64,
    len: u32,
}

struct State {
    lru: Lru<Digest>,
    /// Every chunk of the held files whose chunk lists are known.
    chunks: HashMap<Digest, ChunkAt>,
    /// Files being fetched into `partial/` now.
    partial: std::collections::HashSet<Digest>,
    /// One preparation per job; concurrent slots of the same job wait for it.
    prepared: HashMap<u64, Arc<OnceCell<PathBuf>>>,
    /// Running tasks per job.
    running: HashMap<u64, u32>,
    /// Files gained and lost since the coordinator was last told.
    added: Vec<Digest>,
    removed: Vec<Digest>,
    /// Each file's metadata when its bytes were last verified.
    stamps: HashMap<Digest, Stamp>,
    /// Stored Blender builds laid out under `builds/`, and how many running
    /// tasks use each.
    builds: HashMap<Digest, u32>,
    /// A build's folder was removed since last asked (its sessions end).
    builds_removed: bool,
    /// A frame's own files linked into a job's folder, by job and path:
    /// how many running tasks use each.
    linked: HashMap<(u64, String), u32>,
}

pub struct Cache {
    blobs: BlobDir,
    /// Large files being fetched, by digest: chunks are written straight
    /// into them at their offsets, and a fetch that was cut resumes from
    /// the chunks already there.
    partial_root: PathBuf,
    jobs_root: PathBuf,
    builds_root: PathBuf,
    cap: Option<u64>,
    state: Mutex<State>,
    /// One job's files are fetched at a time: a task fetched ahead
    /// (pipelined leases) then finds the chunks the one before it brought
    /// in, instead of fetching the same bytes beside it.
    fetching: tokio::sync::Mutex<()>,
    /// Whether to fetch from the farm's object store (and how).
    store_urls: from_store::StoreUrls,
}

impl Cache {
    /// Opens (or creates) the cache in `dir`, capped at `cap` bytes. Every
    /// stored blob is re-hashed; one that does not match its name is removed.
    pub fn open(dir: &Path, cap: Option<u64>) -> anyhow::Result<Cache> {
        // Engines run in other folders: every path handed out is absolute.
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the cache {}", dir.display()))?;
        let dir = &dir.canonicalize()?;
        let blobs = BlobDir::open(dir.join("blobs"))
            .with_context(|| format!("cannot open the cache in {}", dir.display()))?;
        // Chunks stored apart, by an earlier version: files hold them now.
        let _ = std::fs::remove_dir_all(dir.join("chunks"));
        let partial_root = dir.join("partial");
        std::fs::create_dir_all(&partial_root)?;
        remove_stale_partials(&partial_root);
        let jobs_root = dir.join("jobs");
        // Job folders are rebuilt from blobs; stale ones from an earlier run go.
        let _ = std::fs::remove_dir_all(&jobs_root);
        std::fs::create_dir_all(&jobs_root)?;
        // So are builds' folders (hard links to their files' blobs).
        let builds_root = dir.join("builds");
        let _ = std::fs::remove_dir_all(&builds_root);
        let mut lru = Lru::default();
        let (kept, removed) = rebuild_index(&blobs, &mut lru)?;
        // Verified just now: stamp what was re-hashed.
        let stamps = (lru.keys())
            .filter_map(|d| Some((*d, Stamp::of(&blobs.path(d))?)))
            .collect();
        let mut chunks = HashMap::new();
        for d in lru.keys() {
            if let Some(recipe) = blobs.recipe(d) {
                index_chunks(&mut chunks, &recipe);
            }
        }
        tracing::info!(
            blobs = kept,
            bytes = lru.total(),
            removed,
            cap = cap.unwrap_or(0),
            "cache index rebuilt"
        );
        let cache = Cache {
            blobs,
            partial_root,
            jobs_root,
            builds_root,
            cap,
            fetching: tokio::sync::Mutex::new(()),
            store_urls: Default::default(),
            state: Mutex::new(State {
                lru,
                chunks,
                partial: Default::default(),
                prepared: HashMap::new(),
                running: HashMap::new(),
                added: Vec::new(),
                removed: Vec::new(),
                stamps,
                builds: HashMap::new(),
                builds_removed: false,
                linked: HashMap::new(),
            }),
        };
        if let Some(cap) = cap {
            // A smaller cap than last time: shrink now.
            let evict = cache.state().lru.reserve(0, cap).unwrap_or_default();
            cache.delete(&evict);
        }
        Ok(cache)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("cache lock")
    }

    pub fn blobs(&self) -> &BlobDir {
        &self.blobs
    }

    /// Bytes of blobs held.
    pub fn held_bytes(&self) -> u64 {
        self.state().lru.total()
    }

    /// Every blob held (for the coordinator, on join); pending changes are
    /// included, so they are cleared.
    pub fn held_digests(&self) -> Vec<Digest> {
        let mut state = self.state();
        state.added.clear();
        state.removed.clear();
        state.lru.keys().copied().collect()
    }

    /// Blobs gained and lost since last asked, if any.
    pub fn take_changes(&self) -> Option<(Vec<Digest>, Vec<Digest>)> {
        let mut state = self.state();
        if state.added.is_empty() && state.removed.is_empty() {
            return None;
        }
        Some((
            std::mem::take(&mut state.added),
            std::mem::take(&mut state.removed),
        ))
    }

    /// Forgets job folders prepared over an earlier connection (job ids are
    /// the coordinator's, and it may have been replaced).
    pub fn reset_jobs(&self) {
        self.state().prepared.clear();
    }

    /// Re-hashes each of `digests` whose file changed on disk since it was
    /// verified (its [`Stamp`] differs). One that no longer matches is
    /// removed, and every job folder is laid out again before its next
    /// task, so the file is fetched again instead of rendered wrong.
    async fn reverify_changed(&self, digests: &[Digest]) -> anyhow::Result<()> {
        let recorded: Vec<(Digest, Stamp)> = {
            let state = self.state();
            (digests.iter())
                .filter_map(|d| Some((*d, *state.stamps.get(d)?)))
                .collect()
        };
        let blobs = self.blobs.clone();
        let checked = tokio::task::spawn_blocking(move || {
            (recorded.into_iter())
                .filter(|(d, stamp)| Stamp::of(&blobs.path(d)) != Some(*stamp))
                .map(|(d, _)| {
                    let path = blobs.path(&d);
                    let intact = std::fs::File::open(&path)
                        .and_then(Digest::of_reader)
                        .is_ok_and(|(actual, _)| actual == d);
                    (d, intact.then(|| Stamp::of(&path)).flatten())
                })
                .collect::<Vec<_>>()
        })
        .await?;
        let mut state = self.state();
        for (digest, stamp) in checked {
            match stamp {
                Some(stamp) => {
                    state.stamps.insert(digest, stamp);
                }
                None => {
                    tracing::warn!(%digest, "a cached file changed on disk and no longer matches its digest: fetching it again");
                    let _ = self.blobs.remove(&digest);
                    state.lru.remove(&digest);
                    state.chunks.retain(|_, at| at.file != digest);
                    state.stamps.remove(&digest);
                    state.removed.push(digest);
                    state.prepared.clear();
                }
            }
        }
        Ok(())
    }

    /// Deletes evicted blobs, and the folders of jobs with no running task
    /// (their hard links would keep the bytes on disk).
    fn delete(&self, evicted: &[Digest]) {
        if evicted.is_empty() {
            return;
        }
        let (idle, idle_builds) = {
            let mut state = self.state();
            let idle: Vec<u64> = state
                .prepared
                .keys()
                .filter(|j| !state.running.contains_key(j))
                .copied()
                .collect();
            for j in &idle {
                state.prepared.remove(j);
            }
            let idle_builds: Vec<Digest> = (state.builds.iter())
                .filter(|(_, n)| **n == 0)
                .map(|(d, _)| *d)
                .collect();
            for b in &idle_builds {
                state.builds.remove(b);
            }
            if !idle_builds.is_empty() {
                state.builds_removed = true;
            }
            (idle, idle_builds)
        };
        for b in idle_builds {
            let _ = std::fs::remove_dir_all(self.builds_root.join(b.to_hex()));
        }
        for j in idle {
            if let Ok(dirs) = std::fs::read_dir(&self.jobs_root) {
                for d in dirs.flatten() {
                    if d.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{j}-"))
                    {
                        let _ = std::fs::remove_dir_all(d.path());
                    }
                }
            }
        }
        for d in evicted {
            let _ = self.blobs.remove(d);
        }
        let mut state = self.state();
        for d in evicted {
            state.stamps.remove(d);
        }
        state.chunks.retain(|_, at| !evicted.contains(&at.file));
        state.removed.extend_from_slice(evicted);
        drop(state);
        tracing::info!(blobs = evicted.len(), "evicted from the cache");
    }

    /// Makes room for `size` bytes under the cap (evicting), reserving it.
    fn reserve(&self, size: u64, what: &str) -> anyhow::Result<()> {
        let Some(cap) = self.cap else {
            return Ok(());
        };
        let reserved = self.state().lru.reserve(size, cap);
        let Some(evict) = reserved else {
            bail!(
                "the cache cap of {cap} bytes (--cache-max) cannot hold this job's files: {what} needs {size} bytes beside the files of running tasks; raise --cache-max"
            );
        };
        self.delete(&evict);
        Ok(())
    }

    fn unreserve(&self, size: u64) {
        if self.cap.is_some() {
            self.state().lru.release(size);
        }
    }

    fn insert(&self, digest: Digest, size: u64) {
        let stamp = Stamp::of(&self.blobs.path(&digest));
        let mut state = self.state();
        state.lru.insert(digest, size);
        state.lru.touch(&digest);
        state.added.push(digest);
        match stamp {
            Some(stamp) => state.stamps.insert(digest, stamp),
            None => state.stamps.remove(&digest),
        };
    }
}

/// Walks the blob folder: every blob is re-hashed; a file whose bytes do not
/// match its name (or with no digest for a name) is removed. Entries go in
/// oldest first (by modification time) so LRU order survives a restart.
fn rebuild_index(blobs: &BlobDir, lru: &mut Lru<Digest>) -> anyhow::Result<(usize, usize)> {
    let mut found = Vec::new();
    let mut removed = 0;
    let root = blobs.root();
    let _ = std::fs::remove_dir_all(root.join("tmp"));
    std::fs::create_dir_all(root.join("tmp"))?;
    for sub in std::fs::read_dir(root)?.flatten() {
        // Blobs live in two-letter folders (`tmp`, `recipes` are not).
        if sub.file_name().len() != 2 || !sub.path().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(sub.path())?.flatten() {
            let path = f.path();
            let name = f.file_name().to_string_lossy().into_owned();
            let ok = match name.parse::<Digest>() {
                Ok(d) if blobs.path(&d) == path => std::fs::File::open(&path)
                    .and_then(Digest::of_reader)
                    .ok()
                    .filter(|(actual, _)| *actual == d)
                    .map(|(_, size)| (d, size)),
                _ => None,
            };
            match ok {
                Some((d, size)) => {
                    let mtime = f.metadata().and_then(|m| m.modified()).ok();
                    found.push((mtime, d, size));
                }
                None => {
                    tracing::warn!(path = %path.display(), "cache file does not match its digest; removed");
                    let _ = std::fs::remove_file(&path);
                    removed += 1;
                }
            }
        }
    }
    found.sort_by_key(|f| f.0);
    let kept = found.len();
    for (_, d, size) in found {
        lru.insert(d, size);
    }
    Ok((kept, removed))
}

/// How long the partial file of a fetch that was cut is kept for the
/// fetch to resume (across restarts of the worker too).
const PARTIAL_KEEP: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes partial files no fetch resumed within [`PARTIAL_KEEP`], and
/// those of fetches that ran beside another of the same file.
fn remove_stale_partials(root: &Path) {
    for f in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let old = (f.metadata().and_then(|m| m.modified()).ok())
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age > PARTIAL_KEEP);
        if old || f.file_name().to_string_lossy().contains('.') {
            let _ = std::fs::remove_file(f.path());
        }
    }
}

/// Records where each chunk of the held file `recipe` describes lies.
fn index_chunks(chunks: &mut HashMap<Digest, ChunkAt>, recipe: &Recipe) {
    for (offset, c) in recipe.offsets() {
        chunks.entry(c.digest).or_insert(ChunkAt {
            file: recipe.digest,
            offset,
            len: c.len,
        });
    }
}

#[cfg(test)]
mod tests;
