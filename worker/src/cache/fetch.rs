//! Fetching over QUIC: a job's files from the coordinator, a large file as
//! the chunks this cache lacks (written into a partial file at their
//! offsets, resuming a cut fetch, taking chunks it holds in other files
//! first), several streams at once, each file verified before it is kept.

use super::*;

impl Cache {
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

    /// Fetches one file of a job: a large one as the chunks this cache
    /// lacks, written into the file at their offsets (chunks it holds in
    /// other files copied from them), the whole file verified here; others
    /// whole.
    pub(super) async fn fetch(
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
        let got = match (self.whole_from_store(conn, job, entry.digest, entry.size)).await {
            Some(got) => Ok(got),
            None => blob::get(conn, entry.digest, Some(job), &self.blobs).await,
        };
        self.unreserve(entry.size);
        let got = got.with_context(|| format!("fetching {what}"))?;
        self.insert(entry.digest, got);
        Ok(got)
    }

    /// Fetches the large file `recipe` describes into `partial/` (see
    /// [`place_local_chunks`] and [`Cache::fetch_chunks`]), then
    /// stores it once its bytes hash to its digest. Returns the bytes
    /// fetched from the coordinator.
    pub(super) async fn fetch_chunked(
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

    pub(super) async fn fetch_into(
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
        let from_store =
            (self.chunks_from_store(conn, job, recipe, &lacking, &file, &places)).await;
        let fetched = match from_store {
            Some(fetched) => fetched,
            None => self
                .fetch_chunks(conn, job, lacking, &file, &places)
                .await
                .with_context(|| format!("fetching the chunks of {what}"))?,
        };
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
    pub(super) async fn fetch_chunks(
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
    pub(super) async fn fetch_missing(
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
}

/// Bytes of received chunks written to a file in one blocking-pool trip.
pub(super) const WRITE_BATCH: usize = 1 << 20;

/// Streams a worker fetches one file's chunks on at once.
pub(super) const FETCH_STREAMS: usize = 8;

/// Where each distinct chunk of a file goes: its length and every offset
/// it is at.
pub(super) type Places = HashMap<Digest, (u32, Vec<u64>)>;

/// One file's chunks being fetched on [`FETCH_STREAMS`] streams: each takes
/// the next batch of up to [`MAX_GET_MANY`] chunks until none is left.
pub(super) struct ChunkFetch {
    conn: quinn::Connection,
    job: u64,
    batches: Mutex<Vec<Vec<Digest>>>,
    fetched: std::sync::atomic::AtomicU64,
    file: Arc<std::fs::File>,
    places: Arc<Places>,
}

impl ChunkFetch {
    pub(super) async fn run(self: Arc<Self>) -> anyhow::Result<()> {
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
    pub(super) async fn fetch(&self, batch: &[Digest]) -> anyhow::Result<()> {
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

    pub(super) async fn write(&self, pending: Vec<(Digest, Vec<u8>)>) -> anyhow::Result<()> {
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

/// Opens (or creates) the partial file of a fetch at `path`, `size` bytes
/// long, and places every chunk it can without the network: those already
/// in it (a fetch that was cut, its bytes re-hashed here) and those of
/// other held files (`sources`: the file and offset where the chunk index
/// says each lies, re-hashed too). Returns the file and the chunks still
/// lacking, in the order given.
pub(super) fn place_local_chunks(
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
