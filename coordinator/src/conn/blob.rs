//! Blob streams beside a control stream: uploads from clients and workers,
//! downloads by workers (counted per job).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tessera_protocol::blob;
use tessera_protocol::transport::Channel;

use crate::server::Shared;

/// Serves each blob stream the peer opens, one task per stream.
pub(super) async fn serve_streams(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    uploaded: Arc<AtomicU64>,
) {
    let mut streams = tokio::task::JoinSet::new();
    while let Ok(pair) = conn.accept_bi().await {
        let (shared, uploaded) = (shared.clone(), uploaded.clone());
        streams.spawn(async move {
            let mut ch = Channel::new(pair);
            if let Err(e) = serve_blob(&shared, &mut ch, &uploaded).await {
                tracing::debug!("blob stream: {e:#}");
            }
        });
        while streams.try_join_next().is_some() {}
    }
    // The connection is gone: dropping the set ends what is left.
}

async fn serve_blob(
    shared: &Arc<Shared>,
    ch: &mut Channel,
    uploaded: &AtomicU64,
) -> anyhow::Result<()> {
    if let blob::Answered::Get {
        job: Some(job),
        sent,
        ..
    } = blob::answer(shared.store.inner(), ch, uploaded).await?
    {
        shared.update(|core, _| core.served_to_worker(job, sent));
    }
    Ok(())
}
