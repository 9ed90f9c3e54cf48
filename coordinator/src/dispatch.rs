//! The dispatcher: runs the farm core's dispatch (expire overdue leases,
//! fill free slots) whenever woken, and at the latest when the next lease
//! deadline passes.

use std::sync::Arc;
use std::time::Duration;

use crate::server::Shared;

/// Hands out work until its task is aborted.
pub(crate) async fn dispatcher(shared: Arc<Shared>) {
    let mut woken = None;
    loop {
        // A coordinator whose lease on the farm ended (the database out of
        // reach) or was taken hands nothing out: a standby may be taking
        // over (see `lease.rs`).
        if !shared.lease.valid() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // On the blocking pool: expiring a lease may fail a job, which
        // records it in the database.
        let deadline = match shared
            .blocking(|s| s.update(|core, now| core.dispatch(now)))
            .await
        {
            Ok(deadline) => deadline,
            Err(e) => {
                tracing::error!("dispatch failed: {e:#}");
                Some(shared.now().ms + shared.config.heartbeat_ms)
            }
        };
        if let Some(at) = woken.take() {
            shared
                .metrics
                .observe_dispatch(std::time::Instant::elapsed(&at));
        }
        // While anything runs, look again every heartbeat: a task may have
        // become a straggler.
        let sleep = match deadline {
            Some(at) => Duration::from_millis(
                (at.saturating_sub(shared.now().ms) + 1).min(shared.config.heartbeat_ms.max(50)),
            ),
            None => Duration::from_secs(3600),
        };
        tokio::select! {
            _ = shared.wake.notified() => woken = Some(std::time::Instant::now()),
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}
