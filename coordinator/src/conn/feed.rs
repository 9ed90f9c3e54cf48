//! A monitor's feed: a snapshot now and every half second, and each event
//! as it happens. Events go through a bounded broadcast channel: a
//! subscriber that falls behind skips to a fresh snapshot, and never slows
//! the farm.

use std::sync::Arc;
use std::time::Duration;

use tessera_protocol::messages::ClientResponse;
use tessera_transport::Channel;
use tokio::sync::broadcast;

use crate::server::Shared;

/// How often a fresh snapshot goes out.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(500);
/// Finished jobs a snapshot shows (the newest), read from the database.
pub const FEED_FINISHED_JOBS: u32 = 100;

pub(super) async fn feed(shared: &Arc<Shared>, mut control: Channel) -> anyhow::Result<()> {
    // The finished jobs come from the database: on the blocking pool.
    let snapshot = || async {
        let snapshot = shared
            .blocking(|s| s.snapshot(FEED_FINISHED_JOBS))
            .await??;
        anyhow::Ok(ClientResponse::Snapshot(snapshot))
    };
    let mut events = shared.events();
    let legacy = control.codec() == tessera_protocol::codec::Codec::Legacy;
    let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
    loop {
        let msg = tokio::select! {
            _ = tick.tick() => snapshot().await?,
            event = events.recv() => match event {
                Ok((_, event)) if legacy && !event.known_to_version_18() => continue,
                Ok((unix_ms, event)) => ClientResponse::Event { unix_ms, event },
                Err(broadcast::error::RecvError::Lagged(_)) => snapshot().await?,
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
        };
        control.send(&msg).await?;
    }
}
