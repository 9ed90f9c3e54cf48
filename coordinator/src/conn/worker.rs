//! A worker's session: its `Join`, then each message it sends handed to the
//! farm core, and a writer task draining the core's messages to it. A
//! finished task's output is checked against the blob store here, before
//! the core sees the result.

use std::sync::Arc;

use anyhow::bail;
use tessera_protocol::codec::{read_frame, write_frame};
use tessera_protocol::messages::{TaskLog, WorkerMsg, MAX_INLINE_OUTPUT};
use tessera_protocol::store::BlobStore;
use tessera_protocol::transport::Channel;
use tessera_protocol::Digest;
use tokio::sync::mpsc;

use crate::scheduler::WorkerId;
use crate::server::{unix_ms, Shared};

pub(super) async fn serve(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    control: Channel,
    name: String,
) -> anyhow::Result<()> {
    let (mut send, mut recv) = control.split();
    let info = match read_frame::<WorkerMsg, _>(&mut recv).await? {
        Some(WorkerMsg::Join(info)) => info,
        other => bail!("worker {name} sent {other:?} before joining"),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (slots, engines) = (info.slots, info.engines.clone());
    let id = shared.join_worker(tx, &name, info);
    tracing::info!(worker = id, %name, slots, ?engines, peer = %conn.remote_address(), "worker joined");
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if write_frame(&mut send, &msg).await.is_err() {
                break;
            }
        }
    });
    let result = async {
        while let Some(msg) = read_frame::<WorkerMsg, _>(&mut recv).await? {
            handle(&shared, id, msg);
        }
        anyhow::Ok(())
    }
    .await;
    let requeued = shared.update(|core, now| core.worker_left(id, now));
    shared.forget_outbox(id);
    tracing::info!(worker = id, %name, requeued, "worker left");
    writer.abort();
    result
}

/// One message from worker `id`.
fn handle(shared: &Arc<Shared>, id: WorkerId, msg: WorkerMsg) {
    match msg {
        WorkerMsg::Done {
            task,
            output,
            render_ms,
            inline,
        } => {
            let stored = store_output(shared, output, inline);
            shared.update(|core, now| match stored {
                Ok(()) => core.result_offered(id, task, output, render_ms, now),
                Err(reason) => core.refuse(id, task, reason),
            });
        }
        WorkerMsg::Failed {
            task,
            error,
            log,
            unsupported,
        } => {
            let entry = TaskLog {
                task: task.index,
                worker: id,
                unix_ms: unix_ms(),
                error: error.clone(),
                log,
            };
            if let Err(e) = shared.db().insert_task_log(task.job, &entry) {
                tracing::warn!(job = task.job, "cannot keep a failed task's log: {e}");
            }
            let msg = WorkerMsg::Failed {
                task,
                error,
                log: String::new(),
                unsupported,
            };
            shared.update(|core, now| core.worker_msg(id, msg, now));
        }
        msg => shared.update(|core, now| core.worker_msg(id, msg, now)),
    }
}

/// Stores an inline output after checking it against its digest, or checks
/// that an uploaded one is there.
fn store_output(shared: &Shared, output: Digest, inline: Option<Vec<u8>>) -> Result<(), String> {
    if let Some(bytes) = inline {
        if bytes.len() > MAX_INLINE_OUTPUT || Digest::of(&bytes) != output {
            return Err(format!("inline output does not match its digest {output}"));
        }
        // Synced with its commit, off this task (see `commit.rs`).
        if let Err(e) = shared.store.inner().put_unsynced(&output, &bytes) {
            return Err(format!("cannot store the output: {e}"));
        }
    } else if shared.store.has(&output).is_none() {
        return Err(format!("output blob {output} was not uploaded"));
    }
    Ok(())
}
