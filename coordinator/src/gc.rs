//! Garbage collection: removes stored blobs that no retained job uses, once
//! at start and then every hour, or when a client asks.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tessera_protocol::messages::Collected;
use tessera_store::BlobStore;

use crate::server::{unix_ms, Shared};

/// How often garbage is collected (and once at start).
const GC_EVERY: Duration = Duration::from_secs(3600);
/// Blobs written (or asked about by a client) this recently are never
/// collected: an upload whose submit has not arrived yet, a worker's output
/// before its result is committed.
const GC_GRACE: Duration = Duration::from_secs(3600);
/// Jobs read per database lock while collecting.
const GC_PAGE: u32 = 500;

/// Collects garbage now and every [`GC_EVERY`] until its task is aborted.
pub(crate) async fn every_hour(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(GC_EVERY);
    loop {
        tick.tick().await;
        let shared = shared.clone();
        match tokio::task::spawn_blocking(move || collect_garbage(&shared)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("garbage collection failed: {e:#}"),
            Err(e) => tracing::warn!("garbage collection panicked: {e}"),
        }
    }
}

/// Removes stored blobs that no retained job and no Blender build uses. A job is retained until
/// `retention` after it finished (forever while it is not finished); it uses
/// its manifest's files, their chunks, its task outputs and its frames.
pub(crate) fn collect_garbage(shared: &Shared) -> anyhow::Result<Collected> {
    let _gc = crate::server::relock(&shared.gc);
    let now = unix_ms();
    let retention = shared.config.retention.as_millis() as u64;
    let finished_before = now.saturating_sub(retention);
    let mut keep: HashSet<_> = shared
        .db()
        .outputs_kept(finished_before)?
        .into_iter()
        .collect();
    // The jobs' files and their chunks, a page of jobs at a time: status
    // requests read the database too, and must not wait for a whole scan.
    let mut after = 0;
    loop {
        let page = shared.db().jobs_page(after, GC_PAGE)?;
        let Some(last) = page.last() else { break };
        after = last.id;
        for job in &page {
            let expired = job.state.is_final()
                && job
                    .finished_ms
                    .is_some_and(|f| f.saturating_add(retention) <= now);
            if expired {
                continue;
            }
            for m in &job.spec.manifest {
                keep.insert(m.digest);
                if let Some(recipe) = shared.store.recipe(&m.digest) {
                    keep.extend(recipe.chunks.iter().map(|c| c.digest));
                }
            }
        }
    }
    keep.extend(crate::builds::kept_by_builds(shared)?);
    let young = std::time::SystemTime::now() - GC_GRACE;
    let mut c = Collected {
        removed_blobs: 0,
        removed_bytes: 0,
        kept_blobs: 0,
        kept_bytes: 0,
    };
    for blob in shared.store.list()? {
        if keep.contains(&blob.digest) || blob.written > young {
            c.kept_blobs += 1;
            c.kept_bytes += blob.size;
        } else {
            shared.store.remove(&blob.digest)?;
            c.removed_blobs += 1;
            c.removed_bytes += blob.size;
        }
    }
    tracing::info!(
        removed = c.removed_blobs,
        removed_bytes = c.removed_bytes,
        kept = c.kept_blobs,
        "garbage collected"
    );
    Ok(c)
}
