//! Fetching from the farm's object store. When a farm keeps its assets in
//! a bucket, the coordinator says so when the worker joins, and hands out
//! short-lived URLs (`BlobRequest::Locate`) for the blobs of the tasks this
//! worker holds, under the same rules as the blobs it serves itself. The
//! bytes then come from the store, not through the coordinator's uplink: a
//! whole file in one request, or a large file's lacking chunks as byte
//! ranges of the file's object, several at once. Every chunk and file is
//! verified here as if the coordinator had sent it; anything that goes
//! wrong (no URL, the store out of reach, bytes that do not match) falls
//! back to fetching from the coordinator.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use super::fetch::{Places, FETCH_STREAMS};
use super::*;

/// Largest byte range asked in one request.
const RANGE_MAX: u64 = 8 << 20;

/// A run of lacking chunks that lie one after another in the file.
struct Range {
    start: u64,
    /// Each chunk of the run, in file order.
    chunks: Vec<(Digest, u32)>,
}

impl Range {
    fn len(&self) -> u64 {
        self.chunks.iter().map(|(_, l)| u64::from(*l)).sum()
    }
}

/// Whether to ask for URLs: set from each `Joined`.
#[derive(Debug, Default)]
pub struct StoreUrls {
    on: AtomicBool,
    agent: std::sync::OnceLock<ureq::Agent>,
}

impl StoreUrls {
    fn agent(&self) -> ureq::Agent {
        (self.agent.get_or_init(|| {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_connect(Some(std::time::Duration::from_secs(10)))
                .timeout_recv_response(Some(std::time::Duration::from_secs(60)))
                .build()
                .into()
        }))
        .clone()
    }
}

impl Cache {
    /// Whether the coordinator this worker is joined to hands out URLs.
    pub fn set_store_urls(&self, on: bool) {
        self.store_urls.on.store(on, Ordering::Relaxed);
    }

    async fn url_of(
        &self,
        conn: &quinn::Connection,
        job: u64,
        digest: Digest,
    ) -> Option<(String, u64)> {
        if !self.store_urls.on.load(Ordering::Relaxed) {
            return None;
        }
        match blob::locate(conn, &[digest], Some(job)).await {
            Ok(mut urls) => urls.pop().flatten(),
            Err(e) => {
                tracing::warn!(%digest, "no URL for a blob in the farm's store: {e}");
                None
            }
        }
    }

    /// Fetches the whole blob `digest` of `size` bytes from the farm's store
    /// into the cache, verified; `None` when it must come from the
    /// coordinator instead.
    pub(super) async fn whole_from_store(
        &self,
        conn: &quinn::Connection,
        job: u64,
        digest: Digest,
        size: u64,
    ) -> Option<u64> {
        let (url, len) = self.url_of(conn, job, digest).await?;
        if len != size {
            tracing::warn!(%digest, "the store holds {len} bytes, the job names {size}");
            return None;
        }
        let (agent, blobs) = (self.store_urls.agent(), self.blobs.clone());
        let got = tokio::task::spawn_blocking(move || download(&agent, &url, &blobs, digest, len))
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| r);
        match got {
            Ok(()) => Some(len),
            Err(e) => {
                tracing::warn!(%digest, "fetching from the farm's store failed, asking the coordinator: {e:#}");
                None
            }
        }
    }

    /// Fetches the `lacking` chunks of the file `recipe` describes from the
    /// file's object in the farm's store, as byte ranges, into `file` at
    /// their `places`, each chunk verified; `None` when they must come from
    /// the coordinator instead.
    pub(super) async fn chunks_from_store(
        &self,
        conn: &quinn::Connection,
        job: u64,
        recipe: &Recipe,
        lacking: &[Digest],
        file: &Arc<std::fs::File>,
        places: &Arc<Places>,
    ) -> Option<u64> {
        if lacking.is_empty() {
            return Some(0);
        }
        let (url, len) = self.url_of(conn, job, recipe.digest).await?;
        if len != recipe.size {
            tracing::warn!(file = %recipe.digest, "the store holds {len} bytes, the recipe names {}", recipe.size);
            return None;
        }
        let queue = Arc::new(Mutex::new(ranges(recipe, lacking)));
        let fetched = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..FETCH_STREAMS {
            let (queue, fetched, url) = (queue.clone(), fetched.clone(), url.clone());
            let (file, places, agent) = (file.clone(), places.clone(), self.store_urls.agent());
            streams.spawn_blocking(move || -> anyhow::Result<()> {
                loop {
                    let next = queue.lock().expect("range queue").pop();
                    let Some(range) = next else {
                        return Ok(());
                    };
                    let n = fetch_range(&agent, &url, &range, &file, &places)?;
                    fetched.fetch_add(n, Ordering::Relaxed);
                }
            });
        }
        while let Some(done) = streams.join_next().await {
            let failed = match done {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(e) => e.into(),
            };
            queue.lock().expect("range queue").clear();
            tracing::warn!(file = %recipe.digest, "fetching chunks from the farm's store failed, asking the coordinator: {failed:#}");
            return None;
        }
        Some(fetched.load(Ordering::Relaxed))
    }
}

/// The lacking chunks as runs of neighbours in the file, each at most
/// [`RANGE_MAX`] bytes (a chunk that repeats is fetched once, at its first
/// place). Last to be fetched first.
fn ranges(recipe: &Recipe, lacking: &[Digest]) -> Vec<Range> {
    let mut wanted: std::collections::HashSet<Digest> = lacking.iter().copied().collect();
    let mut out: Vec<Range> = Vec::new();
    for (offset, c) in recipe.offsets() {
        if !wanted.remove(&c.digest) {
            continue;
        }
        match out.last_mut() {
            Some(r) if r.start + r.len() == offset && r.len() + u64::from(c.len) <= RANGE_MAX => {
                r.chunks.push((c.digest, c.len));
            }
            _ => out.push(Range {
                start: offset,
                chunks: vec![(c.digest, c.len)],
            }),
        }
    }
    out.reverse();
    out
}

/// One byte range: each chunk in it checked, then written at every place
/// it has in the file. Returns the bytes fetched.
fn fetch_range(
    agent: &ureq::Agent,
    url: &str,
    range: &Range,
    file: &std::fs::File,
    places: &Places,
) -> anyhow::Result<u64> {
    use std::os::unix::fs::FileExt;
    let len = range.len();
    let last = range.start + len - 1;
    let response = agent
        .get(url)
        .header("range", format!("bytes={}-{last}", range.start))
        .call()?;
    if response.status().as_u16() != 206 {
        anyhow::bail!("HTTP {} for a byte range", response.status());
    }
    let mut body = response.into_body().into_with_config().limit(len).reader();
    let mut buf = Vec::new();
    for (digest, chunk_len) in &range.chunks {
        buf.resize(*chunk_len as usize, 0);
        body.read_exact(&mut buf)?;
        if Digest::of(&buf) != *digest {
            anyhow::bail!("chunk {digest} from the store does not match its digest");
        }
        for offset in places.get(digest).map_or(&[][..], |p| &p.1[..]) {
            file.write_all_at(&buf, *offset)?;
        }
    }
    Ok(len)
}

/// Downloads a whole blob into the cache folder: into a temporary file,
/// then adopted once its bytes hash to `digest`.
fn download(
    agent: &ureq::Agent,
    url: &str,
    blobs: &BlobDir,
    digest: Digest,
    len: u64,
) -> anyhow::Result<()> {
    let response = agent.get(url).call()?;
    if response.status().as_u16() != 200 {
        anyhow::bail!("HTTP {}", response.status());
    }
    let temp = (blobs.root().join("tmp")).join(format!(
        "{}.{:016x}.store",
        digest.to_hex(),
        rand::random::<u64>()
    ));
    let copied = (|| -> anyhow::Result<()> {
        let mut body = response.into_body().into_with_config().limit(len).reader();
        let mut out = std::fs::File::create(&temp)?;
        let n = std::io::copy(&mut body, &mut out)?;
        if n != len {
            anyhow::bail!("{n} of {len} bytes");
        }
        blobs.adopt(&temp, &digest)?;
        Ok(())
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    copied
}
