//! Farm scans: a client whose Blender cannot read its `.blend` uploads the
//! file and asks for a scan; a connected worker whose own Blender is the
//! file's series or newer fetches that one blob, lists what it references
//! (nothing is looked up on the worker's disk) and answers; the client
//! checks the listed files against its own disk.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_protocol::blender::BlenderVersion;
use tessera_protocol::messages::{ClientError, CoordMsg, MAX_SCAN_JSON};
use tessera_protocol::text::{self, MAX_ERROR};
use tessera_protocol::Digest;
use tessera_store::BlobStore;
use tokio::sync::oneshot;

use crate::scheduler::WorkerId;
use crate::server::Shared;

/// How long a client waits for a worker's scan.
const SCAN_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest artist's path a scan request may carry.
const MAX_SCAN_PATH: usize = 4096;

struct Pending {
    worker: WorkerId,
    blend: Digest,
    reply: oneshot::Sender<Result<String, String>>,
}

/// The scans handed to workers and not yet answered.
#[derive(Default)]
pub(crate) struct Scans {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
}

impl Scans {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `worker` was asked to scan the blob `digest` and has not
    /// answered yet: the one blob a scan lets a worker fetch (consulted by
    /// [`crate::conn::fetch::Fetch::may_fetch`]).
    pub fn may_fetch(&self, worker: WorkerId, digest: &Digest) -> bool {
        (self.pending().values()).any(|p| p.worker == worker && p.blend == *digest)
    }

    /// Worker `worker` answered scan `id`; an answer to a scan it was not
    /// given is dropped.
    pub fn answered(&self, worker: WorkerId, id: u64, result: Result<String, String>) {
        let mut pending = self.pending();
        if pending.get(&id).is_some_and(|p| p.worker == worker) {
            let p = pending.remove(&id).expect("present");
            let result = match result {
                Ok(json) if json.len() > MAX_SCAN_JSON => Err(format!(
                    "the scan's answer is {} bytes; at most {MAX_SCAN_JSON} are accepted",
                    json.len()
                )),
                Ok(json) => Ok(json),
                Err(mut e) => {
                    text::truncate_in_place(&mut e, MAX_ERROR);
                    Err(e)
                }
            };
            let _ = p.reply.send(result);
        }
    }

    /// Worker `worker` left: its unanswered scans fail now.
    pub fn worker_left(&self, worker: WorkerId) {
        self.pending().retain(|_, p| p.worker != worker);
    }
}

/// Answers a client's `Scan` request: hands it to a worker that can read
/// the file and waits for its answer.
pub(crate) async fn scan(
    shared: &Arc<Shared>,
    blend: Digest,
    path: String,
    version: BlenderVersion,
) -> Result<(String, String), ClientError> {
    if path.len() > MAX_SCAN_PATH {
        return Err(ClientError::invalid(format!(
            "a scan's path may be at most {MAX_SCAN_PATH} bytes"
        )));
    }
    // With a bucket, asking it is a request: off the runtime.
    let store = shared.store.clone();
    let stored = tokio::task::spawn_blocking(move || store.has(&blend)).await;
    if stored.ok().flatten().is_none() {
        return Err(ClientError::invalid(format!(
            "blob {blend} was not uploaded"
        )));
    }
    let Some((worker, name)) = shared.read(|core, _| core.scanner_for(version)) else {
        return Err(ClientError::unavailable(format!(
            "no worker on the farm offers Blender {} or newer to scan it",
            version.short()
        )));
    };
    let id = shared.scans.next.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    shared.scans.pending().insert(
        id,
        Pending {
            worker,
            blend,
            reply: tx,
        },
    );
    let msg = CoordMsg::Scan {
        id,
        blend,
        path,
        version,
    };
    if !shared.send_to_worker(worker, msg) {
        shared.scans.pending().remove(&id);
        return Err(ClientError::unavailable(format!(
            "worker {name} left before it could scan"
        )));
    }
    tracing::info!(worker, %name, %blend, "farm scan handed to a worker");
    let answer = tokio::time::timeout(SCAN_TIMEOUT, rx).await;
    shared.scans.pending().remove(&id);
    match answer {
        Ok(Ok(Ok(json))) => Ok((name, json)),
        Ok(Ok(Err(e))) => Err(ClientError::invalid(format!(
            "worker {name} could not scan it: {e}"
        ))),
        Ok(Err(_)) => Err(ClientError::unavailable(format!(
            "worker {name} left before it answered"
        ))),
        Err(_) => Err(ClientError::unavailable(format!(
            "worker {name} did not answer within {} s",
            SCAN_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the worker a scan was handed to answers it, within
    /// `MAX_SCAN_JSON`; it may fetch only that scan's blob, until it
    /// answers or leaves.
    #[test]
    fn a_scan_is_answered_only_by_its_worker_and_bounded() {
        let scans = Scans::default();
        let blend = Digest::of(b"shot.blend");
        let ask = |id, worker| {
            let (tx, rx) = oneshot::channel();
            let reply = tx;
            scans.pending().insert(
                id,
                Pending {
                    worker,
                    blend,
                    reply,
                },
            );
            rx
        };
        let mut rx = ask(1, 7);
        assert!(scans.may_fetch(7, &blend));
        assert!(!scans.may_fetch(8, &blend), "another worker");
        assert!(!scans.may_fetch(7, &Digest::of(b"other")), "another blob");
        scans.answered(8, 1, Ok("{}".into()));
        assert!(
            rx.try_recv().is_err(),
            "an answer from another worker is dropped"
        );
        scans.answered(7, 1, Ok("x".repeat(MAX_SCAN_JSON + 1)));
        assert!(rx.try_recv().unwrap().unwrap_err().contains("at most"));
        assert!(
            !scans.may_fetch(7, &blend),
            "answered: the blob is no longer its"
        );
        let mut rx = ask(2, 7);
        scans.worker_left(7);
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }
}
