//! Blob streams beside a control stream: uploads from clients and workers,
//! downloads by workers (counted per job), each read checked by the
//! connection's [`Fetch`].

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tessera_protocol::chunk::Recipe;
use tessera_protocol::Digest;
use tessera_store::{Backed, BlobStore};
use tessera_transport::blob::{self, Backing, ReadGate};
use tessera_transport::Channel;

use super::fetch::Fetch;
use crate::server::Shared;

/// Serves each blob stream the peer opens, one task per stream.
pub(super) async fn serve_streams(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    uploaded: Arc<AtomicU64>,
    fetch: Arc<Fetch>,
) {
    let mut streams = tokio::task::JoinSet::new();
    // Frames left unfinished on all of this peer's streams at once are
    // bounded together, not per stream.
    let budget = tessera_transport::framing::frame_budget();
    while let Ok(pair) = conn.accept_bi().await {
        let (shared, uploaded, fetch) = (shared.clone(), uploaded.clone(), fetch.clone());
        let budget = budget.clone();
        streams.spawn(async move {
            let mut ch = Channel::new(pair).with_budget(budget);
            if let Err(e) = serve_blob(&shared, &mut ch, &uploaded, &fetch).await {
                tracing::debug!("blob stream: {e:#}");
            }
        });
        while streams.try_join_next().is_some() {}
    }
    // The connection is gone: dropping the set ends what is left.
}

/// The connection's [`Fetch`] as the blob server asks it.
struct Gate<'a> {
    shared: &'a Shared,
    fetch: &'a Fetch,
}

impl ReadGate for Gate<'_> {
    fn may_read(&self, digest: &Digest) -> bool {
        let allowed = self.fetch.may_fetch(self.shared, digest);
        if !allowed {
            tracing::info!(%digest, "blob refused: not needed by a task the worker holds");
        }
        allowed
    }

    fn recipe_served(&self, recipe: &Recipe) {
        self.fetch.recipe_served(recipe);
    }

    fn backing(&self) -> Option<Arc<dyn Backing>> {
        let store = self.shared.store.inner();
        store.bucket()?;
        Some(Arc::new(Bucketed(store.clone())))
    }
}

/// How long a worker's URL to a blob in the bucket stays valid: long
/// enough to start the fetch (one already started runs to its end).
const URL_VALID: std::time::Duration = std::time::Duration::from_secs(600);

/// The bucket behind the coordinator's folder, as blob streams ask it.
struct Bucketed(Backed);

impl Backing for Bucketed {
    fn fetch(&self, digest: &Digest) -> bool {
        self.0.ensure_local(digest).unwrap_or_else(|e| {
            tracing::warn!(%digest, "cannot copy a blob from the bucket: {e}");
            false
        })
    }

    fn recipe(&self, file: &Digest) -> Option<Recipe> {
        self.0.recipe(file)
    }

    fn presign(&self, digest: &Digest) -> Option<(String, u64)> {
        self.0.presign(digest, URL_VALID)
    }
}

async fn serve_blob(
    shared: &Arc<Shared>,
    ch: &mut Channel,
    uploaded: &AtomicU64,
    fetch: &Fetch,
) -> anyhow::Result<()> {
    let gate = Gate { shared, fetch };
    match blob::answer_gated(shared.store.inner().dir(), ch, uploaded, &gate).await? {
        blob::Answered::Get {
            job: Some(job),
            sent,
            ..
        }
        | blob::Answered::GetMany {
            job: Some(job),
            sent,
        } => shared.update(|core, _| core.served_to_worker(job, sent)),
        // Fetched from the bucket, not sent by this coordinator.
        blob::Answered::Locate { .. } => {}
        _ => {}
    }
    Ok(())
}
