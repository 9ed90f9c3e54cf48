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

/// Which blobs the cache holds, how recently each was used, and which are
/// pinned by running tasks. Plain data: no I/O.
#[derive(Debug)]
pub struct Lru<K> {
    entries: HashMap<K, Entry>,
    /// Bytes held plus bytes reserved for fetches in flight.
    total: u64,
    clock: u64,
    pins: HashMap<K, u32>,
}

impl<K> Default for Lru<K> {
    fn default() -> Self {
        Lru {
            entries: HashMap::new(),
            total: 0,
            clock: 0,
            pins: HashMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    used: u64,
}

impl<K: Copy + Eq + std::hash::Hash + Ord> Lru<K> {
    /// Records a blob already stored (on start, oldest first).
    pub fn insert(&mut self, digest: K, size: u64) {
        self.clock += 1;
        let entry = Entry {
            size,
            used: self.clock,
        };
        if let Some(old) = self.entries.insert(digest, entry) {
            self.total -= old.size;
        }
        self.total += size;
    }

    pub fn contains(&self, digest: &K) -> bool {
        self.entries.contains_key(digest)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn touch(&mut self, digest: &K) {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(digest) {
            e.used = self.clock;
        }
    }

    pub fn is_pinned(&self, digest: &K) -> bool {
        self.pins.contains_key(digest)
    }

    pub fn pin(&mut self, digest: K) {
        *self.pins.entry(digest).or_default() += 1;
    }

    pub fn unpin(&mut self, digest: &K) {
        if let Some(n) = self.pins.get_mut(digest) {
            *n -= 1;
            if *n == 0 {
                self.pins.remove(digest);
            }
        }
    }

    /// Makes room for `size` more bytes under `cap` by evicting the least
    /// recently used unpinned blobs, and reserves the room. Returns what to
    /// delete, or `None` (and evicts nothing) when the pinned blobs leave
    /// too little room.
    pub fn reserve(&mut self, size: u64, cap: u64) -> Option<Vec<K>> {
        if self.total + size <= cap {
            self.total += size;
            return Some(Vec::new());
        }
        let mut candidates: Vec<(u64, K, u64)> = self
            .entries
            .iter()
            .filter(|(d, _)| !self.pins.contains_key(d))
            .map(|(d, e)| (e.used, *d, e.size))
            .collect();
        candidates.sort_unstable_by_key(|c| c.0);
        let mut free_after = self.total;
        let mut evict = Vec::new();
        for (_, digest, esize) in candidates {
            if free_after + size <= cap {
                break;
            }
            free_after -= esize;
            evict.push(digest);
        }
        if free_after + size > cap {
            return None;
        }
        for d in &evict {
            let e = self.entries.remove(d).expect("candidate is an entry");
            self.total -= e.size;
        }
        self.total += size;
        Some(evict)
    }

    /// Forgets an entry (its file was removed).
    pub fn remove(&mut self, digest: &K) {
        if let Some(e) = self.entries.remove(digest) {
            self.total -= e.size;
        }
    }

    /// Gives back a reservation (the fetch failed, or it is now an entry).
    pub fn release(&mut self, size: u64) {
        self.total -= size;
    }
}

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
}

/// A stored Blender build unpacked for one task: its files stay pinned (not
/// evicted) until it is dropped.
pub struct BuildFiles<'a> {
    cache: &'a Cache,
    build: Digest,
    digests: Vec<Digest>,
    dir: PathBuf,
    /// Bytes fetched from the coordinator to unpack it (0: all cached).
    pub fetched: u64,
}

impl BuildFiles<'_> {
    /// The folder holding the build's files at their manifest paths.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for BuildFiles<'_> {
    fn drop(&mut self) {
        let mut state = self.cache.state();
        for d in &self.digests {
            state.lru.unpin(d);
        }
        if let Some(n) = state.builds.get_mut(&self.build) {
            *n = n.saturating_sub(1);
        }
    }
}

/// A job's folder, held for one task: the job's blobs stay pinned until it
/// is dropped.
pub struct JobFiles<'a> {
    cache: &'a Cache,
    job: u64,
    digests: Vec<Digest>,
    dir: PathBuf,
    /// This task's frame files in the folder (their paths).
    linked: Vec<String>,
}

impl JobFiles<'_> {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for JobFiles<'_> {
    fn drop(&mut self) {
        self.cache
            .release_job(self.job, &self.digests, &self.dir, &self.linked);
    }
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

    /// Fetches the job's missing blobs that a task rendering `frames` needs
    /// from the coordinator and lays out its folder: the files every task
    /// needs once per job, and a frame's own files (`submit
    /// --frame-files`) for the tasks of that frame only, so that a worker's
    /// first task waits for its share of the scene, not for all of it. The
    /// blobs stay pinned, and a frame's files linked in the folder, while
    /// the returned value lives.
    pub async fn prepare(
        &self,
        conn: &quinn::Connection,
        job: &JobInfo,
        frames: RangeInclusive<u32>,
    ) -> anyhow::Result<JobFiles<'_>> {
        let needed = || job.manifest.iter().filter(|e| e.needed_for(frames.clone()));
        let mut digests: Vec<Digest> = needed().map(|e| e.digest).collect();
        digests.sort_unstable();
        digests.dedup();
        self.reverify_changed(&digests).await?;
        let cell = {
            let mut state = self.state();
            for d in &digests {
                state.lru.pin(*d);
                state.lru.touch(d);
            }
            *state.running.entry(job.job).or_default() += 1;
            state.prepared.entry(job.job).or_default().clone()
        };
        // From here on, dropping `files` unpins.
        let mut files = JobFiles {
            cache: self,
            job: job.job,
            digests,
            dir: PathBuf::new(),
            linked: Vec::new(),
        };
        files.dir = cell
            .get_or_try_init(|| async {
                let _one_at_a_time = self.fetching.lock().await;
                self.build(conn, job).await
            })
            .await?
            .clone();
        let own: Vec<ManifestEntry> = needed().filter(|e| e.frame.is_some()).cloned().collect();
        if own.is_empty() {
            return Ok(files);
        }
        let fetched = {
            let _one_at_a_time = self.fetching.lock().await;
            self.fetch_missing(conn, job.job, &own).await?
        };
        // Linked (again, should a link have gone stale) under the state's
        // lock, counted per path: the last task using a frame's file
        // unlinks it, so that an evicted blob leaves the disk.
        let mut state = self.state();
        lay_out(&self.blobs, &files.dir, &own)?;
        for entry in own {
            *state
                .linked
                .entry((job.job, entry.path.clone()))
                .or_default() += 1;
            files.linked.push(entry.path);
        }
        drop(state);
        tracing::info!(
            job = job.job,
            frames = ?frames,
            files = files.linked.len(),
            fetched_bytes = fetched,
            "frame files ready"
        );
        Ok(files)
    }

    /// Fetches a finishing task's stitched passes (unless cached) and links
    /// them at `to`, where they stay until the caller removes them.
    pub async fn fetch_passes(
        &self,
        conn: &quinn::Connection,
        job: u64,
        passes: StitchedPasses,
        to: &Path,
    ) -> anyhow::Result<()> {
        let entry = ManifestEntry {
            path: "the frame's stitched passes".into(),
            digest: passes.digest,
            size: passes.size,
            origin: None,
            frame: None,
        };
        let held = self.state().lru.contains(&entry.digest);
        if !held || self.blobs.size(&entry.digest) != Some(entry.size) {
            self.fetch(conn, job, &entry).await?;
        }
        let _ = std::fs::remove_file(to);
        let from = self.blobs.path(&entry.digest);
        std::fs::hard_link(&from, to)
            .or_else(|_| std::fs::copy(&from, to).map(|_| ()))
            .with_context(|| format!("laying out the stitched passes at {}", to.display()))
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

    fn release_job(&self, job: u64, digests: &[Digest], dir: &Path, linked: &[String]) {
        let mut state = self.state();
        for d in digests {
            state.lru.unpin(d);
        }
        for path in linked {
            let key = (job, path.clone());
            let Some(n) = state.linked.get_mut(&key) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                state.linked.remove(&key);
                if let Ok(parts) = sanitize_manifest_path(path) {
                    let _ = std::fs::remove_file(
                        parts.iter().fold(dir.to_path_buf(), |p, c| p.join(c)),
                    );
                }
            }
        }
        if let Some(n) = state.running.get_mut(&job) {
            *n -= 1;
            if *n == 0 {
                state.running.remove(&job);
            }
        }
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

    /// Fetches one file of a job: a large one as the chunks this cache
    /// lacks, written into the file at their offsets (chunks it holds in
    /// other files copied from them), the whole file verified here; others
    /// whole.
    async fn fetch(
        &self,
        conn: &quinn::Connection,
        job: u64,
        entry: &ManifestEntry,
    ) -> anyhow::Result<u64> {
        let what = format!("`{}`", entry.path);
        if entry.size >= CHUNK_THRESHOLD {
            let recipe = blob::get_recipe(conn, entry.digest)
                .await
                .with_context(|| format!("fetching the chunk list of {what}"))?;
            if let Some(recipe) = recipe {
                return self.fetch_chunked(conn, job, &what, recipe).await;
            }
        }
        self.reserve(entry.size, &what)?;
        let got = blob::get(conn, entry.digest, Some(job), &self.blobs).await;
        self.unreserve(entry.size);
        let got = got.with_context(|| format!("fetching {what}"))?;
        self.insert(entry.digest, got);
        Ok(got)
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

    /// Fetches the large file `recipe` describes into `partial/` (see
    /// [`place_local_chunks`] and [`Cache::fetch_chunks`]), then
    /// stores it once its bytes hash to its digest. Returns the bytes
    /// fetched from the coordinator.
    async fn fetch_chunked(
        &self,
        conn: &quinn::Connection,
        job: u64,
        what: &str,
        recipe: Recipe,
    ) -> anyhow::Result<u64> {
        self.reserve(recipe.size, what)?;
        // One fetch of a file at a time writes its partial file; another
        // (a build and a job naming the same bytes) gets a file of its own.
        let own = self.state().partial.insert(recipe.digest);
        let partial = if own {
            self.partial_root.join(recipe.digest.to_hex())
        } else {
            let tag: u64 = rand::random();
            (self.partial_root).join(format!("{}.{tag:016x}", recipe.digest.to_hex()))
        };
        let result = self.fetch_into(conn, job, what, &recipe, &partial).await;
        if own {
            self.state().partial.remove(&recipe.digest);
        } else {
            let _ = std::fs::remove_file(&partial);
        }
        self.unreserve(recipe.size);
        let fetched = result?;
        self.insert(recipe.digest, recipe.size);
        index_chunks(&mut self.state().chunks, &recipe);
        Ok(fetched)
    }

    async fn fetch_into(
        &self,
        conn: &quinn::Connection,
        job: u64,
        what: &str,
        recipe: &Recipe,
        partial: &Path,
    ) -> anyhow::Result<u64> {
        // Where each distinct chunk goes (a chunk may repeat in a file).
        let mut places: Places = HashMap::new();
        for (offset, c) in recipe.offsets() {
            places
                .entry(c.digest)
                .or_insert((c.len, Vec::new()))
                .1
                .push(offset);
        }
        let mut seen = std::collections::HashSet::new();
        let sources: Vec<(Digest, Option<(PathBuf, u64)>)> = {
            let state = self.state();
            (recipe.chunks.iter())
                .filter(|c| seen.insert(c.digest))
                .map(|c| {
                    let held = (state.chunks.get(&c.digest))
                        .filter(|at| at.file != recipe.digest)
                        .map(|at| (self.blobs.path(&at.file), at.offset));
                    (c.digest, held)
                })
                .collect()
        };
        let places = Arc::new(places);
        let (path, size, p) = (partial.to_path_buf(), recipe.size, places.clone());
        let (file, lacking) =
            tokio::task::spawn_blocking(move || place_local_chunks(&path, size, &p, sources))
                .await?
                .with_context(|| format!("preparing {what} in the cache"))?;
        let fetched = self
            .fetch_chunks(conn, job, lacking, &file, &places)
            .await
            .with_context(|| format!("fetching the chunks of {what}"))?;
        let (blobs, recipe2, path) = (self.blobs.clone(), recipe.clone(), partial.to_path_buf());
        tokio::task::spawn_blocking(move || -> Result<(), blob::BlobError> {
            drop(file);
            if let Err(e) = blobs.adopt(&path, &recipe2.digest) {
                // Every chunk checked, yet the whole is wrong: the chunk
                // list lied. Nothing of it is worth resuming.
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            blobs.keep_recipe(&recipe2)?;
            Ok(())
        })
        .await?
        .with_context(|| format!("joining the chunks of {what}"))?;
        Ok(fetched)
    }

    /// Fetches `lacking` chunks into `file` at their `places`: batches of
    /// up to [`MAX_GET_MANY`] chunks a stream, 8 streams at once (up to 32
    /// MiB in flight, so that a long path is not held to a few chunks per
    /// round trip), each chunk verified as it arrives and written with the
    /// others received beside it in one blocking-pool trip. Returns the
    /// bytes fetched.
    async fn fetch_chunks(
        &self,
        conn: &quinn::Connection,
        job: u64,
        lacking: Vec<Digest>,
        file: &Arc<std::fs::File>,
        places: &Arc<Places>,
    ) -> anyhow::Result<u64> {
        let mut batches: Vec<Vec<Digest>> =
            lacking.chunks(MAX_GET_MANY).map(|b| b.to_vec()).collect();
        batches.reverse();
        let fetch = Arc::new(ChunkFetch {
            conn: conn.clone(),
            job,
            batches: Mutex::new(batches),
            fetched: Default::default(),
            file: file.clone(),
            places: places.clone(),
        });
        // Tasks, not one future joining them all: a chunk arriving on one
        // stream wakes that stream's task alone. Dropping the set (the
        // fetch was canceled) aborts them.
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..FETCH_STREAMS {
            streams.spawn(fetch.clone().run());
        }
        while let Some(done) = streams.join_next().await {
            done??;
        }
        Ok(fetch.fetched.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Fetches those of a job's `entries` the cache lacks (or holds with
    /// another size); returns the bytes fetched.
    async fn fetch_missing(
        &self,
        conn: &quinn::Connection,
        job: u64,
        entries: &[ManifestEntry],
    ) -> anyhow::Result<u64> {
        let mut fetched = 0;
        for entry in entries {
            let held = self.state().lru.contains(&entry.digest);
            if !held || self.blobs.size(&entry.digest) != Some(entry.size) {
                fetched += self.fetch(conn, job, entry).await?;
            }
        }
        Ok(fetched)
    }

    /// Fetches and lays out the files every task of the job needs.
    async fn build(&self, conn: &quinn::Connection, job: &JobInfo) -> anyhow::Result<PathBuf> {
        let shared: Vec<ManifestEntry> = (job.manifest.iter())
            .filter(|e| e.frame.is_none())
            .cloned()
            .collect();
        let fetched = self.fetch_missing(conn, job.job, &shared).await?;
        let tag = Digest::of(format!("{:?}", job.manifest).as_bytes()).to_hex();
        let dir = self.jobs_root.join(format!("{}-{}", job.job, &tag[..12]));
        let blobs = self.blobs.clone();
        let files = shared.len();
        let dir2 = dir.clone();
        tokio::task::spawn_blocking(move || lay_out(&blobs, &dir2, &shared)).await??;
        tracing::info!(
            job = job.job,
            files,
            fetched_bytes = fetched,
            cached_bytes = self.held_bytes(),
            "job files ready"
        );
        Ok(dir)
    }
}

impl Cache {
    /// Fetches the files of the stored Blender build `digest` that this
    /// cache lacks (its manifest first, then each file, large ones as the
    /// chunks this cache lacks, every byte verified against its digest) and
    /// lays them out under `builds/`, each with the mode the manifest
    /// gives. Its files count against `--cache-max` like a job's and stay
    /// pinned while the returned value lives; once no task uses it, they are
    /// evicted like any other (and its folder goes with them). Bytes are
    /// counted as sent for `job`.
    pub async fn prepare_build(
        &self,
        conn: &quinn::Connection,
        job: u64,
        digest: Digest,
    ) -> anyhow::Result<BuildFiles<'_>> {
        let mut fetched = 0;
        {
            let mut state = self.state();
            state.lru.pin(digest);
            state.lru.touch(&(digest));
        }
        let manifest = self.build_manifest(conn, job, digest, &mut fetched).await;
        self.state().lru.unpin(&(digest));
        let manifest = manifest?;
        let mut digests: Vec<Digest> = manifest.files.iter().map(|f| f.digest).collect();
        digests.push(digest);
        digests.sort_unstable();
        digests.dedup();
        self.reverify_changed(&digests).await?;
        {
            let mut state = self.state();
            for d in &digests {
                state.lru.pin(*d);
                state.lru.touch(d);
            }
            *state.builds.entry(digest).or_default() += 1;
        }
        // From here on, dropping `files` unpins.
        let mut files = BuildFiles {
            cache: self,
            build: digest,
            digests,
            dir: self.builds_root.join(digest.to_hex()),
            fetched: 0,
        };
        let entries: Vec<ManifestEntry> = (manifest.files.iter())
            .map(|f| ManifestEntry {
                path: f.path.clone(),
                digest: f.digest,
                size: f.size,
                origin: None,
                frame: None,
            })
            .collect();
        for entry in &entries {
            let held = self.state().lru.contains(&entry.digest);
            if !held || self.blobs.size(&entry.digest) != Some(entry.size) {
                fetched += self.fetch(conn, job, entry).await?;
            }
        }
        files.fetched = fetched;
        // A blob shared by several paths gets every mode they ask for.
        let mut modes: HashMap<Digest, u32> = HashMap::new();
        for f in &manifest.files {
            *modes.entry(f.digest).or_default() |= f.mode;
        }
        let (blobs, dir) = (self.blobs.clone(), files.dir.clone());
        let stamps =
            tokio::task::spawn_blocking(move || lay_out_build(&blobs, &dir, &entries, &modes))
                .await??;
        {
            // Modes were set on verified blobs: their new stamps.
            let mut state = self.state();
            state.stamps.extend(stamps);
        }
        tracing::info!(
            build = %digest,
            version = %manifest.version,
            files = manifest.files.len(),
            fetched_bytes = fetched,
            cached_bytes = self.held_bytes(),
            "blender build ready"
        );
        Ok(files)
    }

    /// The build's manifest: from the cache, else fetched, then checked.
    async fn build_manifest(
        &self,
        conn: &quinn::Connection,
        job: u64,
        digest: Digest,
        fetched: &mut u64,
    ) -> anyhow::Result<BuildManifest> {
        if !self.blobs.contains(&digest) {
            let got = blob::get(conn, digest, Some(job), &self.blobs)
                .await
                .context("fetching the build's manifest")?;
            *fetched += got;
            self.insert(digest, got);
            if let Some(cap) = self.cap {
                let evict = self.state().lru.reserve(0, cap).unwrap_or_default();
                self.delete(&evict);
            }
        }
        let bytes = self
            .blobs
            .read(&digest)
            .context("reading the build's manifest")?;
        let manifest = BuildManifest::from_bytes(&bytes)
            .map_err(|e| anyhow::anyhow!("unreadable build manifest: {e}"))?;
        manifest
            .validate()
            .context("the coordinator sent a bad build manifest")?;
        Ok(manifest)
    }

    /// Whether a build's folder was removed since last asked.
    pub fn take_builds_removed(&self) -> bool {
        std::mem::take(&mut self.state().builds_removed)
    }
}

/// Lays out a build's files in `dir` as hard links to their blobs, each
/// blob given its mode, and checks each file's size and mode once placed.
/// Returns the blobs' new stamps (a mode change changes them).
fn lay_out_build(
    blobs: &BlobDir,
    dir: &Path,
    entries: &[ManifestEntry],
    modes: &HashMap<Digest, u32>,
) -> anyhow::Result<Vec<(Digest, Stamp)>> {
    use std::os::unix::fs::PermissionsExt;
    let mut stamps = Vec::new();
    for (digest, mode) in modes {
        let path = blobs.path(digest);
        let now = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        if now != *mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
        }
        if let Some(stamp) = Stamp::of(&path) {
            stamps.push((*digest, stamp));
        }
    }
    lay_out(blobs, dir, entries)?;
    for e in entries {
        let placed = dir.join(&e.path);
        let meta = std::fs::metadata(&placed)
            .with_context(|| format!("the build's `{}` was not placed", e.path))?;
        let want = modes.get(&e.digest).copied().unwrap_or(0);
        if meta.len() != e.size || meta.permissions().mode() & want != want {
            bail!("the build's `{}` does not match its manifest", e.path);
        }
    }
    Ok(stamps)
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

/// Bytes of received chunks written to a file in one blocking-pool trip.
const WRITE_BATCH: usize = 1 << 20;

/// Streams a worker fetches one file's chunks on at once.
const FETCH_STREAMS: usize = 8;

/// Where each distinct chunk of a file goes: its length and every offset
/// it is at.
type Places = HashMap<Digest, (u32, Vec<u64>)>;

/// One file's chunks being fetched on [`FETCH_STREAMS`] streams: each takes
/// the next batch of up to [`MAX_GET_MANY`] chunks until none is left.
struct ChunkFetch {
    conn: quinn::Connection,
    job: u64,
    batches: Mutex<Vec<Vec<Digest>>>,
    fetched: std::sync::atomic::AtomicU64,
    file: Arc<std::fs::File>,
    places: Arc<Places>,
}

impl ChunkFetch {
    async fn run(self: Arc<Self>) -> anyhow::Result<()> {
        loop {
            let next = self.batches.lock().expect("fetch queue").pop();
            let Some(batch) = next else {
                return Ok(());
            };
            if let Err(e) = self.fetch(&batch).await {
                self.batches.lock().expect("fetch queue").clear();
                return Err(e);
            }
        }
    }

    /// One batch on one stream; what arrives is written in runs of
    /// [`WRITE_BATCH`] bytes.
    async fn fetch(&self, batch: &[Digest]) -> anyhow::Result<()> {
        let mut many =
            blob::get_many_in_memory(&self.conn, batch, Some(self.job), MAX_CHUNK as u64).await?;
        let (mut pending, mut pending_bytes) = (Vec::new(), 0);
        while let Some((digest, bytes)) = many.next().await? {
            (self.fetched).fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
            pending_bytes += bytes.len();
            pending.push((digest, bytes));
            if pending_bytes >= WRITE_BATCH {
                self.write(std::mem::take(&mut pending)).await?;
                pending_bytes = 0;
            }
        }
        self.write(pending).await
    }

    async fn write(&self, pending: Vec<(Digest, Vec<u8>)>) -> anyhow::Result<()> {
        let (file, places) = (self.file.clone(), self.places.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::os::unix::fs::FileExt;
            for (digest, bytes) in &pending {
                for offset in places.get(digest).map_or(&[][..], |p| &p.1[..]) {
                    file.write_all_at(bytes, *offset)?;
                }
            }
            Ok(())
        })
        .await??;
        Ok(())
    }
}

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

/// Opens (or creates) the partial file of a fetch at `path`, `size` bytes
/// long, and places every chunk it can without the network: those already
/// in it (a fetch that was cut, its bytes re-hashed here) and those of
/// other held files (`sources`: the file and offset where the chunk index
/// says each lies, re-hashed too). Returns the file and the chunks still
/// lacking, in the order given.
fn place_local_chunks(
    path: &Path,
    size: u64,
    places: &Places,
    sources: Vec<(Digest, Option<(PathBuf, u64)>)>,
) -> std::io::Result<(Arc<std::fs::File>, Vec<Digest>)> {
    use std::os::unix::fs::FileExt;
    let resumed = path.exists();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if file.metadata()?.len() != size {
        file.set_len(size)?;
    }
    let mut lacking = Vec::new();
    let mut opened: HashMap<PathBuf, Option<std::fs::File>> = HashMap::new();
    let mut buf = Vec::new();
    for (digest, held) in sources {
        let Some((len, offsets)) = places.get(&digest) else {
            continue;
        };
        buf.resize(*len as usize, 0);
        // A hole reads as zeros, which match only a chunk of zeros.
        if resumed && file.read_exact_at(&mut buf, offsets[0]).is_ok() && Digest::of(&buf) == digest
        {
            for o in &offsets[1..] {
                file.write_all_at(&buf, *o)?;
            }
            continue;
        }
        if let Some((from, at)) = held {
            let src = (opened.entry(from)).or_insert_with_key(|p| std::fs::File::open(p).ok());
            if let Some(src) = src {
                if src.read_exact_at(&mut buf, at).is_ok() && Digest::of(&buf) == digest {
                    for o in offsets {
                        file.write_all_at(&buf, *o)?;
                    }
                    continue;
                }
            }
        }
        lacking.push(digest);
    }
    Ok((Arc::new(file), lacking))
}

fn lay_out(blobs: &BlobDir, dir: &Path, manifest: &[ManifestEntry]) -> anyhow::Result<()> {
    for entry in manifest {
        let parts = sanitize_manifest_path(&entry.path)?;
        let dest = parts.iter().fold(dir.to_path_buf(), |p, c| p.join(c));
        let src = blobs.path(&entry.digest);
        // A link to the cached blob is in place; anything else (a link to a
        // blob removed since, a copy) is replaced.
        if Stamp::same_file(&src, &dest) {
            continue;
        }
        if dest.exists() {
            std::fs::remove_file(&dest)?;
        }
        std::fs::create_dir_all(dest.parent().expect("joined under dir"))?;
        if std::fs::hard_link(&src, &dest).is_err() {
            std::fs::copy(&src, &dest)
                .with_context(|| format!("placing `{}` in {}", entry.path, dir.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    #[test]
    fn least_recently_used_goes_first_and_pinned_never() {
        let mut lru = Lru::default();
        for n in 1..=4 {
            lru.insert(d(n), 100);
        }
        lru.touch(&d(1)); // order now 2, 3, 4, 1
        lru.pin(d(2));
        // Room for 150 more under 400: evict the two oldest unpinned.
        assert_eq!(lru.reserve(150, 400), Some(vec![d(3), d(4)]));
        assert_eq!(lru.total(), 200 + 150);
        lru.release(150);
        lru.insert(d(5), 150);
        // Only unpinned 1 and 5 can go: 250 bytes; 2 stays pinned.
        assert_eq!(lru.reserve(400, 400), None);
        assert!(lru.contains(&d(2)) && lru.contains(&d(1)) && lru.contains(&d(5)));
        lru.unpin(&d(2));
        let evicted = lru.reserve(400, 400).unwrap();
        assert_eq!(evicted.len(), 3);
        assert_eq!(lru.total(), 400);
    }

    /// (chunk bytes in the recipe's order, which are already in the
    /// partial file, which a held file has) → the chunks still lacking.
    #[test]
    fn a_fetch_takes_chunks_from_its_partial_file_and_held_files_first() {
        let dir = std::env::temp_dir().join(format!("tessera-partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let chunk = |n: u8, len: usize| vec![n; len];
        let (a, b, c, e) = (chunk(1, 100), chunk(2, 50), chunk(3, 70), chunk(4, 30));
        // The file to fetch: a b c a e.
        let order = [&a, &b, &c, &a, &e];
        let mut places: HashMap<Digest, (u32, Vec<u64>)> = HashMap::new();
        let mut offset = 0;
        for bytes in order {
            (places.entry(Digest::of(bytes)))
                .or_insert((bytes.len() as u32, Vec::new()))
                .1
                .push(offset);
            offset += bytes.len() as u64;
        }
        let size = offset;
        // A cut fetch left `b` in place; a held file has `c` at 10 and
        // claims `e` at 0, where it has other bytes.
        let partial = dir.join("partial");
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::File::create(&partial).unwrap();
            f.set_len(size).unwrap();
            f.write_all_at(&b, 100).unwrap();
        }
        let held = dir.join("held");
        let mut held_bytes = vec![9u8; 10];
        held_bytes.extend_from_slice(&c);
        std::fs::write(&held, &held_bytes).unwrap();
        let sources = vec![
            (Digest::of(&a), None),
            (Digest::of(&b), None),
            (Digest::of(&c), Some((held.clone(), 10))),
            (Digest::of(&e), Some((held.clone(), 0))),
        ];
        let (file, lacking) = place_local_chunks(&partial, size, &places, sources).unwrap();
        assert_eq!(lacking, vec![Digest::of(&a), Digest::of(&e)]);
        drop(file);
        let got = std::fs::read(&partial).unwrap();
        assert_eq!(got.len() as u64, size);
        assert_eq!(&got[100..150], &b[..], "kept from the cut fetch");
        assert_eq!(&got[150..220], &c[..], "copied from the held file");
        assert!(
            got[..100].iter().all(|x| *x == 0),
            "still a hole: {:?}",
            &got[..4]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_chunk_index_says_where_each_chunk_of_a_held_file_lies() {
        let chunk = |n: u8, len: u32| tessera_protocol::chunk::ChunkRef {
            digest: Digest::of(&[n]),
            len,
        };
        let file = Digest::of(b"file");
        let recipe = Recipe {
            digest: file,
            size: 60,
            chunks: vec![chunk(1, 10), chunk(2, 20), chunk(1, 10), chunk(3, 20)],
        };
        let mut index = HashMap::new();
        index_chunks(&mut index, &recipe);
        let at = |n: u8| {
            index
                .get(&Digest::of(&[n]))
                .map(|a: &ChunkAt| (a.offset, a.len))
        };
        assert_eq!(index.len(), 3);
        assert_eq!(at(1), Some((0, 10)), "the first place of a repeated chunk");
        assert_eq!(at(2), Some((10, 20)));
        assert_eq!(at(3), Some((40, 20)));
        assert!(index.values().all(|a| a.file == file));
    }

    #[test]
    fn restart_rebuilds_the_index_and_drops_corrupt_blobs() {
        let dir = std::env::temp_dir().join(format!("tessera-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let blobs = BlobDir::open(dir.join("blobs")).unwrap();
        let good = blobs.put_bytes(b"texture").unwrap();
        let bad = blobs.put_bytes(b"scene").unwrap();
        std::fs::write(blobs.path(&bad), b"sceNe").unwrap();
        std::fs::write(blobs.root().join("tmp").join("half"), b"x").unwrap();
        let cache = Cache::open(&dir, Some(1000)).unwrap();
        assert!(cache.state().lru.contains(&good));
        assert!(!cache.state().lru.contains(&bad));
        assert!(!blobs.path(&bad).exists(), "a corrupt blob is removed");
        assert_eq!(cache.held_bytes(), 7);
        drop(cache);
        // Reopened with a cap below what it holds: shrinks at once.
        let cache = Cache::open(&dir, Some(3)).unwrap();
        assert_eq!(cache.held_bytes(), 0);
        assert!(!blobs.path(&good).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
