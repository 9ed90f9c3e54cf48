//! Background upkeep of what the coordinator keeps on disk: the scrub, which
//! re-hashes every stored blob at a bounded rate and removes the ones that
//! rotted (so they are reported missing and uploaded again, instead of
//! failing every job that uses them), and the regular SQLite checkpoint,
//! which bounds what a lost WAL file can take with it.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_protocol::Digest;
use tessera_store::BlobStore;

use crate::server::Shared;

/// How much of a blob is read and hashed at a time.
const SCRUB_BLOCK: usize = 1024 * 1024;
/// The pause between two scrub passes over the whole store.
const SCRUB_PAUSE: Duration = Duration::from_secs(3600);

/// Scrubs the store now and again [`SCRUB_PAUSE`] after each pass, reading at
/// most `bytes_per_sec` (0: never), until its task is aborted.
pub(crate) async fn scrub(shared: Arc<Shared>, bytes_per_sec: u64) {
    if bytes_per_sec == 0 {
        return;
    }
    loop {
        match scrub_pass(&shared, bytes_per_sec).await {
            Ok(pass) => tracing::info!(
                blobs = pass.blobs,
                bytes = pass.bytes,
                corrupt = pass.corrupt,
                "scrub pass done"
            ),
            Err(e) => tracing::warn!("scrub pass failed: {e:#}"),
        }
        tokio::time::sleep(SCRUB_PAUSE).await;
    }
}

/// What one pass saw.
#[derive(Debug, Default, Clone, Copy)]
struct Pass {
    blobs: u64,
    bytes: u64,
    corrupt: u64,
}

async fn scrub_pass(shared: &Arc<Shared>, bytes_per_sec: u64) -> anyhow::Result<Pass> {
    let listed = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || shared.store.list()).await??
    };
    let mut pass = Pass::default();
    let started = Instant::now();
    for blob in listed {
        let shared2 = shared.clone();
        let checked = tokio::task::spawn_blocking(move || rehash(&shared2, &blob.digest)).await?;
        let Some((bytes, intact)) = checked? else {
            continue; // removed meanwhile (garbage collection)
        };
        pass.blobs += 1;
        pass.bytes += bytes;
        if !intact {
            // Put back from a good copy, read again, or removed (then it is
            // asked for again).
            let shared2 = shared.clone();
            let removed =
                tokio::task::spawn_blocking(move || shared2.store.inner().repair(&blob.digest))
                    .await??;
            if removed {
                pass.corrupt += 1;
                tracing::warn!(digest = %blob.digest, "scrub: stored blob is corrupt: taken for missing, it will be asked for again");
            }
        }
        // Stay under the rate: the pass may not be ahead of its budget.
        let budget = Duration::from_secs_f64(pass.bytes as f64 / bytes_per_sec as f64);
        if let Some(ahead) = budget.checked_sub(started.elapsed()) {
            tokio::time::sleep(ahead).await;
        }
    }
    Ok(pass)
}

/// Re-hashes one stored blob: its size and whether it still matches its
/// digest, `None` when it is no longer stored.
fn rehash(shared: &Shared, digest: &Digest) -> std::io::Result<Option<(u64, bool)>> {
    // Where it is durable: the bucket, when there is one.
    let mut file = match shared.store.inner().open_durable(digest) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => return Err(std::io::Error::other(e)),
    };
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; SCRUB_BLOCK];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(Some((bytes, Digest::from(hasher.finalize()) == *digest)))
}

/// Checkpoints the database every `every` until its task is aborted.
pub(crate) async fn checkpoint(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let shared = shared.clone();
        match tokio::task::spawn_blocking(move || shared.db().checkpoint()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("database checkpoint failed: {e}"),
            Err(e) => tracing::warn!("database checkpoint panicked: {e}"),
        }
    }
}

/// How often [`trim_memory`] looks.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Gives the memory of ended connections back to the system, every
/// [`TRIM_EVERY`] in which some ended, until its task is aborted. glibc's
/// allocator keeps what a burst of connections freed in the runtime
/// threads' arenas, as holes it cannot give back on its own: after 2,000
/// `status` calls, 4 at a time, 133 MB resident with 11 MB in use;
/// `malloc_trim` returns it (26 MB).
pub(crate) async fn trim_memory(shared: Arc<Shared>) {
    let mut seen = 0;
    loop {
        tokio::time::sleep(TRIM_EVERY).await;
        let closed = (shared.metrics.connections_closed).load(std::sync::atomic::Ordering::Relaxed);
        if closed == seen {
            continue;
        }
        seen = closed;
        let _ = tokio::task::spawn_blocking(trim).await;
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim takes no pointer and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
