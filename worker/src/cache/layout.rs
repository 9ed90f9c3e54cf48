//! Build layout: a job's folder assembled from cached blobs with hard links
//! at the paths its manifest names (once per job, a frame's own files per
//! task), and a Blender build unpacked under `builds/`; what a running task
//! holds stays pinned until its [`JobFiles`] or [`BuildFiles`] is dropped.

use super::*;

impl Cache {
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

    /// Fetches and lays out the files every task of the job needs.
    pub(super) async fn build(
        &self,
        conn: &quinn::Connection,
        job: &JobInfo,
    ) -> anyhow::Result<PathBuf> {
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
    pub(super) async fn build_manifest(
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

    pub(super) fn release_job(&self, job: u64, digests: &[Digest], dir: &Path, linked: &[String]) {
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

/// Lays out a build's files in `dir` as hard links to their blobs, each
/// blob given its mode, and checks each file's size and mode once placed.
/// Returns the blobs' new stamps (a mode change changes them).
pub(super) fn lay_out_build(
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

pub(super) fn lay_out(
    blobs: &BlobDir,
    dir: &Path,
    manifest: &[ManifestEntry],
) -> anyhow::Result<()> {
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
